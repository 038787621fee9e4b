"""training/raytrain/driver/preflight.py, before Ray starts: the model component is built once on torch's meta device,
so a constructor that refuses its arguments is one paragraph naming the model section, not a failure in every worker
after Ray's restarts; a batch shaped like the data goes through the model and the loss; MLflow needs a destination;
`raytrain local` needs the GPU it is asked for."""

from __future__ import annotations

import pytest

from raytrain.driver import dataprep, preflight
from raytrain.spec.config import ConfigError, load_config


@pytest.mark.parametrize("model, fragments", [
    ("{_component_: vit, image_size: 32, patch_size: 5}", ["raytrain.models.vit(", "patch_size=5",
                                                          "patch_size 5 does not divide image_size 32"]),
    ("{_component_: vit, hidden_dim: 30, num_heads: 4}", ["num_heads 4 does not divide hidden_dim 30"]),
])
def test_a_model_that_cannot_be_built_is_named_before_ray(tmp_path, model, fragments):
    path = tmp_path / "job.yaml"
    path.write_text(f"model: {model}\ndata: {{_component_: raytrain.data.cifar10.CIFAR10, synthetic: true}}\n")
    cfg = load_config(str(path))
    with pytest.raises(ConfigError) as caught:
        preflight.check_model_builds(cfg)
    message = str(caught.value)
    assert message.startswith(f"{path}: model: ") and "Fix: correct the model section" in message
    for fragment in fragments:
        assert fragment in message


def test_a_model_that_builds_passes_without_allocating(tmp_path):
    import resource

    path = tmp_path / "job.yaml"
    path.write_text("model: {_component_: vit, num_layers: 48, hidden_dim: 1024, mlp_dim: 4096, num_heads: 16}\n"
                    "data: {_component_: raytrain.data.cifar10.CIFAR10, synthetic: true}\n")
    cfg = load_config(str(path))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    preflight.check_model_builds(cfg)  # ~600 M parameters, 2.4 GB as float32: the meta device holds none of it
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 500 * 1024  # KiB


@pytest.mark.parametrize("preset, overrides, fragments", [
    ("linear", ["model.in_features=3"], ["model raytrain.models.mlp(in_features=3", "inputs shaped (2, 1)",
                                         "Fix: make the model section fit the data"]),
    ("digits", ["model.in_channels=3"], ["raytrain.models.small_cnn(in_channels=3", "inputs shaped (2, 1, 8, 8)"]),
    ("linear", ["model.hidden=8", "model.layers=0", "model.in_features=2"], ["mlp(in_features=2"]),
])
def test_a_model_that_does_not_fit_the_data_is_named_before_ray(tmp_path, preset, overrides, fragments):
    cfg = load_config(preset, overrides + [f"run.storage_path={tmp_path}"])
    with pytest.raises(ConfigError) as caught:
        preflight.check_model_fits_data(cfg)
    for fragment in fragments:
        assert fragment in str(caught.value), str(caught.value)


@pytest.mark.parametrize("preset", ["linear", "digits", "text-rnn", "streaming", "cifar10-vit", "gpt"])
def test_the_presets_fit_their_data(tmp_path, preset):
    cfg = load_config(preset, [f"run.storage_path={tmp_path}"], smoke=True)
    dataprep.prepare_data(cfg)
    preflight.check_model_fits_data(cfg)


def test_a_loss_that_does_not_fit_the_output_is_named(tmp_path):
    cfg = load_config("digits", ["model.num_classes=10", "train.loss=mse", f"run.storage_path={tmp_path}"])
    with pytest.raises(ConfigError, match=r"train.loss torch.nn.functional.mse_loss cannot compare the model's "
                                          r"output \(2, 10\) against targets \(2,\)"):
        preflight.check_model_fits_data(cfg)


def test_only_the_meta_devices_own_limits_are_passed_over(tmp_path, monkeypatch):
    """torch's "cannot be called on meta tensors" is a limit of the check; a user's error that merely says "meta"
    (metadata, ...) is the user's, and is named."""
    assert preflight._meta_limit(RuntimeError("Tensor.item() cannot be called on meta tensors"))
    assert preflight._meta_limit(NotImplementedError("Could not run 'aten::foo' with arguments from the 'Meta' backend"))
    assert not preflight._meta_limit(ValueError("metadata.json is missing"))
    assert not preflight._meta_limit(RuntimeError("bad metaparameter"))
    (tmp_path / "my_nets.py").write_text(
        "import torch\n"
        "def meta_reader(width: int = 2):\n    raise RuntimeError('metadata file not found')\n"
        "def item_reader(width: int = 2):\n    torch.zeros(2).sum().item()\n    return torch.nn.Linear(1, width)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    job = tmp_path / "job.yaml"
    job.write_text("model: {_component_: my_nets.meta_reader}\ndata: {_component_: linear}\n")
    with pytest.raises(ConfigError, match="cannot be built: RuntimeError: metadata file not found .at .*my_nets.py:3"):
        preflight.check_model_builds(load_config(str(job)))
    job.write_text("model: {_component_: my_nets.item_reader}\ndata: {_component_: linear}\n")
    preflight.check_model_builds(load_config(str(job)))  # .item() on the meta device: checked on the workers instead
    preflight.check_model_fits_data(load_config(str(job)))  # and so is its fit


def test_a_small_models_fit_is_checked_on_the_cpu_without_the_meta_kernels_imports(tmp_path):
    """A small model's fit check is a real forward on zeros: torch's meta decompositions (which import sympy and
    torch._dynamo, about 1 s of every driver's start) are not needed for it."""
    import subprocess
    import sys

    script = ("import sys\nfrom raytrain.driver import preflight\nfrom raytrain.spec.config import load_config\n"
              f"preflight.check_model_fits_data(load_config('linear', ['run.storage_path={tmp_path}']))\n"
              "print(sorted(m for m in ('sympy', 'torch._dynamo') if m in sys.modules))\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stdout + proc.stderr


def _linear_job(tmp_path, model: str):
    """A run config of `model` (a flow mapping) on the linear data, loaded as the driver loads it."""
    job = tmp_path / "job.yaml"
    job.write_text(f"model: {model}\ndata: {{_component_: linear}}\nrun: {{storage_path: {tmp_path}}}\n")
    return load_config(str(job))


# Models a user might bring, whose fit only the meta check can judge (their module is written where a test asks).
ODD_NETS = """import torch
class NoZeros(torch.nn.Module):
    def __init__(self, in_features: int = 1):
        super().__init__()
        self.linear = torch.nn.Linear(in_features, 1)
    def forward(self, x):
        out = self.linear(x)
        if not bool(x.abs().sum() > 0):
            raise ValueError('an all-zero batch')
        return out
def lazy(out_features: int = 1):
    return torch.nn.Sequential(torch.nn.LazyLinear(out_features))
class InPlace(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(1, 1)
    def forward(self, x):
        self.linear.weight.add_(1.0)
        return self.linear(x)
"""


@pytest.mark.parametrize("model, error", [
    # Zeros are not the data: a forward that fails on their values (not on their shapes) is no config error; the
    # meta check, which has no values, decides, and a shape mismatch is still named.
    ("{_component_: odd_nets.NoZeros}", None),
    ("{_component_: odd_nets.NoZeros, in_features: 3}", "cannot take a batch"),
    # A lazy module has no size before its first forward: the meta check takes it, as before.
    ("{_component_: odd_nets.lazy}", None),
    # A forward that changes a parameter in place fails in training (autograd is on): the CPU check runs with it.
    ("{_component_: odd_nets.InPlace}", "in-place operation"),
])
def test_models_the_cpu_check_cannot_judge_are_judged_as_on_the_workers(tmp_path, monkeypatch, model, error):
    (tmp_path / "odd_nets.py").write_text(ODD_NETS)
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = _linear_job(tmp_path, model)
    if error is None:
        preflight.check_model_fits_data(cfg)
    else:
        with pytest.raises(ConfigError, match=error):
            preflight.check_model_fits_data(cfg)


def test_local_refuses_use_gpu_without_cuda():
    torch = pytest.importorskip("torch", reason="torch is not installed (scripts/setup installs it)")
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device: the refusal is for machines without one")
    with pytest.raises(ConfigError, match="scaling.use_gpu is true, but torch finds no CUDA device"):
        preflight.check_local_gpu(load_config("linear", ["scaling.use_gpu=true"]))


@pytest.mark.parametrize("model, overrides, fragments", [
    ("{_component_: torch.nn.Linear, in_features: 1, out_features: 1}", [],
     ["scaling.strategy: fsdp shards a model by its submodules", "Linear has no submodule", "scaling.strategy: ddp"]),
    ("{_component_: mlp}", ["scaling.fsdp_wrap=[Linaer]"],
     ["scaling.fsdp_wrap: Linaer is not a module class of the model", "did you mean 'Linear'"]),
    # a model of the user's (not built in: known once built), refused by the preflight's build
    ("{_component_: torch.nn.TransformerEncoderLayer, d_model: 4, nhead: 1}", ["scaling.fsdp_wrap=[Linaer]"],
     ["scaling.fsdp_wrap: Linaer is not a module class of the model TransformerEncoderLayer", "did you mean 'Linear'"]),
])
def test_a_model_fsdp_cannot_shard_is_named_before_ray(tmp_path, model, overrides, fragments):
    path = tmp_path / "job.yaml"
    path.write_text(f"model: {model}\ndata: {{_component_: raytrain.data.linear.Linear}}\n"
                    f"scaling: {{strategy: fsdp}}\n")
    with pytest.raises(ConfigError) as caught:
        preflight.check_model_builds(load_config(str(path), overrides))
    message = str(caught.value)
    # a built-in model's units are known at load, which names the --set that gave them
    assert message.startswith((str(path), f"--set {overrides[0]}" if overrides else str(path))) and "Fix:" in message
    for fragment in fragments:
        assert fragment in message, message


@pytest.mark.parametrize("wrap, units", [([], ["Linear", "Linear"]), (["torch.nn.modules.linear.Linear"], ["Linear"] * 2)])
def test_fsdp_units_are_the_models_blocks_or_the_named_classes(tmp_path, wrap, units):
    import torch

    from raytrain.parallel import sharding

    path = tmp_path / "job.yaml"
    path.write_text("model: {_component_: mlp, layers: 1}\ndata: {_component_: raytrain.data.linear.Linear}\n"
                    f"scaling: {{strategy: fsdp, fsdp_wrap: {wrap}}}\n")
    cfg = load_config(str(path))
    preflight.check_model_builds(cfg)
    model = torch.nn.Sequential(torch.nn.Linear(1, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
    assert [type(m).__name__ for m in sharding.units(model, sharding.unit_classes(model, wrap))] == units
    blocks = torch.nn.Module()
    blocks.layers = torch.nn.ModuleList([torch.nn.Sequential(torch.nn.Linear(2, 2)) for _ in range(3)])
    blocks.head = torch.nn.Linear(2, 1)
    # the blocks of a ModuleList are the units (the head stays with the root), and a unit inside a unit is not one
    assert len(sharding.units(blocks, sharding.unit_classes(blocks, []))) == 3


@pytest.mark.parametrize("model, wrap", [("{_component_: mlp}", "Block"), ("{_component_: mlp, layers: 0}", "ReLU"),
                                         ("{_component_: gpt}", "Blocks"), ("{_component_: text_rnn, cell: gru}",
                                                                            "torch.nn.modules.rnn.LSTM")])
def test_a_built_in_models_missing_fsdp_unit_is_refused_at_load_as_the_preflight_refuses_it(tmp_path, model, wrap):
    """Issue 40: `raytrain validate` (which never imports torch) refused nothing here; the config now refuses it at
    load (spec/fsdp_units.py), with the words the preflight's check of the built model says."""
    import dataclasses

    import torch

    from raytrain.parallel import sharding
    from raytrain.spec.build import build_model

    path = tmp_path / "job.yaml"
    text = f"model: {model}\ndata: {{_component_: raytrain.data.linear.Linear}}\nscaling: {{strategy: fsdp}}\n"
    path.write_text(text.replace("fsdp}", f"fsdp, fsdp_wrap: [{wrap}]}}"))
    with pytest.raises(ConfigError) as at_load:
        load_config(str(path))
    path.write_text(text)
    cfg = load_config(str(path))
    cfg = dataclasses.replace(cfg, scaling=dataclasses.replace(cfg.scaling, fsdp_wrap=[wrap]))
    with torch.device("meta"):
        built = build_model(cfg)
    with pytest.raises(ConfigError) as at_preflight:
        sharding.check_units(built, cfg)
    assert str(at_load.value) == str(at_preflight.value), (str(at_load.value), str(at_preflight.value))
    assert f"scaling.fsdp_wrap: {wrap} is not a module class of the model" in str(at_load.value)


def test_mlflow_without_a_uri_anywhere_is_refused_before_it_writes_mlflow_db_here(raytrain, tmp_path, monkeypatch):
    """Issue 40, item 14: `run.tracking: {mlflow: {}}` with no URI silently wrote ./mlflow.db wherever the driver
    ran. Refused with the fix before the run starts; with MLFLOW_TRACKING_URI set, the same config is fine."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    workdir = tmp_path / "cwd"
    workdir.mkdir()
    done = raytrain("local", "linear", "--storage", str(tmp_path / "runs"), "--set", "run.tracking.mlflow={}",
                    "--set", "train.epochs=1", cwd=workdir)
    assert done.returncode == 2, done
    assert "run.tracking.mlflow has no uri and MLFLOW_TRACKING_URI is not set" in done.stderr
    assert "Fix: set run.tracking.mlflow.uri" in done.stderr and "Traceback" not in done.output
    assert not list(workdir.iterdir()) and not (tmp_path / "runs" / "linear" / "lease.json").exists()
    cfg = load_config("linear", ["run.tracking.mlflow={}"])
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'elsewhere.db'}")
    preflight.check_tracking_destination(cfg)
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    preflight.check_tracking_destination(load_config("linear", ["run.tracking.mlflow.uri=http://m:5000"]))
