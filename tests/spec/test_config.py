"""training/raytrain/spec/config.py: resolution order, presets, and a table of bad inputs with the message each must give."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from raytrain.spec.config import ConfigError, config_from_dict, dump_yaml, load_config, preset_names


def write(tmp_path: Path, text: str, name: str = "job.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


GOOD = """
model: {name: mlp, hidden: 16}
data: {name: linear, num_samples: 50}
train: {epochs: 3, batch_size: 8, lr: 0.05}
scaling: {num_workers: 2}
smoke: {train.epochs: 1}
"""


def test_every_preset_loads_and_its_smoke_block_applies():
    assert {"linear", "digits", "mnist"} <= set(preset_names())
    for name in preset_names():
        cfg = load_config(name)
        assert cfg.run.name == name
        smoke = load_config(name, smoke=True)
        assert smoke.train.epochs <= cfg.train.epochs


def test_order_is_defaults_then_file_then_smoke_then_set(tmp_path):
    path = write(tmp_path, GOOD)
    cfg = load_config(path)
    assert (cfg.train.epochs, cfg.train.lr, cfg.train.optimizer) == (3, 0.05, "adamw")  # file, file, default
    assert load_config(path, smoke=True).train.epochs == 1
    cfg = load_config(path, ["train.epochs=7", "train.lr=1e-2", "run.name=x1"], smoke=True)
    assert (cfg.train.epochs, cfg.train.lr, cfg.run.name) == (7, 0.01, "x1")


def test_per_worker_batch_size_is_derived_from_the_global_one(tmp_path):
    cfg = load_config(write(tmp_path, GOOD), ["scaling.num_workers=4", "train.batch_size=32"])
    assert cfg.per_worker_batch_size == 8


@pytest.mark.parametrize("given, stored, counts", [("3", 3, [3]), ("[2, 4]", [2, 4], [2, 3, 4]), ("[3, 3]", 3, [3])])
def test_an_elastic_run_keeps_its_global_batch_over_every_worker_count(tmp_path, given, stored, counts):
    cfg = load_config(write(tmp_path, GOOD), [f"scaling.num_workers={given}", "train.batch_size=24"])
    assert cfg.scaling.num_workers == stored and list(cfg.scaling.worker_counts) == counts
    assert [cfg.batch_share(n) * n for n in counts] == [24] * len(counts)
    assert cfg.scaling.elastic == (len(counts) > 1)
    assert load_config(write(tmp_path, dump_yaml(cfg))).scaling.num_workers == stored  # the saved config reloads


def test_resolved_config_round_trips(tmp_path):
    cfg = load_config(write(tmp_path, GOOD), ["train.lr=0.2"])
    again = config_from_dict(yaml.safe_load(yaml.safe_dump(cfg.to_dict())))
    assert again.to_dict() == cfg.to_dict()


def test_tracking_is_off_unless_a_tracker_is_named_and_round_trips(tmp_path):
    assert load_config(write(tmp_path, GOOD)).run.tracking is None
    assert load_config(write(tmp_path, GOOD), ["run.tracking.sync_every_s=2"]).run.tracking is None
    cfg = load_config(write(tmp_path, GOOD), ["run.tracking.mlflow={}", "run.tracking.wandb.project=p"])
    assert cfg.run.tracking.trackers() == ["mlflow", "wandb"]
    assert (cfg.run.tracking.mlflow.uri, cfg.run.tracking.mlflow.experiment) == (None, "raytrain")
    assert (cfg.run.tracking.wandb.mode, cfg.run.tracking.sync_every_s) == ("online", 5.0)
    stored = yaml.safe_load(yaml.safe_dump(cfg.to_dict()))  # config.yaml, and every checkpoint's config
    assert stored["run"]["tracking"]["wandb"] == {"project": "p", "entity": None, "mode": "online", "dir": None}
    assert config_from_dict(stored).to_dict() == cfg.to_dict()


def test_the_run_name_defaults_to_the_file_stem(tmp_path):
    assert load_config(write(tmp_path, GOOD, "my-run.yaml")).run.name == "my-run"


# (file text or None for GOOD, --set overrides, fragments the message must contain)
BAD = [
    ("model: {name: mlp}\ndata: {name: linear}\ntrian: {epochs: 1}\n", [], ["unknown trian", "did you mean 'train'"]),
    (None, ["train.epoks=3"], ["unknown key 'train.epoks'", "did you mean 'epochs'"]),
    (None, ["train.lr=fast"], ["train.lr", "'fast' is not allowed", "use a number"]),
    (None, ["train.epochs=three"], ["train.epochs", "'three' is not allowed", "use an integer"]),
    (None, ["train.epochs=0"], ["train.epochs", "use an integer greater than 0"]),
    (None, ["train.lr=-1"], ["train.lr", "use a number greater than 0"]),
    (None, ["train.batch_size=9"], ["train.batch_size", "does not split evenly over 2 workers", "use 8 or 10"]),
    (None, ["train.batch_size=1"], ["smaller than scaling.num_workers"]),
    (None, ["train.optimizer=adagrad"], ["train.optimizer", "one of 'adam', 'adamw', 'sgd'"]),
    (None, ["train.mixed_precision=bf16"], ["needs a GPU", "scaling.use_gpu"]),
    (None, ["scaling.num_workers=0"], ["scaling.num_workers"]),
    # elastic: [min, max], and a global batch that splits over every count in between
    (None, ["scaling.num_workers=[3, 2]"], ["scaling.num_workers", "[3, 2] is not allowed", "[min, max] with 1 <= min <= max"]),
    (None, ["scaling.num_workers=[2]"], ["scaling.num_workers", "e.g. [2, 4]"]),
    (None, ["scaling.num_workers=[1, 2, 3]"], ["scaling.num_workers", "[min, max]"]),
    (None, ["scaling.num_workers=[0, 2]"], ["scaling.num_workers", "1 <= min"]),
    (None, ["scaling.num_workers=[true, 2]"], ["scaling.num_workers"]),
    (None, ["scaling.num_workers=[1.5, 2]"], ["scaling.num_workers"]),
    (None, ["scaling.num_workers=two"], ["scaling.num_workers", "'two' is not allowed",
                                         "a worker count from 1 to 100,000"]),
    (None, ["scaling.num_workers=[2, 4]", "train.batch_size=8"],
     ["train.batch_size", "does not split evenly over 3 workers", "any of 2..4", "use 12"]),
    (None, ["scaling.num_workers=[2, 3]", "train.batch_size=12", "train.grad_accum_steps=4"],
     ["train.grad_accum_steps", "each worker's 6 samples", "or a train.batch_size of 24"]),
    (None, ["scaling.num_workers=[1, 2]", "scaling.use_gpu=true", "scaling.gpus_per_worker=0.5"],
     ["scaling.gpus_per_worker", "whole GPUs", "a fixed scaling.num_workers"]),
    (None, ["scaling.num_workers=[1, 2]", "scaling.cpus_per_worker=1.5"], ["scaling.cpus_per_worker", "whole number"]),
    (None, ["scaling.num_workers=[1, 2]", "data.loader=ray"], ["data.loader", "use data.loader: torch"]),
    (None, ["scaling.num_workers=[1, 2]", "scaling.elastic_resize_monitor_interval_s=0"],
     ["scaling.elastic_resize_monitor_interval_s", "greater than 0"]),
    # torchft: what it cannot go with is refused before Ray starts, naming the fix
    (None, ["scaling.fault_tolerance=torchfd"], ["scaling.fault_tolerance", "'restart'", "'torchft'"]),
    (None, ["scaling.fault_tolerance=torchft", "scaling.num_workers=[1, 2]"],
     ["scaling.fault_tolerance", "elastic scaling.num_workers (1..2 (elastic))", "give scaling.num_workers one count"]),
    (None, ["scaling.fault_tolerance=torchft", "scaling.strategy=fsdp"],
     ["scaling.fault_tolerance", "scaling.strategy fsdp", "use scaling.strategy: ddp"]),
    (None, ["scaling.fault_tolerance=torchft", "data.loader=ray"],
     ["scaling.fault_tolerance", "data.loader ray", "set data.loader: torch"]),
    (None, ["scaling.fault_tolerance=torchft", "scaling.use_gpu=true", "train.mixed_precision=fp16"],
     ["scaling.fault_tolerance", "train.mixed_precision fp16", "use bf16"]),
    (None, ["scaling.fault_tolerance=torchft", "run.checkpointer=sharded"],
     ["scaling.fault_tolerance", "run.checkpointer sharded", "set run.checkpointer: file"]),
    (None, ["scaling.cpus_per_worker=lots"], ["scaling.cpus_per_worker", "'auto'"]),
    (None, ["scaling.use_gpu=maybe"], ["scaling.use_gpu", "use true or false"]),
    (None, ["run.keep_checkpoints=0"], ["run.keep_checkpoints"]),
    (None, ["scaling.strategy=zero3"], ["scaling.strategy", "'ddp'", "'fsdp'"]),
    (None, ["scaling.strategy=fsdp", "scaling.use_gpu=true", "train.mixed_precision=fp16"],
     ["train.mixed_precision", "fp16 with scaling.strategy fsdp", "use bf16"]),
    (None, ["scaling.fsdp_wrap=[Linear]"], ["scaling.fsdp_wrap", "scaling.strategy is ddp", "set scaling.strategy: fsdp"]),
    (None, ["run.checkpointer=dcp"], ["run.checkpointer", "'auto'", "'sharded'"]),
    (None, ["run.async_checkpoint=later"], ["run.async_checkpoint", "use true or false"]),
    (None, ["run.max_failures=-2"], ["run.max_failures"]),
    (None, ["run.name=a/b"], ["run.name"]),
    (None, ["model.name=resnet"], ["model._component_: 'resnet'", "mlp, small_cnn"]),
    (None, ["model.hiden=3"], ["model.hiden", "did you mean 'hidden'"]),
    (None, ["data.loader=spark"], ["data.loader", "torch, ray", "or auto (chosen by the data's size)"]),
    (None, ["epochs=3"], ["is not section.key"]),
    (None, ["train.lr"], ["expected key=value"]),
    ("data: {name: linear}\n", [], ["the loop raytrain.loop.train_loop builds the config's model, but there is no 'model' section", "e.g. mlp"]),
    ("model: [1, 2]\n", [], ["section 'model' must be a mapping"]),
    ("model: {name: mlp\n", [], ["not valid YAML"]),
    ("- a\n- b\n", [], ["top level must be a mapping"]),
    ("model: {name: small_cnn, num_classes: 5}\ndata: {name: digits}\n", [], ["model.num_classes", "10 classes"]),
    # run.tracking: each level checked, a mistake named by its whole key; credentials never in the config
    (None, ["run.tracking=mlflow"], ["run.tracking: must be a mapping", "e.g. tracking: {mlflow: {uri:"]),
    (None, ["run.tracking.mlfow.uri=http://m:5000"], ["unknown key 'run.tracking.mlfow'", "did you mean 'mlflow'"]),
    (None, ["run.tracking.mlflow.experimnet=a"], ["unknown key 'run.tracking.mlflow.experimnet'",
                                                  "did you mean 'experiment'", "uri, experiment"]),
    (None, ["run.tracking.mlflow=[1]"], ["run.tracking.mlflow: must be a mapping", "takes every default"]),
    (None, ["run.tracking.mlflow.experiment=' '"], ["run.tracking.mlflow.experiment: is empty", "give a value"]),
    (None, ["run.tracking.mlflow.uri=http://me:secret@mlflow:5000"],
     ["run.tracking.mlflow.uri: holds a password", "MLFLOW_TRACKING_PASSWORD"]),
    (None, ["run.tracking.mlflow.token=abc"], ["run.tracking.mlflow.token: credentials never go in a run config",
                                               "set MLFLOW_TRACKING_TOKEN"]),
    (None, ["run.tracking.wandb.api_key=abc"], ["run.tracking.wandb.api_key", "set WANDB_API_KEY"]),
    (None, ["run.tracking.wandb.mode=offline"], ["run.tracking.wandb.project is required"]),
    (None, ["run.tracking.wandb.project=p", "run.tracking.wandb.mode=disabled"],
     ["run.tracking.wandb.mode", "one of 'online', 'offline'"]),
    (None, ["run.tracking.mlflow.uri=http://m:5000", "run.tracking.sync_every_s=0"],
     ["run.tracking.sync_every_s", "greater than 0"]),
    ("model: {name: mlp}\ndata: {name: linear}\nrun: {tracking: {wandb: {project: p, entity: [a]}}}\n", [],
     ["run.tracking.wandb.entity", "['a'] is not allowed"]),
]


def refusal(tmp_path: Path, text: str | None, overrides: list[str], fragments: list[str]) -> tuple[str, str]:
    """(file, ConfigError message) for a config (GOOD when text is None) with overrides; each fragment is in it."""
    path = write(tmp_path, text if text is not None else GOOD)
    with pytest.raises(ConfigError) as caught:
        load_config(path, overrides)
    message = str(caught.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    return path, message


@pytest.mark.parametrize("text, overrides, fragments", BAD)
def test_bad_config_is_rejected_with_a_message_naming_file_key_and_fix(tmp_path, text, overrides, fragments):
    path, message = refusal(tmp_path, text, overrides, fragments)
    assert "Fix" in message
    if not overrides:
        assert path in message  # the file is named


def test_unknown_config_reference_lists_the_presets():
    with pytest.raises(ConfigError, match="neither a YAML file nor a preset.*linear"):
        load_config("no-such-preset")


# (file text or None for GOOD, --set overrides, fragments): mistakes that once loaded silently, or with a traceback
SILENTLY_WRONG = [
    (None, ["train.epochs=true"], ["train.epochs: true is not allowed", "a boolean is not one", "an integer"]),
    (None, ["model.hidden=true"], ["model.hidden: true is not allowed", "raytrain.models.mlp"]),
    (None, ["train.lr=false"], ["train.lr: false is not allowed"]),
    (None, ["scaling.cpus_per_worker=true"], ["scaling.cpus_per_worker: true is not allowed"]),
    (None, ["scaling.num_workers=false"], ["scaling.num_workers: false is not allowed"]),
    (None, ["train.loss=cross_entropy"], ["train.loss", "classification loss", "regression data", "use mse"]),
    (None, ["train.loss=nll"], ["classification loss"]),
    ("model: {name: mlp}\ndata: {name: linear}\ntrain: {epochs: 1, epochs: 2}\n", [],
     ["line 3", "found the key 'epochs' twice"]),
    ("model: {name: mlp}\nmodel: {name: mlp}\ndata: {name: linear}\n", [], ["found the key 'model' twice"]),
    ("model: {name: mlp}\ndata: {name: linear}\ntrain: {epochs: " + "9" * 5000 + "}\n", [],
     ["cannot read this value", "4300 digits"]),
    (None, ["train.epochs=" + "9" * 5000], ["--set train.epochs=999", "(5013 characters)", "cannot read this value"]),
    (None, ["train.seed=" + "[" * 3000 + "]" * 3000], ["--set train.seed=[[[", "nest"]),
    (None, ["train.seed=" + "[" * 3000], ["--set train.seed=[[[", "nests too deeply"]),
    (None, ["train.seed=" + "[" * 90 + "x"], ["train.seed: '[[[", "...("]),  # not YAML: a string, shown cut
    ("a: " + "[" * 3000 + "]" * 3000 + "\n", [], ["nest"]),
    ("a: " + "{b: " * 200 + "1" + "}" * 200 + "\n", [], ["nests deeper than 100 levels"]),
    (GOOD.replace("smoke: {train.epochs: 1}", "smoke: {train.epoks: 1}"), [], ["smoke block", "train.epoks"]),
    (GOOD.replace("smoke: {train.epochs: 1}", "smoke: {train.epochs: 0}"), [], ["smoke block", "train.epochs"]),
    (GOOD.replace("smoke: {train.epochs: 1}", "smoke: {scaling.num_workers: 3}"), [], ["smoke block",
                                                                                       "does not split evenly"]),
    # values no run can use, which reached torch or Ray as an overflow or took the machine down (issue 40, item 8)
    (None, ["train.seed=18446744073709551616"], ["train.seed: 18446744073709551616 is not allowed",
                                                 "at most 9,223,372,036,854,775,807", "torch.manual_seed"]),
    (None, ["scaling.num_workers=[1, 1000000000]"], ["scaling.num_workers: [1, 1000000000]", "from 1 to 100,000"]),
    (None, ["scaling.num_workers=1000000000", "train.batch_size=1000000000"], ["scaling.num_workers", "100,000"]),
    (None, ["scaling.num_workers=[1, 100000]"], ["scaling.num_workers: [1, 100000]: no global batch splits evenly",
                                                 "narrow the range (e.g. [1, 3]", "multiple of 6"]),
    (None, ["scaling.num_workers=[50000, 100000]", "train.batch_size=2000000000"],
     ["from 50000 to 100000", "choose a fixed count"]),
    (None, ["train.epochs=100000000000"], ["train.epochs", "at most 10,000,000"]),
    (None, ["train.batch_size=99999999999"], ["train.batch_size", "at most 2,147,483,647"]),
    (None, ["train.torch_threads=1000000"], ["train.torch_threads", "at most 1,024"]),
    (None, ["run.checkpoint_every_steps=" + "9" * 30], ["run.checkpoint_every_steps", "64-bit"]),
    (None, ["run.log_every_steps=" + "9" * 30], ["run.log_every_steps", "64-bit"]),
    (None, ["train.max_steps_per_epoch=" + "9" * 30], ["train.max_steps_per_epoch", "64-bit"]),
    (None, ["scaling.elastic_resize_monitor_interval_s=1e300"], ["elastic_resize_monitor_interval_s", "86400"]),
]


@pytest.mark.parametrize("preset, overrides, key", [
    ("linear", ["data.num_samples=1000000000000"], "data.num_samples"),
    ("gpt", ["data.generated_bytes=100000000000000"], "data.generated_bytes"),
    ("cifar10-vit", ["data.synthetic=true", "data.synthetic_train=10000000000"], "data.synthetic_train"),
    ("text-rnn", ["data.synthetic=true", "data.synthetic_train=100000000000"], "data.synthetic_train"),
])
def test_a_generated_data_set_larger_than_the_machines_memory_is_refused_naming_the_key(tmp_path, preset, overrides,
                                                                                           key):
    """Issue 40, item 8: a generated set is built whole in memory (in the driver before Ray, then in every worker);
    one beyond the machine's memory took it down. Refused at load, naming the key and the most it can hold."""
    with pytest.raises(ConfigError) as caught:
        load_config(preset, [*overrides, f"run.storage_path={tmp_path}"])
    message = str(caught.value)
    assert f"{key}: " in message and "more than half of this machine's" in message
    assert "Fix: generate at most" in message


def test_the_largest_values_a_run_can_use_load():
    """The bounds refuse only what no run can use: the largest seed torch takes with raytrain's offsets, and an
    elastic range whose counts all split the batch."""
    cfg = load_config("linear", ["train.seed=9223372036854775807", "scaling.num_workers=[1, 4]",
                                 "train.batch_size=2147483640", "train.epochs=10000000", "train.torch_threads=1024"])
    assert cfg.train.seed == 2**63 - 1 and cfg.scaling.num_workers == [1, 4]


@pytest.mark.parametrize("text, overrides, fragments", SILENTLY_WRONG)
def test_configs_that_were_silently_wrong_are_refused(tmp_path, text, overrides, fragments):
    _, message = refusal(tmp_path, text, overrides, fragments)
    assert "Fix:" in message and len(message) < 1000


def test_a_config_that_is_not_utf8_names_the_byte(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_bytes(GOOD.replace("linear", "lin\xe9ar").encode("latin-1"))
    with pytest.raises(ConfigError, match=r"job.yaml: is not UTF-8 text \(byte 0xe9 at line 3\)"):
        load_config(str(path))


def test_booleans_stay_where_a_boolean_is_meant(tmp_path):
    cfg = load_config(write(tmp_path, GOOD), ["scaling.use_gpu=false", "model.hidden=4"])
    assert cfg.scaling.use_gpu is False and cfg.model.kwargs["hidden"] == 4


@pytest.mark.parametrize("name", ["2024", "true", "null", "1e3", "~", "[a]", "'q'", "0x1F"])
def test_name_and_storage_are_strings_as_typed(tmp_path, name):
    from raytrain.spec.run_options import config_overrides

    cfg = load_config(write(tmp_path, GOOD), config_overrides(None, name, str(tmp_path / name)))
    assert cfg.run.name == name and cfg.run.storage_path == str(tmp_path / name)


@pytest.mark.parametrize("preset, overrides, loader, says", [
    ("digits", [], "torch", "the data is 0.5 MB in memory (at most 64 MB)"),  # the preset's own auto
    ("digits", ["data.loader=ray"], "ray", None),  # said explicitly: kept, no reason recorded
    ("linear", ["data.loader=auto", "data.num_samples=9000000"], "ray", "68.7 MB in memory (over 64 MB)"),
    ("cifar10-vit", ["data.loader=auto"], "ray", "176.2 MB in memory"),  # CIFAR-10's 60,000 images
    ("cifar10-vit", ["data.loader=auto", "data.synthetic=true", "data.synthetic_train=512", "data.synthetic_val=128"],
     "torch", "1.9 MB in memory"),
    ("linear", ["data.loader=auto", "scaling.num_workers=[1, 2]"], "torch", "as every elastic run"),
    ("linear", ["data.loader=auto", "data.num_samples=9000000", "scaling.fault_tolerance=torchft"], "torch",
     "as every scaling.fault_tolerance torchft run"),
    ("streaming", ["data.loader=auto"], "ray", "does not say how large its data is"),
])
def test_data_loader_auto_is_chosen_by_the_datas_size_and_says_why(preset, overrides, loader, says):
    cfg = load_config(preset, overrides)
    assert cfg.data.loader == loader and cfg.to_dict()["data"]["loader"] == loader  # the workers get the choice
    if says is None:
        assert cfg.data.loader_reason == ""
    else:
        assert cfg.data.loader_reason.startswith(f"auto: {loader}") and says in cfg.data.loader_reason, \
            cfg.data.loader_reason


def test_data_loader_auto_on_a_function_is_refused_with_the_fix(tmp_path, monkeypatch):
    (tmp_path / "fn_data.py").write_text("def make(ctx=None):\n    return {'train': []}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    path = write(tmp_path, "model: {name: mlp}\ndata: {_component_: fn_data.make, loader: auto}\n")
    with pytest.raises(ConfigError) as caught:
        load_config(str(path))
    message = str(caught.value)
    assert "data.loader: auto" in message and "fn_data.make is a function" in message and \
        "Fix: set data.loader: torch" in message, message
    path = write(tmp_path, "model: {name: mlp}\ndata: {_component_: fn_data.make, loader: spark}\n")
    with pytest.raises(ConfigError) as caught:
        load_config(str(path))
    message = str(caught.value).split("job.yaml: ", 1)[1]  # the path holds the test's name
    assert message.endswith("Fix: use one of torch, ray.") and "auto" not in message, message
