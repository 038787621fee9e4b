"""training/raytrain/data/chartext.py and the gpt preset: the generated corpus, the windows, a user's file (any bytes),
the errors for a file that cannot serve, and the checks across the model and data sections."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from raytrain.data import DataContext, DataUnavailable
from raytrain.data.chartext import CharText, generate
from raytrain.driver import preflight
from raytrain.spec.config import ConfigError, load_config


def test_the_generated_corpus_is_deterministic_per_seed_and_text():
    corpus = generate(50_000, seed=3)
    assert len(corpus) == 50_000 and np.array_equal(corpus, generate(50_000, seed=3))
    assert not np.array_equal(corpus, generate(50_000, seed=4))
    assert bytes(corpus).decode("ascii").count(".") > 50_000 // 80  # sentences, not noise


def test_windows_are_non_overlapping_and_targets_are_shifted_by_one(tmp_path):
    source = CharText(block_size=16, val_fraction=0.25, generated_bytes=4000)
    data = source.datasets(DataContext(root=tmp_path, seed=1))
    corpus = generate(4000, seed=1)
    train, val = data["train"], data["val"]
    assert (len(train), len(val)) == ((3000 - 1) // 16, (1000 - 1) // 16)
    for index in (0, 1, len(train) - 1):
        x, y = train[index]
        assert x.dtype == y.dtype == torch.int64
        assert x.tolist() == corpus[16 * index: 16 * index + 16].tolist()
        assert y.tolist() == corpus[16 * index + 1: 16 * index + 17].tolist()
    assert val[0][0].tolist() == corpus[3000:3016].tolist()  # validation is the tail
    with pytest.raises(IndexError):
        train[len(train)]


def test_a_users_file_of_any_bytes_relative_to_the_data_root(tmp_path):
    content = bytes(range(256)) * 4 + "naïve café\n".encode("latin-1")  # not UTF-8
    (tmp_path / "corpus.bin").write_bytes(content)
    source = CharText(path="corpus.bin", block_size=32, val_fraction=0.2)
    ctx = DataContext(root=tmp_path)
    source.prepare(ctx)
    train, val = (source.datasets(ctx)[split] for split in ("train", "val"))
    x, y = train[7]
    assert x.tolist() == list(content[224:256]) and y.tolist() == list(content[225:257])  # bytes up to 255
    assert len(val) >= 1
    absolute = CharText(path=str(tmp_path / "corpus.bin"), block_size=32)
    assert absolute.datasets(DataContext(root=tmp_path / "elsewhere"))["train"][0][0].tolist() == list(content[:32])


@pytest.mark.parametrize("content, fragments", [
    (None, ["is not a file", "data.path"]),
    (b"", ["holds 0 bytes", "data.block_size"]),
    (b"x" * 33, ["holds 33 bytes", "fewer than the 34", "a longer file"]),
])
def test_a_file_that_cannot_serve_names_the_path_and_the_fix(tmp_path, content, fragments):
    path = tmp_path / "book.txt"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(DataUnavailable) as err:
        CharText(path="book.txt", block_size=16).prepare(DataContext(root=tmp_path))
    message = str(err.value)
    assert str(path) in message and "Fix:" in message
    for fragment in fragments:
        assert fragment in message, message


def test_the_shortest_file_gives_one_window_each_to_train_and_validate(tmp_path):
    (tmp_path / "short.txt").write_bytes(b"y" * 34)
    data = CharText(path="short.txt", block_size=16).datasets(DataContext(root=tmp_path))
    assert (len(data["train"]), len(data["val"])) == (1, 1)


@pytest.mark.parametrize("overrides, key, fix", [
    (["model.vocab_size=128"], "model.vocab_size", "set model.vocab_size to 256"),
    (["model.block_size=64"], "model.block_size", "set model.block_size to at least 128"),
    (["data.block_size=256"], "model.block_size", "data.block_size to at most 128"),
    (["data.generated_bytes=100"], "data.generated_bytes", "at least 258 bytes"),
    (["model.n_heads=5"], "model", "n_heads 5 does not divide d_model 384"),
    (["train.loss=cross_entropy"], "train.loss", "use next_token_cross_entropy"),
])
def test_bad_configs_name_the_key_and_the_fix(tmp_path, overrides, key, fix):
    with pytest.raises(ConfigError) as err:
        cfg = load_config("gpt", overrides + [f"run.storage_path={tmp_path}"])
        preflight.check_model_builds(cfg)  # the model's own refusals come from building it
    message = str(err.value)
    assert f"{key}" in message and fix in message and "Fix:" in message, message


def test_the_preset_trains_with_next_token_cross_entropy_and_no_accuracy():
    cfg = load_config("gpt")
    assert cfg.loss.path == "raytrain.nets.next_token_cross_entropy" and not cfg.classification
    smoke = load_config("gpt", smoke=True)
    assert smoke.model.kwargs["block_size"] == smoke.data.kwargs["block_size"] == 64


def test_the_generated_corpus_is_learnable_below_a_uniform_guess(tmp_path):
    """A few dozen steps of the smoke model bring the loss well under ln 256 (a uniform guess over bytes)."""
    from raytrain.data import data_context
    from raytrain.spec.build import build_loss, build_model, call_data_component

    torch.manual_seed(0)
    cfg = load_config("gpt", [f"run.storage_path={tmp_path}"], smoke=True)
    model, loss_fn = build_model(cfg), build_loss(cfg)
    train = call_data_component(cfg, data_context(cfg))["train"]
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.train.lr)
    loader = torch.utils.data.DataLoader(train, batch_size=32, shuffle=True)
    for _, (x, y) in zip(range(40), loader):
        loss = loss_fn(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert float(loss.detach()) < math.log(256) - 2
