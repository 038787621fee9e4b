"""The run config: one flat, commented block of defaults per section, then the file, then --set.

Resolution order (later wins): the defaults below -> the YAML file (or preset) -> its `smoke:` block when
smoke mode is asked for -> `--set key=value` overrides. Unknown keys, wrong types and impossible values are
rejected here, before Ray starts, with a message that names the file, the key and the fix.

`model` and `data` hold a `name` that picks a builder (training/models.py, training/data/); the other keys of
those sections are that builder's own parameters, declared as dataclasses next to the builder.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, Optional, Union

import yaml

from raytrain.errors import UsageError

PRESETS_DIR = Path(__file__).parent / "configs"


class ConfigError(UsageError, ValueError):
    """A config the user must fix; str() is the whole message, ready to print."""


# ----------------------------------------------------------------------------------------------------------
# defaults


@dataclass
class TrainSection:
    epochs: int = 10  # passes over the training set
    batch_size: int = 64  # GLOBAL batch size; each of N workers gets batch_size / N
    optimizer: Literal["adam", "adamw", "sgd"] = "adamw"
    lr: float = 1e-3
    weight_decay: float = 0.0
    momentum: float = 0.9  # sgd only
    mixed_precision: Literal["auto", "off", "bf16", "fp16"] = "auto"  # auto: bf16 on GPU, off on CPU
    grad_clip: float = 0.0  # max global grad norm; 0 disables
    seed: int = 0
    max_steps_per_epoch: int = 0  # 0 = the whole epoch; smoke runs cap it
    torch_threads: int = 0  # intra-op threads per worker; 0 = derived from the worker's CPUs


@dataclass
class ScalingSection:
    num_workers: int = 2  # Ray Train workers (DDP ranks)
    use_gpu: bool = False
    cpus_per_worker: Union[float, Literal["auto"]] = "auto"  # auto: fit the workers into the cluster, <= 1 each
    gpus_per_worker: float = 1.0  # only with use_gpu


@dataclass
class RunSection:
    name: Optional[str] = None  # run directory under storage_path; default: the config's name
    storage_path: str = "./runs"  # on a cluster: the shared volume, e.g. /mnt/shared/runs
    checkpoint_every: int = 1  # epochs between checkpoints (the last epoch always checkpoints)
    keep_checkpoints: int = 2  # newest N kept; >= 2 lets a corrupt newest fall back to the one before
    max_failures: int = 3  # worker-group restarts before the run fails; -1 = unlimited


@dataclass
class ModelSection:
    name: str
    params: Any  # the builder's parameter dataclass


@dataclass
class DataSection:
    name: str
    loader: Literal["torch", "ray"]  # torch: map-style dataset + prepare_data_loader; ray: Ray Data shards
    params: Any  # the builder's parameter dataclass


@dataclass
class RunConfig:
    model: ModelSection
    data: DataSection
    train: TrainSection = field(default_factory=TrainSection)
    scaling: ScalingSection = field(default_factory=ScalingSection)
    run: RunSection = field(default_factory=RunSection)
    source: str = "<defaults>"  # where the file part came from, for messages; not a setting

    def to_dict(self) -> dict:
        """The resolved config as plain data: what config.yaml and every checkpoint store."""
        return {
            "model": {"name": self.model.name, **dataclasses.asdict(self.model.params)},
            "data": {"name": self.data.name, "loader": self.data.loader, **dataclasses.asdict(self.data.params)},
            "train": dataclasses.asdict(self.train),
            "scaling": dataclasses.asdict(self.scaling),
            "run": dataclasses.asdict(self.run),
        }

    @property
    def per_worker_batch_size(self) -> int:
        return self.train.batch_size // self.scaling.num_workers


SECTIONS = ("model", "data", "train", "scaling", "run")
SMOKE_KEY = "smoke"  # a preset's block of dotted overrides for a seconds-long run
INCLUDE_KEY = "include"  # files layered under this one, e.g. a hyperparameters file and an environment file


# ----------------------------------------------------------------------------------------------------------
# loading


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESETS_DIR.glob("*.yaml"))


def resolve_config_path(ref: str) -> Path:
    path = Path(ref)
    if path.is_file():
        return path
    preset = PRESETS_DIR / f"{ref}.yaml"
    if "/" not in ref and preset.is_file():
        return preset
    raise ConfigError(
        f"config '{ref}' is neither a YAML file nor a preset. "
        f"Fix: give a path to a run config, or one of the presets: {', '.join(preset_names())}."
    )


def read_yaml_mapping(path: Path) -> dict:
    try:
        loaded = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML ({_one_line(err)}). Fix the syntax at the position shown.") from None
    except OSError as err:
        raise ConfigError(f"{path}: cannot be read ({err.strerror}). Fix: check the path and its permissions.") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError(
            f"{path}: the top level must be a mapping of sections. Fix: write it as sections "
            f"({', '.join(SECTIONS)}) each holding key: value lines, as in the presets."
        )
    return loaded


def load_config(ref: str, overrides: typing.Sequence[str] = (), smoke: bool = False) -> RunConfig:
    """Resolve a run config: defaults -> file (or preset, its include: files first) -> smoke block -> --set."""
    path = resolve_config_path(ref)
    raw, smoke_block, included = _read_layered(path)
    source = f"{path} (with {', '.join(map(str, included))})" if included else str(path)
    if smoke:
        for key, value in smoke_block.items():
            _set_dotted(raw, str(key), value, f"{source} ({SMOKE_KEY} block)")
    for override in overrides:
        key, value = parse_override(override)
        _set_dotted(raw, key, value, f"--set {override}")
    raw.setdefault("run", {})
    if raw["run"].get("name") is None:
        raw["run"]["name"] = path.stem
    return build_config(raw, source)


def _read_layered(path: Path, chain: tuple[Path, ...] = ()) -> tuple[dict, dict, list[Path]]:
    """A config file's sections and smoke block with its `include:` files layered underneath, in order (a later
    file wins, the including file over all). Returns (sections, smoke block, the included files)."""
    raw = read_yaml_mapping(path)
    source = str(path)
    smoke_block = raw.pop(SMOKE_KEY, None) or {}
    if not isinstance(smoke_block, dict):
        raise ConfigError(f"{source}: '{SMOKE_KEY}' is not a mapping. Fix: give it dotted keys, e.g. train.epochs: 1.")
    includes = raw.pop(INCLUDE_KEY, None) or []
    if isinstance(includes, str):
        includes = [includes]
    if not isinstance(includes, list) or not all(isinstance(name, str) for name in includes):
        raise ConfigError(f"{source}: '{INCLUDE_KEY}' is not a list of file names. Fix: e.g. "
                          f"include: [hparams.yaml, env.yaml], paths relative to {path.parent}.")
    for section, value in raw.items():
        if section not in SECTIONS:
            raise ConfigError(_unknown(source, section, SECTIONS + (SMOKE_KEY, INCLUDE_KEY)))
        if not isinstance(value, dict):
            raise ConfigError(f"{source}: section '{section}' must be a mapping, got {_typename(value)}. "
                              f"Fix: write it as '{section}:' followed by indented key: value lines.")
    merged: dict = {}
    merged_smoke: dict = {}
    files: list[Path] = []
    here = chain + (path.resolve(),)
    for name in includes:
        included = (path.parent / name).expanduser()
        if not included.is_file():
            raise ConfigError(f"{source}: {INCLUDE_KEY}: '{name}' not found (looked for {included}). "
                              f"Fix: give a path relative to {path.parent}, or an absolute one.")
        if included.resolve() in here:
            raise ConfigError(f"{source}: {INCLUDE_KEY}: '{name}' includes itself (through {' -> '.join(map(str, here))})."
                              f" Fix: remove the cycle.")
        layer, layer_smoke, layer_files = _read_layered(included, here)
        for section, values in layer.items():
            merged.setdefault(section, {}).update(values)
        merged_smoke.update(layer_smoke)
        files += layer_files + [included]
    for section, values in raw.items():
        merged.setdefault(section, {}).update(values)
    merged_smoke.update(smoke_block)
    return merged, merged_smoke, files


def parse_override(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set {text}: expected key=value. Fix: write it as e.g. --set train.lr=0.01.")
    try:
        parsed = yaml.safe_load(value) if value.strip() else None
    except yaml.YAMLError:
        parsed = value  # a plain string such as a path with ':' in it
    return key.strip(), parsed


def _set_dotted(raw: dict, key: str, value: Any, where: str) -> None:
    parts = key.split(".")
    if len(parts) != 2:
        raise ConfigError(
            f"{where}: '{key}' is not section.key. Fix: prefix it with its section, e.g. train.lr "
            f"(sections: {', '.join(SECTIONS)})."
        )
    section, name = parts
    if section not in SECTIONS:
        raise ConfigError(_unknown(where, section, SECTIONS))
    raw.setdefault(section, {})[name] = value


def build_config(raw: dict, source: str) -> RunConfig:
    """Turn plain data (a file or a checkpoint's stored config) into a validated RunConfig."""
    from raytrain import data as datasets
    from raytrain import models

    model_raw = dict(raw.get("model") or {})
    data_raw = dict(raw.get("data") or {})
    model_name = _required_name(source, "model", model_raw, models.MODELS)
    data_name = _required_name(source, "data", data_raw, datasets.DATASETS)
    spec = datasets.DATASETS[data_name]
    loader = data_raw.pop("loader", spec.loaders[0])
    if loader not in spec.loaders:
        raise ConfigError(
            f"{source}: data.loader: '{loader}' is not available for data.name '{data_name}'. "
            f"Fix: use one of {', '.join(spec.loaders)}."
        )
    config = RunConfig(
        model=ModelSection(model_name, _build_dataclass(models.MODELS[model_name].params, model_raw, source, "model")),
        data=DataSection(data_name, loader, _build_dataclass(spec.params, data_raw, source, "data")),
        train=_build_dataclass(TrainSection, raw.get("train") or {}, source, "train"),
        scaling=_build_dataclass(ScalingSection, raw.get("scaling") or {}, source, "scaling"),
        run=_build_dataclass(RunSection, raw.get("run") or {}, source, "run"),
        source=source,
    )
    _check_values(config)
    models.MODELS[model_name].check(config, _fail(source))
    spec.check(config, _fail(source))
    return config


def _fail(source: str):
    def fail(key: str, problem: str, fix: str) -> typing.NoReturn:
        raise ConfigError(f"{source}: {key}: {problem}. Fix: {fix}.")

    return fail


def _check_values(cfg: RunConfig) -> None:
    fail = _fail(cfg.source)
    t, s, r = cfg.train, cfg.scaling, cfg.run
    if t.epochs < 1:
        fail("train.epochs", f"{t.epochs} is not a positive number of epochs", "set train.epochs to 1 or more")
    if t.lr <= 0:
        fail("train.lr", f"{t.lr} must be > 0", "use a learning rate such as 1e-3")
    if t.weight_decay < 0:
        fail("train.weight_decay", f"{t.weight_decay} must be >= 0", "use 0 to disable weight decay")
    if t.grad_clip < 0:
        fail("train.grad_clip", f"{t.grad_clip} must be >= 0", "use 0 to disable clipping")
    if t.max_steps_per_epoch < 0 or t.torch_threads < 0:
        key = "train.max_steps_per_epoch" if t.max_steps_per_epoch < 0 else "train.torch_threads"
        fail(key, "must be >= 0", "use 0 for the default")
    if s.num_workers < 1:
        fail("scaling.num_workers", f"{s.num_workers} workers cannot train", "set scaling.num_workers to 1 or more")
    if t.batch_size < s.num_workers:
        fail(
            "train.batch_size",
            f"global batch size {t.batch_size} is smaller than scaling.num_workers {s.num_workers}",
            f"use a global batch size of at least {s.num_workers}",
        )
    if t.batch_size % s.num_workers:
        lower = t.batch_size - t.batch_size % s.num_workers
        fail(
            "train.batch_size",
            f"global batch size {t.batch_size} does not split evenly over {s.num_workers} workers",
            f"use {lower} or {lower + s.num_workers}, or change scaling.num_workers",
        )
    if s.cpus_per_worker != "auto" and s.cpus_per_worker <= 0:
        fail("scaling.cpus_per_worker", f"{s.cpus_per_worker} must be > 0", "use a positive number or 'auto'")
    if s.use_gpu and s.gpus_per_worker <= 0:
        fail("scaling.gpus_per_worker", f"{s.gpus_per_worker} must be > 0 with use_gpu", "use 1")
    if not s.use_gpu and t.mixed_precision in ("bf16", "fp16"):
        fail(
            "train.mixed_precision",
            f"'{t.mixed_precision}' needs a GPU but scaling.use_gpu is false",
            "use 'auto' or 'off' on CPU, or set scaling.use_gpu=true",
        )
    if r.checkpoint_every < 1:
        fail("run.checkpoint_every", f"{r.checkpoint_every} must be >= 1", "checkpoint every 1 or more epochs")
    if r.keep_checkpoints < 1:
        fail("run.keep_checkpoints", f"{r.keep_checkpoints} must be >= 1", "keep at least 1 (2 allows fallback)")
    if r.max_failures < -1:
        fail("run.max_failures", f"{r.max_failures} is not allowed", "use -1 (unlimited), 0, or a positive count")
    if not r.name or "/" in r.name or r.name in (".", ".."):
        fail("run.name", f"'{r.name}' cannot name a run directory", "use letters, digits, '-' and '_'")
    if not r.storage_path:
        fail("run.storage_path", "is empty", "give a directory, on a cluster the shared volume such as /mnt/shared/runs")


def _required_name(source: str, section: str, raw: dict, registry: dict) -> str:
    name = raw.pop("name", None)
    if name is None:
        raise ConfigError(f"{source}: {section}.name is missing. Fix: set it to one of {', '.join(sorted(registry))}.")
    if name not in registry:
        raise ConfigError(_unknown(source, f"{section}.name '{name}'", sorted(registry), value=str(name)))
    return name


def _unknown(source: str, what: str, allowed: typing.Iterable[str], value: Optional[str] = None) -> str:
    allowed = list(allowed)
    probe = value if value is not None else what.split(".")[-1]
    close = difflib.get_close_matches(probe, allowed, n=1)
    hint = f"did you mean '{close[0]}'? " if close else ""
    return f"{source}: unknown {what}. Fix: {hint}allowed: {', '.join(allowed)}."


def _build_dataclass(cls: type, raw: dict, source: str, section: str):
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: section '{section}' must be a mapping, got {_typename(raw)}. "
                          f"Fix: write it as '{section}:' followed by indented key: value lines.")
    hints = typing.get_type_hints(cls)
    known = {f.name for f in fields(cls)}
    values = {}
    for key, value in raw.items():
        if key not in known:
            raise ConfigError(_unknown(source, f"key '{section}.{key}'", sorted(known), value=str(key)))
        values[key] = _coerce(value, hints[key], source, f"{section}.{key}")
    missing = [f.name for f in fields(cls) if f.name not in values and f.default is dataclasses.MISSING
               and f.default_factory is dataclasses.MISSING]
    if missing:
        raise ConfigError(f"{source}: {section}.{missing[0]} is required. Fix: set it in the '{section}' section.")
    return cls(**values)


def _coerce(value: Any, hint: Any, source: str, key: str) -> Any:
    """Check one value against its annotation; ints are accepted where floats are expected, nothing else."""
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        for option in typing.get_args(hint):
            try:
                return _coerce(value, option, source, key)
            except ConfigError:
                continue
        raise ConfigError(f"{source}: {key}: {value!r} is not {_describe(hint)}. Fix: use {_describe(hint)}.")
    if origin is Literal:
        choices = typing.get_args(hint)
        if value in choices:
            return value
        raise ConfigError(f"{source}: {key}: {value!r} is not allowed. Fix: use one of {', '.join(map(str, choices))}.")
    if hint is type(None):
        if value is None:
            return None
    elif hint is bool:
        if isinstance(value, bool):
            return value
    elif hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # PyYAML (YAML 1.1) reads 1e-3 without a dot as a string
            try:
                return float(value)
            except ValueError:
                pass
    elif hint is str:
        if isinstance(value, str):
            return value
    elif origin is list or hint is list:
        if isinstance(value, list):
            return value
    else:
        return value
    raise ConfigError(f"{source}: {key}: {value!r} is not {_describe(hint)}. Fix: use {_describe(hint)}.")


def _describe(hint: Any) -> str:
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        return " or ".join(_describe(option) for option in typing.get_args(hint))
    if origin is Literal:
        return "one of " + ", ".join(repr(c) for c in typing.get_args(hint))
    return {bool: "true/false", int: "an integer", float: "a number", str: "a string", type(None): "null"}.get(
        hint, getattr(hint, "__name__", str(hint))
    )


def _typename(value: Any) -> str:
    return {dict: "a mapping", list: "a list", str: "a string"}.get(type(value), type(value).__name__)


def _one_line(err: Exception) -> str:
    return " ".join(str(err).split())


def config_from_dict(resolved: dict, source: str = "<stored config>") -> RunConfig:
    """Rebuild a RunConfig from to_dict() output (what the launcher ships to the workers)."""
    return build_config({k: dict(v) for k, v in resolved.items()}, source)


def dump_yaml(cfg: RunConfig) -> str:
    return yaml.safe_dump(cfg.to_dict(), sort_keys=False)
