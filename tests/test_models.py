"""training/raytrain/models.py and nets.py: the GPT model's shapes, causality and refusals."""

from __future__ import annotations

import pytest
import torch

from raytrain import models, nets
from raytrain.spec import fsdp_units


def small_gpt(**overrides):
    torch.manual_seed(0)
    return models.gpt(**{"vocab_size": 256, "block_size": 16, "n_layers": 2, "n_heads": 2, "d_model": 32,
                         **overrides}).eval()


def test_gpt_gives_next_token_logits_per_position():
    model = small_gpt()
    assert model(torch.randint(0, 256, (3, 16))).shape == (3, 16, 256)
    assert model(torch.randint(0, 256, (1, 5))).shape == (1, 5, 256)  # shorter than block_size
    assert [type(b) for b in model.blocks] == [nets.TransformerBlock] * 2  # FSDP's units


def test_gpt_is_causal_a_later_token_never_changes_earlier_logits():
    model = small_gpt()
    tokens = torch.randint(0, 256, (2, 16))
    changed = tokens.clone()
    changed[:, 10] = (changed[:, 10] + 1) % 256
    with torch.no_grad():
        before, after = model(tokens), model(changed)
    assert torch.equal(before[:, :10], after[:, :10])
    assert not torch.allclose(before[:, 10:], after[:, 10:])


def test_gpt_head_is_not_tied_to_the_embedding():
    """A parameter shared across FSDP units cannot be sharded with each."""
    model = small_gpt()
    assert model.head.weight.data_ptr() != model.token_embedding.weight.data_ptr()


def test_a_sequence_longer_than_block_size_is_refused():
    with pytest.raises(ValueError, match="17 tokens is longer than the model's block_size 16.*model.block_size"):
        small_gpt()(torch.zeros(1, 17, dtype=torch.int64))


def test_heads_that_do_not_divide_the_width_are_refused():
    with pytest.raises(ValueError, match="n_heads 5 does not divide d_model 32.*choose n_heads"):
        small_gpt(n_heads=5)


def test_next_token_cross_entropy_averages_over_every_position():
    logits, targets = torch.randn(2, 3, 7), torch.randint(0, 7, (2, 3))
    expected = torch.nn.functional.cross_entropy(logits.reshape(6, 7), targets.reshape(6))
    assert torch.allclose(nets.next_token_cross_entropy(logits, targets), expected)


@pytest.mark.parametrize("path, kwargs", [
    ("raytrain.models.mlp", {}), ("raytrain.models.mlp", {"layers": 0}), ("raytrain.models.mlp", {"layers": 3}),
    ("raytrain.models.small_cnn", {}), ("raytrain.models.text_rnn", {}), ("raytrain.models.text_rnn", {"cell": "gru"}),
    ("raytrain.models.text_rnn", {"cell": "rnn", "n_layers": 1}), ("raytrain.models.gpt", {"n_layers": 2}),
    ("raytrain.models.vit", {"num_layers": 1, "hidden_dim": 16, "num_heads": 2, "mlp_dim": 16}),
])
def test_what_a_built_in_model_is_built_of_is_known_without_torch(path, kwargs):
    """fsdp_units.built_of (the config's check of scaling.fsdp_wrap) says what torch builds, for each built-in model."""
    with torch.device("meta"):
        model = getattr(models, path.rpartition(".")[2])(**kwargs)
    classes = sorted({f"{type(m).__module__}.{type(m).__qualname__}" for m in model.modules() if m is not model})
    root, declared = fsdp_units.built_of(path, getattr(models, path.rpartition(".")[2]), kwargs)
    assert (root, sorted(declared)) == (type(model).__name__, classes)


def test_only_built_in_models_are_known_without_torch():
    assert fsdp_units.built_of("torch.nn.Linear", torch.nn.Linear, {}) is None
    assert fsdp_units.built_of("my_project.models.net", models.mlp, {}) is None
