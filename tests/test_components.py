"""training/components.py: a component's keyword arguments are checked against its annotations, constraints
included, even where another annotation of it cannot be evaluated without torch."""

from __future__ import annotations

import sys
import textwrap

import pytest

from raytrain.components import ComponentError, parameter_hints, short_name
from raytrain.config import ConfigError, load_config


@pytest.mark.parametrize("preset, override, key", [
    ("linear", "model.hidden=-1", "model.hidden"),  # Annotated[int, Field(gt=0)]
    ("digits", "model.dropout=2", "model.dropout"),  # Annotated[float, Field(ge=0, lt=1)]
    ("text-rnn", "model.cell=transformer", "model.cell"),  # Literal["lstm", "gru", "rnn"]
    ("cifar10-vit", "model.num_heads=zero", "model.num_heads"),
])
def test_built_in_models_check_their_arguments_though_they_return_a_torch_type(preset, override, key):
    """raytrain.models annotate their return as "nn.Module", a name only a type checker sees."""
    with pytest.raises(ConfigError) as err:
        load_config(preset, [override])
    assert key in str(err.value) and "Fix:" in str(err.value)


def test_a_users_unresolvable_annotation_loses_only_its_own_check(tmp_path, monkeypatch):
    (tmp_path / "my_models.py").write_text(textwrap.dedent("""
        from __future__ import annotations
        from typing import TYPE_CHECKING, Literal
        if TYPE_CHECKING:
            from torch import nn

        def net(width: int = 8, head: Literal["linear", "mlp"] = "linear", block: nn.Module = None) -> nn.Module:
            raise NotImplementedError
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    from my_models import net

    try:
        hints = parameter_hints(net)
        assert hints["width"] is int and "block" not in hints and "return" not in hints
        job = tmp_path / "job.yaml"
        job.write_text("model: {_component_: my_models.net, head: conv}\ndata: {_component_: linear}\n")
        with pytest.raises(ComponentError, match="model.head"):
            load_config(str(job))
        job.write_text("model: {_component_: my_models.net, block: anything}\ndata: {_component_: linear}\n")
        assert load_config(str(job)).model.kwargs["block"] == "anything"  # unevaluable: taken as Any
    finally:
        sys.modules.pop("my_models", None)


@pytest.mark.parametrize("path, section, expected", [
    ("raytrain.models.small_cnn", "model", "small_cnn"),
    ("raytrain.data.digits.Digits", "data", "digits"),
    ("my_models.TinyConvNet", "model", "my_models.TinyConvNet"),
])
def test_short_name_is_the_alias_of_a_built_in_else_the_path(path, section, expected):
    assert short_name(path, section) == expected
