"""Users' own classes enter a run config by import path (`_component_`): each mistake is one paragraph naming the
file, the key and the fix, found before Ray starts. A component's keyword arguments are checked against its
annotations, constraints included, even where another annotation of it cannot be evaluated without torch."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from raytrain.spec import components, workdir
from raytrain.spec.components import ComponentError, parameter_hints, short_name
from raytrain.spec.config import ConfigError, load_config

MODULES = {
    "ct_models.py": """
        from typing import Annotated

        from pydantic import Field
        from torch import nn

        class TinyNet(nn.Module):
            def __init__(self, channels: int, depth: int = 2, width: Annotated[int, Field(gt=0)] = 8):
                super().__init__()
                self.fc = nn.Linear(channels, 2)

            def forward(self, x):
                return self.fc(x)

        NOT_CALLABLE = 3

        def smooth_loss(logits, target, smoothing: float = 0.1):
            return nn.functional.cross_entropy(logits, target, label_smoothing=smoothing)
        """,
    "ct_data.py": """
        import torch
        from torch.utils.data import TensorDataset

        def make(n_train: int = 64, features: int = 4):
            x = torch.randn(n_train, features)
            return {"train": TensorDataset(x, (x.sum(1) > 0).long())}
        """,
    "ct_loops.py": """
        def my_loop(session, warmup: int = 0):
            pass
        """,
    "ct_broken.py": """
        def f(:
        """,
    "ct_needs_missing.py": """
        import no_such_dependency_xyz
        """,
}

GOOD = {"model": "{_component_: ct_models.TinyNet, channels: 4}", "data": "{_component_: ct_data.make}",
        "train": "{epochs: 1, batch_size: 8}", "scaling": "{num_workers: 1}"}


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    root = tmp_path_factory.mktemp("project")
    for name, text in MODULES.items():
        (root / name).write_text(textwrap.dedent(text))
    saved_path, saved_current = list(sys.path), workdir.current()
    workdir.use(str(root))
    yield root
    sys.path[:] = saved_path
    workdir._current = saved_current
    for name in MODULES:
        sys.modules.pop(name.removesuffix(".py"), None)


def job(root: Path, **sections: str) -> str:
    path = root / "job.yaml"
    path.write_text("".join(f"{name}: {value}\n" for name, value in {**GOOD, **sections}.items()))
    return str(path)


def test_a_project_component_resolves_with_its_arguments_checked_and_defaults_stored(project):
    cfg = load_config(job(project, model="{_component_: 'ct_models:TinyNet', channels: '4'}"))
    assert cfg.model.path == "ct_models.TinyNet"  # the colon form is stored as the dotted path
    assert cfg.model.kwargs == {"channels": 4, "depth": 2, "width": 8}  # '4' checked into an int; defaults kept
    again = load_config(job(project, model=f"{cfg.to_dict()['model']}".replace("'", "")))
    assert again.model.kwargs == cfg.model.kwargs  # the resolved config round-trips


# (case, sections or overrides, fragments the message must contain)
BAD = [
    ("unknown key, did-you-mean", {"model": "{_component_: ct_models.TinyNet, channels: 4, dpeth: 3}"},
     ["unknown key 'model.dpeth'", "did you mean 'depth'", "channels, depth, width"]),
    ("missing required argument", {"model": "{_component_: ct_models.TinyNet}"},
     ["model.channels is required", "no default for 'channels'"]),
    ("wrong type", {"model": "{_component_: ct_models.TinyNet, channels: four}"},
     ["model.channels: 'four' is not allowed", "use an integer"]),
    ("constraint from the annotation", {"model": "{_component_: ct_models.TinyNet, channels: 4, width: 0}"},
     ["model.width: 0 is not allowed", "greater than 0"]),
    ("module not on the import path", {"model": "{_component_: ct_modls.TinyNet, channels: 4}"},
     ["model._component_", "module 'ct_modls' cannot be imported", "--working-dir"]),
    ("name not in the module", {"model": "{_component_: ct_models.TinyNt, channels: 4}"},
     ["module 'ct_models' has no 'TinyNt'", "did you mean 'TinyNet'"]),
    ("module with a syntax error", {"model": "{_component_: ct_broken.f}"},
     ["importing 'ct_broken' failed", "SyntaxError", "ct_broken.py:2"]),
    ("module needing a package that is not installed", {"model": "{_component_: ct_needs_missing.f}"},
     ["No module named 'no_such_dependency_xyz'", "install 'no_such_dependency_xyz'"]),
    ("not callable", {"model": "{_component_: ct_models.NOT_CALLABLE}"}, ["is an int, not a callable"]),
    ("not an import path", {"model": "{_component_: TinyNet, channels: 4}"},
     ["neither an import path", "mlp, small_cnn"]),
    ("no _component_", {"model": "{channels: 4}"}, ["model._component_ is missing"]),
    ("data component's unknown key", {"data": "{_component_: ct_data.make, n_trian: 3}"},
     ["unknown key 'data.n_trian'", "did you mean 'n_train'"]),
    ("loss from the project, wrong argument", {"train": "{epochs: 1, batch_size: 8, loss: "
                                               "{_component_: ct_models.smooth_loss, smoothin: 0.2}}"},
     ["train.loss", "did you mean 'smoothing'"]),
    ("loss that does not exist", {"train": "{epochs: 1, batch_size: 8, loss: torch.nn.functional.cross_entrpy}"},
     ["has no 'cross_entrpy'", "did you mean 'cross_entropy'"]),
    ("own loop, wrong type", {"loop": "{_component_: ct_loops.my_loop, warmup: soon}"},
     ["loop.warmup: 'soon' is not allowed", "use an integer"]),
]


@pytest.mark.parametrize("case, sections, fragments", BAD, ids=[case for case, _, _ in BAD])
def test_component_mistakes_name_the_file_the_key_and_the_fix(project, case, sections, fragments):
    path = job(project, **sections)
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    message = str(caught.value)
    for fragment in fragments:
        assert fragment in message, f"{case}: {fragment!r} not in {message!r}"
    assert message.startswith(path) and "Fix: " in message
    assert "Traceback" not in message


def test_a_set_override_of_a_component_argument_is_blamed_on_the_set(project):
    with pytest.raises(ConfigError, match=r"^--set model.channels=x: model.channels: 'x' is not allowed"):
        load_config(job(project), ["model.channels=x"])


def test_validate_style_loading_lists_the_users_components_without_importing_them(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("model: {_component_: not_here.Net, anything: 1}\ndata: {_component_: not_here.make}\n"
                    "loop: {_component_: not_here.loop}\n")
    cfg = load_config(str(path), import_user_code=False)
    assert sorted(cfg.unchecked) == ["data: not_here.make", "loop: not_here.loop", "model: not_here.Net"]
    assert "not_here" not in sys.modules


def test_the_cli_says_it_in_one_paragraph_without_a_traceback(raytrain, project):
    path = job(project, model="{_component_: ct_models.TinyNet, channels: 4, dpeth: 3}")
    done = raytrain("local", path, "--working-dir", str(project))
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert f"raytrain: error: {path}: unknown key 'model.dpeth'" in done.stderr


def test_a_projects_own_training_module_does_not_shadow_ours_and_a_raytrain_module_is_refused(tmp_path):
    (tmp_path / "training.py").write_text("WHOSE = 'theirs'\n")
    code = ("import sys; from raytrain.spec import workdir; workdir.use(sys.argv[1]); import training; "
            "import raytrain.spec.config; print(training.WHOSE, raytrain.spec.config.__name__)")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["theirs", "raytrain.spec.config"], done.stderr
    (tmp_path / "raytrain.py").write_text("")
    with pytest.raises(workdir.WorkingDirError, match="raytrain.py would shadow the raytrain package"):
        workdir.use(str(tmp_path))


def test_aliases_and_import_paths_are_one_mechanism():
    assert components.canonical_path("mlp", "model") == "raytrain.models.mlp"
    assert components.canonical_path("raytrain.models:mlp", "model") == "raytrain.models.mlp"


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


def test_a_users_unresolvable_annotation_loses_only_its_own_check_and_says_so(tmp_path, monkeypatch, capsys):
    (tmp_path / "my_models.py").write_text(textwrap.dedent("""
        from __future__ import annotations
        from typing import TYPE_CHECKING, Literal
        if TYPE_CHECKING:
            from torch import nn

        def net(width: int = 8, head: Literal["linear", "mlp"] = "linear", block: nn.Module = None) -> nn.Module:
            raise NotImplementedError
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    from my_models import net  # pyright: ignore[reportMissingImports] (written to tmp_path above)

    try:
        hints = parameter_hints(net)
        assert hints["width"] is int and "block" not in hints and "return" not in hints
        job = tmp_path / "job.yaml"
        job.write_text("model: {_component_: my_models.net, head: conv}\ndata: {_component_: linear}\n")
        with pytest.raises(ComponentError, match="model.head"):
            load_config(str(job))
        job.write_text("model: {_component_: my_models.net, block: anything}\ndata: {_component_: linear}\n")
        assert load_config(str(job)).model.kwargs["block"] == "anything"  # unevaluable: taken as Any, and said once
        said = capsys.readouterr().out
        assert said.count("parameter 'block' is not checked") == 1 and "NameError" in said, said
        assert "'width'" not in said and "'return'" not in said
    finally:
        sys.modules.pop("my_models", None)


@pytest.mark.parametrize("path, section, expected", [
    ("raytrain.models.small_cnn", "model", "small_cnn"),
    ("raytrain.data.digits.Digits", "data", "digits"),
    ("my_models.TinyConvNet", "model", "my_models.TinyConvNet"),
])
def test_short_name_is_the_alias_of_a_built_in_else_the_path(path, section, expected):
    assert short_name(path, section) == expected
