"""The run config: one flat, commented block of defaults per section, then the file, then --set.

Resolution order (later wins): the defaults below -> the YAML file (or preset) -> its `smoke:` block when
smoke mode is asked for -> `--set key=value` overrides. Unknown keys, wrong types and impossible values are
rejected here, before Ray starts, with a message that names the file (or the --set), the key and the fix.

`model`, `data` and `loop` name code by import path (`_component_`, see raytrain.spec.components): the built-in models
and datasets are components like a user's own, and their other keys are the callable's keyword arguments, checked
against its signature. `train`, `scaling` and `run` are raytrain's own sections, checked the same way (pydantic over
the dataclasses below). `train.loss` is a component too: a name, an import path, or a mapping with `_component_`.
"""

from __future__ import annotations

import copy
import difflib
import inspect
import math
import typing
from pathlib import Path
from typing import Any, Callable, Optional, Union
from urllib.parse import urlsplit

import yaml

from raytrain.data import DataContext, DataSource, resolve_loader
from raytrain.errors import ConfigError, shorten, shown
from raytrain.rundir import storage
from raytrain.spec import components, fsdp_units, loops, scaling_rules, yamlfile
from raytrain.spec.components import COMPONENT_KEY, Component
from raytrain.spec.run_options import Override, Setting, override_origin
from raytrain.spec.sections import (
    CLASSIFICATION_LOSSES,
    CREDENTIAL_KEYS,
    CREDENTIAL_VARIABLES,
    DEFAULT_LOOP,
    INCLUDE_KEY,
    MAX_BATCH,
    SCHEDULER_INTERVALS,
    SECTIONS,
    SMOKE_KEY,
    TRACKER_CLASSES,
    TRACKERS,
    DataSection,
    RunConfig,
    RunSection,
    ScalingSection,
    TrackingSection,
    TrainSection,
)

PRESETS_DIR = Path(__file__).resolve().parents[1] / "configs"  # raytrain/configs

__all__ = ["ConfigError", "RunConfig", "load_config", "config_from_dict", "dump_yaml"]

# ----------------------------------------------------------------------------------------------------------
# loading


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESETS_DIR.glob("*.yaml"))


def preset_summary(name: str) -> str:
    """A preset's opening comment paragraph, whole (its first line alone stops mid-sentence), without the
    "name: " it starts with (`raytrain presets`, the run-config reference)."""
    lines = []
    for line in (PRESETS_DIR / f"{name}.yaml").read_text().splitlines():
        if not line.startswith("#") or not line.lstrip("#").strip():
            break
        lines.append(line.lstrip("#").strip())
    summary = " ".join(lines)
    return summary[len(name) + 1:].strip() if summary.startswith(f"{name}:") else summary


def _is_file(path: Path) -> bool:
    """is_file() for any name a user can type: one too long for the OS, or with a NUL in it, is no file."""
    try:
        return path.is_file()
    except (OSError, ValueError):
        return False


def resolve_config_path(ref: str) -> Path:
    path = Path(ref)
    if _is_file(path):
        return path
    preset = PRESETS_DIR / f"{ref}.yaml"
    if "/" not in ref and _is_file(preset):
        return preset
    raise ConfigError(
        f"config {shown(ref)} is neither a YAML file nor a preset. "
        f"Fix: give a path to a run config, or one of the presets: {', '.join(preset_names())}."
    )


def read_yaml_mapping(path: Path) -> dict:
    loaded = yamlfile.read(path)  # UTF-8, no duplicate keys, bounded depth: one YAMLFileError naming the line
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError(
            f"{path}: the top level must be a mapping of sections. Fix: write it as sections "
            f"({', '.join(SECTIONS)}) each holding key: value lines, as in the presets."
        )
    return loaded


def load_config(ref: str, overrides: typing.Sequence[Override] = (), smoke: bool = False,
                import_user_code: bool = True) -> RunConfig:
    """Resolve a run config: defaults -> file (or preset, its include: files first) -> smoke block -> --set.
    import_user_code=False (raytrain validate, which runs without the user's project and without torch): only
    raytrain's own components are imported and checked; the others are listed in `unchecked`. The smoke block is
    checked without smoke mode too: a mistake in it is found before the first --smoke-test, not by it."""
    path = resolve_config_path(ref)
    raw, smoke_block, included = _read_layered(path)
    source = f"{path} (with {', '.join(map(str, included))})" if included else str(path)
    config = _resolve(copy.deepcopy(raw), smoke_block if smoke else {}, overrides, path, source, import_user_code)
    if smoke_block and not smoke:
        try:
            _resolve(raw, smoke_block, overrides, path, source, import_user_code)
        except ConfigError as err:
            if f"({SMOKE_KEY} block)" in str(err):
                raise
            # a rule across keys that only the smoke block's values break: say where they come from
            raise ConfigError(f"with its {SMOKE_KEY} block applied (as --smoke-test does): {err}") from None
    return config


def _resolve(raw: dict, smoke_block: dict, overrides: typing.Sequence[Override], path: Path, source: str,
             import_user_code: bool) -> RunConfig:
    origins: dict[str, str] = {}  # dotted key -> what set it last, when not the file itself
    for key, value in smoke_block.items():
        _set_dotted(raw, str(key), value, f"{source} ({SMOKE_KEY} block)")
        origins[str(key)] = f"{source} ({SMOKE_KEY} block)"
    for override in overrides:
        if isinstance(override, Setting):  # --name, --storage: the string as typed
            key, value, origin = override.key, override.value, override.origin
        else:  # "key=value" from --set
            origin = override_origin(override)
            key, value = parse_override(override)
        _set_dotted(raw, key, value, origin)
        origins[key] = origin
    raw.setdefault("run", {})
    if raw["run"].get("name") is None:
        raw["run"]["name"] = path.stem
    return build_config(raw, source, origins=origins, import_user_code=import_user_code)


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
        if not _is_file(included):
            raise ConfigError(f"{source}: {INCLUDE_KEY}: {shown(name)} not found (looked for "
                              f"{shorten(str(included), 200)}). "
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
        parsed = yamlfile.load(value, f"--set {shorten(text)}") if value.strip() else None
    except yamlfile.YAMLFileError as err:
        if not err.syntax:
            raise  # a key twice, nested too deep, a number Python cannot hold: a string would hide the mistake
        parsed = value  # a plain string such as a path with ':' in it
    return key.strip(), parsed


def _set_dotted(raw: dict, key: str, value: Any, where: str) -> None:
    parts = key.split(".")
    if len(parts) < 2 or not all(parts):
        raise ConfigError(
            f"{where}: '{key}' is not section.key. Fix: prefix it with its section, e.g. train.lr "
            f"(sections: {', '.join(SECTIONS)})."
        )
    if parts[0] not in SECTIONS:
        raise ConfigError(_unknown(where, f"section '{parts[0]}'", SECTIONS, value=parts[0]))
    node = raw.setdefault(parts[0], {})
    for part in parts[1:-1]:  # a component's nested argument, e.g. model.encoder.layers
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[parts[-1]] = value


def build_config(raw: dict, source: str, origins: Optional[dict[str, str]] = None,
                 import_user_code: bool = True) -> RunConfig:
    """Turn plain data (a file, or a checkpoint's stored config) into a validated RunConfig."""

    origins = origins or {}

    def where(key: str) -> str:  # a value set with --set is blamed on the --set, not on the file
        return origins.get(key) or source

    unchecked: list[str] = []

    def component(section: str, raw_section: Any, **options) -> tuple[Component, dict]:
        if not isinstance(raw_section, dict):
            raise ConfigError(f"{source}: section '{section}' must be a mapping, got {_typename(raw_section)}. "
                              f"Fix: write it as '{section}:' followed by indented key: value lines.")
        reference, rest = components.split_section(raw_section, where, section, options.get("default"))
        path = components.canonical_path(str(reference), section) if isinstance(reference, str) else ""
        if import_user_code or not path or path.startswith("raytrain."):
            return components.resolve(raw_section, where, section, **options)
        own = {key: rest.pop(key) for key in options.get("reserved", ()) if key in rest}
        unchecked.append(f"{section}: {path}")
        return Component(path, _unavailable, rest), own

    train = _section(TrainSection, raw.get("train"), where, "train")
    scaling = _section(ScalingSection, raw.get("scaling"), where, "scaling")
    run = _section(RunSection, _with_tracking(raw.get("run"), where), where, "run")
    loop = _loop(raw.get("loop") or {}, where, source, component, import_user_code, unchecked)
    # model and data are the loop's business: a section left out is None, refused only if the loop requires it.
    requires = tuple(getattr(loop.target, "requires", ())) if loop.target is not _unavailable else ()
    for section in ("model", "data"):
        if _absent(raw.get(section)) and section in requires:
            example = "mlp" if section == "model" else "raytrain.data.digits.Digits"
            raise ConfigError(f"{source}: the loop {loop.path} builds the config's {section}, but there is no "
                              f"'{section}' section. Fix: add {section}: {{_component_: ...}} (e.g. {example}), or "
                              f"use a loop of your own that builds it.")
    model = None if _absent(raw.get("model")) else component("model", raw.get("model"))[0]
    data_component, own = (None, {}) if _absent(raw.get("data")) else component(
        "data", raw.get("data"), reserved=("loader",), injected=(DataContext,))
    source_class = data_component.target if data_component is not None and isinstance(
        data_component.target, type) and issubclass(data_component.target, DataSource) else None
    loss = _loss(train.loss if train.loss is not None else (source_class or DataSource).default_loss, where,
                 import_user_code)
    if (source_class is not None and loss.path in CLASSIFICATION_LOSSES
            and components.canonical_path(source_class.default_loss, "loss") not in CLASSIFICATION_LOSSES):
        # cross_entropy over one regression output is log_softmax of one value: 0 whatever the model does; over a
        # language model's [B, T, V] logits it takes the positions for the classes
        raise ConfigError(f"{where('train.loss')}: train.loss: {loss.path} is a classification loss (one class per "
                          f"sample), but {data_component.path} is not classification data (regression data: one "
                          f"real-valued target per sample; text: one target token per position): nothing would "
                          f"train. Fix: use {source_class.default_loss} (its default), or leave train.loss unset.")
    data = None
    if data_component is not None:
        loaders = source_class.loaders if source_class else ("torch", "ray")
        # auto: by the data's size; with the code not imported here (raytrain validate), ray, which sizes
        # conservatively (a CPU for its tasks)
        function = data_component.path if source_class is None and data_component.target is not _unavailable else ""
        try:
            loader, reason = resolve_loader(own.get("loader", loaders[0]), loaders, data_component.path, function,
                                            lambda: components.instantiate(data_component) if source_class else None,
                                            elastic=scaling.elastic, torchft=scaling.torchft)
        except ValueError as err:
            raise ConfigError(f"{where('data.loader')}: {err}") from None
        data = DataSection(data_component, loader, reason)
    optimizer = _optional_component(train.optimizer, where, "train.optimizer", import_user_code, skip=1)
    scheduler_raw = dict(train.scheduler) if isinstance(train.scheduler, dict) else None
    interval = scheduler_raw.pop("interval", "epoch") if scheduler_raw is not None else "epoch"
    if interval not in SCHEDULER_INTERVALS:
        raise ConfigError(f"{where('train.scheduler')}: train.scheduler.interval: {interval!r} is not step or "
                          f"epoch. Fix: interval: step (the scheduler steps after every optimizer step) or epoch.")
    scheduler = _optional_component(scheduler_raw, where, "train.scheduler", import_user_code, skip=1)
    config = RunConfig(model=model, data=data, loss=loss, loop=loop, train=train, scaling=scaling, run=run,
                       source=source, unchecked=unchecked, optimizer=optimizer, scheduler=scheduler,
                       scheduler_interval=interval)
    _check_values(config, where)
    if source_class is not None:
        components.instantiate(data_component).check(config, _fail(where))
    return config


def _loop(raw: Any, where: components.Where, source: str, component: Callable, import_code: bool,
          unchecked: list[str]) -> Component:
    """The loop section: a raytrain.Session loop (`my_loop(session, **kwargs)`), or a Ray Train function
    (`train_func(config)` or `train_func()`, its settings under `train_loop_config`: raytrain.worker.raytrain_function)."""
    if not isinstance(raw, dict):
        return component("loop", raw)[0]  # says it must be a mapping
    given = loops.TRAIN_LOOP_CONFIG in raw
    reference, rest = components.split_section(raw, where, "loop", DEFAULT_LOOP)
    loop_config = rest.pop(loops.TRAIN_LOOP_CONFIG, None)
    key = f"loop.{loops.TRAIN_LOOP_CONFIG}"
    if given and loop_config is not None and not isinstance(loop_config, dict):
        raise ConfigError(f"{where(key)}: {key}: must be a mapping (what TorchTrainer's train_loop_config takes), "
                          f"got {_typename(loop_config)}. Fix: write it as '{loops.TRAIN_LOOP_CONFIG}:' "
                          f"followed by indented key: value lines, e.g. {{lr: 0.01, epochs: 3}}.")
    path = components.canonical_path(str(reference), "loop") if isinstance(reference, str) else ""
    if not import_code and path and not path.startswith("raytrain."):
        if not given:
            return component("loop", raw, default=DEFAULT_LOOP, skip=1)[0]  # unchecked, as any user loop
        unchecked.append(f"loop: {path}, a Ray Train function whose train_loop_config is its own")
        return Component(path, _unavailable, {loops.TRAIN_LOOP_CONFIG: dict(loop_config or {}), **rest})
    path, target = components.import_target(reference, where, "loop")
    if loops.is_ray_train_function(target, given):
        fixed = rest.pop(loops.FIXED_ON_RESUME, None)
        if fixed is not None and not (isinstance(fixed, list) and all(isinstance(p, str) for p in fixed)):
            key = f"loop.{loops.FIXED_ON_RESUME}"
            raise ConfigError(f"{where(key)}: {key}: must be a list of config keys, got {_typename(fixed)}. Fix: e.g. "
                              f"[loop.train_loop_config.hidden_size] (refused if changed when the run resumes).")
        split = rest.pop(loops.DATASETS_TO_SPLIT, None)
        if split is not None and split != "all" and not (isinstance(split, list)
                                                         and all(isinstance(n, str) for n in split)):
            key = f"loop.{loops.DATASETS_TO_SPLIT}"
            raise ConfigError(f"{where(key)}: {key}: must be all or a list of dataset names, got {_typename(split)}. "
                              f"Fix: e.g. [train] (what TorchTrainer's DataConfig(datasets_to_split=...) takes).")
        if rest:
            first = next(iter(rest))
            raise ConfigError(
                f"{where(f'loop.{first}')}: unknown key 'loop.{first}': {path} is a Ray Train function (it takes "
                f"{loops.describe_parameters(target)}), whose settings are its config. Fix: move "
                f"{', '.join(rest)} under loop.{loops.TRAIN_LOOP_CONFIG}, as TorchTrainer's "
                f"train_loop_config.")
        if getattr(target, "applied_on_resume", None):
            raise ConfigError(
                f"{source}: {path} declares applied_on_resume, but a Ray Train function restores its own optimizer "
                f"from ray.train.get_checkpoint(): raytrain has no optimizer to set them into. Fix: drop "
                f"applied_on_resume (a changed train_loop_config value reaches the function anyway), or write the "
                f"loop against raytrain.Session.")
        kwargs = {loops.TRAIN_LOOP_CONFIG: dict(loop_config or {})}
        if fixed:
            kwargs[loops.FIXED_ON_RESUME] = list(fixed)
        if split is not None:
            kwargs[loops.DATASETS_TO_SPLIT] = split
        return Component(path, target, kwargs)
    if given:
        raise ConfigError(
            f"{where(key)}: {key}: {path} is not a Ray Train function (it takes "
            f"{loops.describe_parameters(target)}); train_loop_config is the config of a function "
            f"`train_func(config)` or `train_func()`. Fix: give a raytrain.Session loop its settings as keys of "
            f"the loop section, or name a Ray Train function.")
    return component("loop", raw, default=DEFAULT_LOOP, skip=1)[0]


def _unavailable(*_args, **_kwargs):
    raise ConfigError("this component's code is not importable here")


def _absent(section: Any) -> bool:
    return section is None or section == {}


def _optional_component(raw: Any, where: components.Where, section: str, import_code: bool,
                        skip: int) -> Optional[Component]:
    """A `{_component_: ..., kwargs}` setting inside raytrain's own sections (train.optimizer, train.scheduler),
    checked against its signature after its first `skip` parameters (the parameters, the optimizer)."""
    if not isinstance(raw, dict):
        return None
    reference, rest = components.split_section(raw, where, section)
    if not import_code and isinstance(reference, str) and not reference.startswith("torch."):
        return Component(str(reference), _unavailable, rest)
    return components.resolve(raw, where, section, skip=skip)[0]


def _section(cls: type, raw: Any, where: components.Where, section: str):
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{components.where_of(where, section)}: section '{section}' must be a mapping, got "
                          f"{_typename(raw)}. Fix: write it as '{section}:' followed by indented key: value lines.")
    return cls(**components.check_kwargs(cls, raw, where, section, path=f"the '{section}' section"))


def _with_tracking(raw: Any, where: components.Where) -> Any:
    """The run section with run.tracking checked level by level, so that a mistake is named by its whole key
    (run.tracking.mlflow.uri), and made a TrackingSection (None when it names no tracker)."""
    if not isinstance(raw, dict) or raw.get("tracking") is None or isinstance(raw["tracking"], TrackingSection):
        return raw
    key, given = "run.tracking", raw["tracking"]
    example = "{mlflow: {uri: http://mlflow:5000, experiment: my-team}} or {wandb: {project: my-project}}"
    if not isinstance(given, dict):
        raise ConfigError(f"{components.where_of(where, key)}: {key}: must be a mapping, got {_typename(given)}. "
                          f"Fix: e.g. tracking: {example}.")
    trackers: dict[str, Any] = {}
    for name in TRACKERS:
        value, sub = given.get(name), f"{key}.{name}"
        if value is None:
            continue
        if not isinstance(value, dict):
            raise ConfigError(f"{components.where_of(where, sub)}: {sub}: must be a mapping, got {_typename(value)}. "
                              f"Fix: e.g. tracking: {example} ({{}} takes every default).")
        for secret in value:
            if str(secret).lower() in CREDENTIAL_KEYS:
                raise ConfigError(f"{components.where_of(where, f'{sub}.{secret}')}: {sub}.{secret}: credentials never "
                                  f"go in a run config (it is saved in config.yaml and in every checkpoint). Fix: "
                                  f"remove it and set {CREDENTIAL_VARIABLES[name]} in the environment of the process "
                                  f"that trains (in a RayJob: the entrypoint's env, from a Secret).")
        cls = TRACKER_CLASSES[name]
        tracker = cls(**components.check_kwargs(cls, value, where, sub, path=f"the '{sub}' section"))
        _check_tracker(tracker, sub, _fail(where))
        trackers[name] = tracker
    rest = {k: v for k, v in given.items() if k not in TRACKERS}
    checked = components.check_kwargs(TrackingSection, rest, where, key, path=f"the '{key}' section")
    section = TrackingSection(**{**checked, **trackers})
    return {**raw, "tracking": section if section.trackers() else None}


def _check_tracker(tracker: Any, key: str, fail: Callable) -> None:
    """What a tracker's annotations cannot say: no empty names, no password inside the URI."""
    for name, value in vars(tracker).items():
        if isinstance(value, str) and not value.strip():
            fail(f"{key}.{name}", "is empty", f"give a value, or leave {key}.{name} out for its default")
    uri = getattr(tracker, "uri", None)
    if uri:
        try:
            secret = urlsplit(uri).password
        except ValueError:
            secret = None
        if secret:
            fail(f"{key}.uri", "holds a password (user:password@host), which would be saved in config.yaml and in "
                 "every checkpoint", "give the URI without it and set MLFLOW_TRACKING_USERNAME and "
                 "MLFLOW_TRACKING_PASSWORD (or MLFLOW_TRACKING_TOKEN) in the environment of the process that trains")


def _loss(value: Union[str, dict], where: components.Where, import_code: bool = True) -> Component:
    """train.loss: a name or import path, or {_component_: path, kwargs}. A class (torch.nn.MSELoss) is
    instantiated with the kwargs; a function gets them on every call after (input, target)."""
    raw = {COMPONENT_KEY: value} if isinstance(value, str) else dict(value)
    reference, kwargs = components.split_section(raw, where, "train.loss")
    if not import_code and isinstance(reference, str):  # torch's and the user's losses: checked when the run starts
        return Component(components.canonical_path(reference, "loss"), _unavailable, kwargs)
    path, target = components.import_target(reference, where, "loss")
    skip = 0 if inspect.isclass(target) else 2
    checked = components.check_kwargs(target, kwargs, where, "train.loss", skip=skip, path=path)
    return Component(path, target, {key: checked[key] for key in kwargs})  # a loss's defaults are torch's business


def _fail(where: components.Where):
    def fail(key: str, problem: str, fix: str) -> typing.NoReturn:
        raise ConfigError(f"{components.where_of(where, key)}: {key}: {problem}. Fix: {fix}.")

    return fail


def _check_values(cfg: RunConfig, where: components.Where) -> None:
    """Rules across keys; each key's own range is in its annotation above."""
    fail = _fail(where)
    t, s, r = cfg.train, cfg.scaling, cfg.run

    if loops.TRAIN_LOOP_CONFIG not in cfg.loop.kwargs:  # a Ray Train function batches its own data
        _check_batches(t, s, fail)
    else:  # a Ray Train function wraps its own model and reports its own checkpoints
        for key, value, default in (("scaling.strategy", s.strategy, "ddp"),
                                    ("run.checkpointer", r.checkpointer, "auto")):
            if value != default:
                fail(key, f"'{value}' applies to raytrain.Session loops; a Ray Train function prepares its model and "
                          f"reports its checkpoints itself", f"drop {key} (or set it to {default}), and shard the "
                                                             f"model inside the function")
    if s.elastic:
        scaling_rules.check_elastic(cfg, fail)
    if s.torchft:
        scaling_rules.check_torchft(cfg, fail)
    if s.strategy == "fsdp" and t.mixed_precision == "fp16":
        fail("train.mixed_precision", "fp16 with scaling.strategy fsdp needs a sharded gradient scaler, which "
             "raytrain does not provide", "use bf16 (or auto: bf16 on GPU), or scaling.strategy ddp")
    if s.fsdp_wrap and s.strategy != "fsdp" and not s.activation_checkpointing:
        fail("scaling.fsdp_wrap", "names FSDP units but scaling.strategy is ddp", "set scaling.strategy: fsdp, or "
             "drop scaling.fsdp_wrap")
    built = (fsdp_units.built_of(cfg.model.path, cfg.model.target, cfg.model.kwargs)
             if s.fsdp_wrap and cfg.model is not None else None)
    if built is not None and (problem := fsdp_units.fsdp_wrap_problem(s.fsdp_wrap, built[1], built[0])):
        fail("scaling.fsdp_wrap", *problem)  # a built-in model, known without torch: refused at load, as in validate
    if not s.use_gpu and t.mixed_precision in ("bf16", "fp16"):
        fail(
            "train.mixed_precision",
            f"'{t.mixed_precision}' needs a GPU but scaling.use_gpu is false",
            "use 'auto' or 'off' on CPU, or set scaling.use_gpu=true",
        )
    if not r.name or "/" in r.name or "\\" in r.name or r.name in (".", "..") or r.name != r.name.strip():
        fail("run.name", f"'{r.name}' cannot name a run directory", "use letters, digits, '-' and '_'")
    if not r.storage_path or not r.storage_path.strip():
        fail("run.storage_path", "is empty", "give a directory, on a cluster the shared volume such as /mnt/shared/runs")
    elif (problem := storage.url_problem(r.storage_path)) is not None:
        fail("run.storage_path", f"{r.storage_path!r}: {problem[0]}", problem[1])


def _check_batches(t: TrainSection, s: ScalingSection, fail: Callable) -> None:
    """The global batch splits evenly over every worker count the run may train on (an elastic run: each of
    min..max), and each share into train.grad_accum_steps micro-batches."""
    counts = s.worker_counts
    # The batch must be a multiple of every count, and each share of the accumulation steps: of lcm(counts) * accum.
    # Built up count by count and given up once past the largest batch allowed (no batch splits then): the lcm of
    # consecutive counts passes it within a few dozen of them, so [1, 100000] costs what [1, 30] does, and every
    # range that gets past this is that short.
    multiple = 1
    for n in counts:
        multiple = math.lcm(multiple, n)
        if multiple > MAX_BATCH:
            break
    if multiple > MAX_BATCH and s.elastic and s.min_workers <= t.batch_size:
        top = _widest(s.min_workers, t.batch_size)
        fix = (f"narrow the range (e.g. [{s.min_workers}, {top}], whose counts all split a batch that is a multiple "
               f"of {math.lcm(*range(s.min_workers, top + 1))}), or choose a fixed count" if top > s.min_workers else
               f"choose a fixed count (no range from {s.min_workers} splits a batch of at most {t.batch_size})")
        fail("scaling.num_workers", f"[{s.min_workers}, {s.max_workers}]: no global batch splits evenly over every "
             f"count from {s.min_workers} to {s.max_workers} (one that does is a multiple of {_clip(multiple)} or "
             f"more, past train.batch_size's bound of {MAX_BATCH:,})", fix)
    step = multiple * t.grad_accum_steps
    if t.batch_size % step == 0:
        return
    lower, upper = t.batch_size - t.batch_size % step, t.batch_size - t.batch_size % step + step
    choices = f"{lower} or {upper}" if lower else f"{upper}"
    if t.batch_size < s.max_workers:
        fail("train.batch_size", f"global batch size {t.batch_size} is smaller than scaling.num_workers "
             f"{s.max_workers}", f"use a global batch size of at least {s.max_workers} (e.g. {choices})")
    uneven = next((n for n in counts if t.batch_size % n), None)
    if uneven is not None:
        over = (f"{uneven} workers (an elastic run trains on any of {s.min_workers}..{s.max_workers}, the global "
                f"batch fixed)" if s.elastic else f"{uneven} workers")
        fail("train.batch_size", f"global batch size {t.batch_size} does not split evenly over {over}",
             f"use {choices}, or change scaling.num_workers")
    share = next(t.batch_size // n for n in counts if (t.batch_size // n) % t.grad_accum_steps)  # counts: <= batch
    fail("train.grad_accum_steps",
         f"each worker's {share} samples per step do not split into {t.grad_accum_steps} equal micro-batches",
         f"use a train.grad_accum_steps that divides {share}, or a train.batch_size of {choices}")


def _clip(number: int) -> str:
    text = str(number)
    return text if len(text) <= 20 else f"{text[:6]}... ({len(text)} digits)"


def _widest(low: int, batch: int) -> int:
    """The largest max for which [low, max] shares a batch of at most `batch` evenly (a few steps: see above)."""
    multiple, top = low, low
    while math.lcm(multiple, top + 1) <= batch:
        top += 1
        multiple = math.lcm(multiple, top)
    return top


def _unknown(source: str, what: str, allowed: typing.Iterable[str], value: Optional[str] = None) -> str:
    allowed = list(allowed)
    probe = value if value is not None else what.split(".")[-1]
    close = difflib.get_close_matches(probe, allowed, n=1)
    hint = f"did you mean '{close[0]}'? " if close else ""
    return f"{source}: unknown {what}. Fix: {hint}allowed: {', '.join(allowed)}."


def _typename(value: Any) -> str:
    return {dict: "a mapping", list: "a list", str: "a string"}.get(type(value), type(value).__name__)


def config_from_dict(resolved: dict, source: str = "<stored config>") -> RunConfig:
    """Rebuild a RunConfig from to_dict() output (what the launcher ships to the workers)."""
    return build_config(copy.deepcopy(resolved), source)


def dump_yaml(cfg: RunConfig) -> str:
    return yaml.safe_dump(cfg.to_dict(), sort_keys=False)
