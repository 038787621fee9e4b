"""What every start of a run does in the driver before Ray starts (shared by `raytrain run`, `local` and `tune`):
check that the model component builds, check a resume against the run's checkpoints, prepare the data once, and
decide how the user's code reaches the workers.
"""

from __future__ import annotations

import dataclasses
import os
import re
import sysconfig
import tempfile
import traceback
import warnings
from pathlib import Path
from typing import Callable, Optional

from raytrain.checkpoint import checkpoints, resume
from raytrain.data import DataUnavailable, data_context
from raytrain.errors import ConfigError, LaunchError, UsageError
from raytrain.parallel import sharding
from raytrain.platform.rayinternals import walk_working_dir
from raytrain.rundir import console, layout, runrecords, storage
from raytrain.rundir.runcontrol import RunControl
from raytrain.rundir.storagecheck import check_storage
from raytrain.spec import components, workdir
from raytrain.spec.build import build_loss, build_model, call_data_component, data_source
from raytrain.spec.config import dump_yaml
from raytrain.spec.sections import RunConfig

# Never shipped with the user's code: version control, environments, caches and run output.
SHIP_EXCLUDES = [".git", ".venv", "venv", "__pycache__", "*.pyc", ".pytest_cache", ".mypy_cache", "runs", "*.pt",
                 "*.ckpt"]


# What torch says when the meta device cannot run an operation (no meta kernel, a value read out of a tensor that
# has none): a limit of the check, not the user's mistake. Anything else a constructor raises is the user's.
META_LIMIT = re.compile(r"\bmeta tensors?\b|'Meta' backend|\bmeta device\b|device='meta'", re.IGNORECASE)


def _meta_limit(err: BaseException) -> bool:
    return isinstance(err, (NotImplementedError, RuntimeError)) and bool(META_LIMIT.search(str(err)))


def _keep_traceback(err: BaseException) -> None:
    """The whole traceback of an error the message sums up, in the run's driver-logs copy (when there is one)."""
    path = console.copy_path()
    if path is not None:
        with open(path, "a", encoding="utf-8") as handle:
            handle.write("".join(traceback.format_exception(type(err), err, err.__traceback__)))


def check_model_builds(cfg: RunConfig) -> None:
    """Build the model once on torch's meta device (no memory, no data): a constructor that rejects its arguments
    fails here, naming the model section, instead of in every worker after Ray Train's restarts."""
    import torch

    if cfg.model is None:  # a loop that builds its own model: nothing to check here
        return
    try:
        with torch.device("meta"):
            model = build_model(cfg)
    except ConfigError:
        raise
    except Exception as err:
        if _meta_limit(err):  # a constructor that does real tensor work the meta device cannot: checked on the workers
            return
        _keep_traceback(err)
        message = " ".join(str(err).split()).rstrip(".") or err.__class__.__name__
        raise ConfigError(f"{cfg.source}: model: {cfg.model.path}({_kwargs(cfg.model.kwargs)}) cannot be built: "
                          f"{err.__class__.__name__}: {message}{components.innermost_site(err)}. Fix: correct the "
                          f"model section's values.") from None
    if cfg.scaling.strategy == "fsdp" or cfg.scaling.activation_checkpointing:
        sharding.check_units(model, cfg)  # FSDP units (and recomputed ones) are modules of the model


def _sample_pair(cfg: RunConfig):
    """One (input, target) of the training data as tensors, read as a map-style dataset (also for a source that
    feeds Ray Data, when it can feed torch too); None where the data gives no such item (a Ray-only source, an
    iterable dataset, items that are not pairs)."""

    import torch

    if cfg.data is None or cfg.model is None:  # a loop that builds its own: nothing to match here
        return None
    source = data_source(cfg)
    loaders = type(source).loaders if source is not None else (cfg.data.loader,)
    if "torch" not in loaders:
        return None
    ctx = dataclasses.replace(data_context(cfg), loader="torch")
    try:
        produced = source.datasets(ctx) if source is not None else components.instantiate(cfg.data.component, ctx=ctx)
        train = produced.get("train") if isinstance(produced, dict) else None
        if not (hasattr(train, "__getitem__") and hasattr(train, "__len__")) or len(train) == 0:
            return None
        item = train[0]
    except DataUnavailable as err:
        raise LaunchError(str(err)) from None
    except Exception as err:
        _keep_traceback(err)
        raise ConfigError(f"{cfg.source}: data: {cfg.data.path} failed while its first training sample was read: "
                          f"{err.__class__.__name__}: {err}{components.innermost_site(err)}. Fix: the error is in the "
                          f"data component or its arguments.") from None
    if not isinstance(item, (tuple, list)) or len(item) != 2:
        return None
    try:
        return torch.as_tensor(item[0]), torch.as_tensor(item[1])
    except (TypeError, ValueError, RuntimeError):
        return None  # not tensors (text before its collate): the loop's own collate decides


def check_model_fits_data(cfg: RunConfig) -> None:
    """One batch shaped like the training data through the model and the loss on torch's meta device (no memory, no
    compute): a model that does not fit the data (`model.in_features: 3` on one input feature) fails here, once,
    naming both sections, instead of at the first step of every worker and then through every restart."""
    import torch

    pair = _sample_pair(cfg)
    if pair is None:
        return
    x, y = (torch.empty((2, *t.shape), dtype=t.dtype, device="meta") for t in pair)
    with torch.device("meta"):
        model = build_model(cfg)
    stage, shapes = "model", f"inputs shaped {tuple(x.shape)} ({x.dtype})"
    try:
        out = model(x)
        if isinstance(out, torch.Tensor):
            stage, shapes = "loss", f"the model's output {tuple(out.shape)} against targets {tuple(y.shape)} ({y.dtype})"
            with warnings.catch_warnings():
                # torch only warns when mse/l1 broadcast an output against targets of another shape: wrong, not slow
                warnings.simplefilter("error", UserWarning)
                build_loss(cfg)(out, y)
    except ConfigError:
        raise
    except Exception as err:
        if _meta_limit(err):
            return
        _keep_traceback(err)
        what = (f"model {cfg.model.path}({_kwargs(cfg.model.kwargs)}) cannot take a batch of {cfg.data.path}'s"
                if stage == "model" else f"train.loss {cfg.loss.path} cannot compare")
        message = " ".join(str(err).split()).rstrip(".") or err.__class__.__name__
        fix = ("make the model section fit the data (its input size or channels)" if stage == "model" else
               "make the model's output fit the targets (out_features, num_classes), or choose a loss for them")
        raise ConfigError(f"{cfg.source}: {what} {shapes}: {err.__class__.__name__}: {message}. Fix: {fix}.") from None


def check_tracking_destination(cfg: RunConfig) -> None:
    """MLflow with no URI (run.tracking.mlflow.uri, MLFLOW_TRACKING_URI) would write ./mlflow.db wherever the driver
    runs: lost with a pod, another per attempt. Refused with the fix (an object-store run directory cannot hold
    MLflow's SQLite file, and a user who names MLflow expects their own store)."""
    mlflow = cfg.run.tracking.mlflow if cfg.run.tracking is not None else None
    if mlflow is None or mlflow.uri or os.environ.get("MLFLOW_TRACKING_URI"):
        return
    raise UsageError(f"run.tracking.mlflow has no uri and MLFLOW_TRACKING_URI is not set, so MLflow would write "
                     f"./mlflow.db in the directory the driver runs in ({os.getcwd()}), where a pod's copy is lost "
                     f"and the next attempt starts another. Fix: set run.tracking.mlflow.uri to your tracking server "
                     f"(e.g. http://mlflow.mlflow:5000) or a store of your choosing (e.g. sqlite:////abs/path/"
                     f"mlflow.db), or set MLFLOW_TRACKING_URI in the environment of the process that trains.")


def check_local_gpu(cfg: RunConfig) -> None:
    """`raytrain local` trains in this process: scaling.use_gpu without a CUDA device here would train on the CPU
    without a word. (`raytrain run` asks the cluster for GPUs instead: sizing refuses a cluster without them.)"""
    import torch

    if cfg.scaling.use_gpu and not torch.cuda.is_available():
        raise ConfigError(f"{cfg.source}: scaling.use_gpu is true, but torch finds no CUDA device on this machine "
                          f"(torch {torch.__version__}, built for CUDA {torch.version.cuda or 'none'}). Fix: set "
                          f"scaling.use_gpu=false to train on the CPU, or run where a GPU is.")


def take_lease(cfg: RunConfig, ttl_s: float, *, wait: bool, notify: Callable[[str], None],
               on_lost: Optional[Callable[[str], None]] = None) -> RunControl:
    """The first thing a start (`raytrain run`'s attempt, `raytrain local`) does: check the storage, then hold the
    run directory's lease in the process's run control (raytrain.rundir.runcontrol) before anything in it is read or
    written."""
    check_storage(cfg.run.storage_path, cfg.run.name)
    run_dir = runrecords.run_dir_of(cfg.run.storage_path, cfg.run.name)
    storage.makedirs(run_dir)
    return RunControl.acquire(run_dir, ttl_s, wait=wait, notify=notify, on_lost=on_lost)


def check_resume(cfg: RunConfig, records: runrecords.Records) -> resume.ResumePlan:
    """What this start resumes from, decided before Ray starts: a change the loop declares fixed (the model's
    shape, the optimizer) is refused with one paragraph (ResumeRefused); settings the loop hands to raytrain are
    announced (the session sets them into the restored optimizer); checkpoints that exist but none of which loads
    refuse the start. Staging directories never committed are deleted (only while holding the run's lease). What
    it skips or removes is said on the console and recorded in events.jsonl, and so are metrics rows that the
    restored position says should exist but are gone."""
    run_dir = records.run_dir

    def warn(message: str) -> None:
        console.warning(message)
        records.append_event("warning", message=message)

    checkpointer = checkpoints.FileCheckpointer(run_dir, records.control, keep=cfg.run.keep_checkpoints)

    plan = resume.plan(run_dir, cfg.to_dict(), warn, resume.resume_rules(cfg), checkpointer)
    if plan.checkpoint is not None and checkpoints.kind_of(plan.checkpoint) != cfg.checkpointer:
        written = checkpoints.kind_of(plan.checkpoint)
        raise resume.ResumeRefused(
            f"run {run_dir.name} resumes from {plan.checkpoint.name}, a {written} checkpoint, but this config writes "
            f"{cfg.checkpointer} ones (run.checkpointer: {cfg.run.checkpointer}, scaling.strategy: "
            f"{cfg.scaling.strategy}), which cannot load it. Fix: resume with --set run.checkpointer={written}, or "
            f"train the new setup under another --name.")
    lost = resume.missing_rows(run_dir, plan.epoch) if plan.checkpoint is not None else []
    if lost:
        warn(f"{run_dir / layout.METRICS_FILE} lacks the rows of epoch(s) {_ranges(lost)}, which the checkpoint "
             f"{plan.checkpoint.name} says were trained: the file was truncated or deleted. Training resumes after "
             f"epoch {plan.epoch}; those rows are not recovered (the checkpoint holds no metrics).")
    # Rows past the checkpoint this start resumes from will be trained again (all of them when it starts over).
    records.truncate_metrics(plan.epoch, plan.step)
    for key, (old, new) in plan.applied.items():
        console.info("resume_applies", f"resume applies {key}={new} (the checkpoint trained with {old})",
                     key=key, checkpoint_value=old, value=new)
    return plan


def _ranges(numbers: list[int]) -> str:
    """[1, 2, 3, 5] -> '1-3, 5'."""
    spans: list[list[int]] = []
    for number in numbers:
        if spans and number == spans[-1][1] + 1:
            spans[-1][1] = number
        else:
            spans.append([number, number])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def _kwargs(kwargs: dict) -> str:
    text = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
    return text if len(text) < 200 else text[:197] + "..."


def start_run(cfg: RunConfig, records: runrecords.Records, failure_record: Callable[[Path, str], dict]) -> None:
    """The start every run shares after its lease and resume check, in this order: the model builds (before
    anything more is written), the resolved config.yaml, then the data prepared once; missing data records
    `failure_record(run_dir, message)` as result.json."""
    check_model_builds(cfg)
    records.write_config(dump_yaml(cfg))
    try:
        prepare_data(cfg)
        check_model_fits_data(cfg)
    except (LaunchError, ConfigError) as err:
        records.write_result(failure_record(records.run_dir, str(err)))
        raise


def prepare_data(cfg: RunConfig) -> None:
    """The data source's prepare hook, once, in the driver (downloads under a file lock): missing data fails here
    with the message saying how to provide it."""

    source = data_source(cfg)
    if source is None:
        return
    try:
        source.prepare(data_context(cfg))
    except DataUnavailable as err:
        raise LaunchError(str(err)) from None


def driver_datasets(cfg: RunConfig) -> Optional[dict]:
    """For `data.loader: ray`: the Ray Datasets, built in the driver and sharded by Ray Train."""
    if cfg.data is None or cfg.data.loader != "ray":
        return None

    try:
        return call_data_component(cfg, data_context(cfg))
    except DataUnavailable as err:
        raise LaunchError(str(err)) from None


# A working_dir Ray ships is zipped whole into its GCS (at most its gRPC message size, 512 MiB) and unpacked on every
# node: bound what raytrain measures well below where it would take the machine's disk or memory with it, and the
# walk's time with it (a home directory's caches hold hundreds of thousands of files).
SHIP_LIMIT_BYTES = 512 * 1024 * 1024
SHIP_LIMIT_FILES = 50_000


class _TooBig(Exception):
    pass


def in_environment(path: Path) -> bool:
    """Whether `path` lies in an installed Python environment (a venv of any name, a conda environment or
    installation, site-packages) or is raytrain's own package (which the workers' image installs): a component
    found there is not the user's code, and never a reason to ship a directory."""

    path = path.resolve()
    ours = Path(__file__).resolve().parent
    # The library folders themselves, not sys.prefix: a Python installed with --prefix=$HOME would make every
    # project in the home directory an "environment".
    roots = {Path(p).resolve() for p in (sysconfig.get_paths().get(k) for k in ("purelib", "platlib", "stdlib")) if p}
    if any(r == path or r in path.parents for r in (ours, *roots)):
        return True
    return any(_is_environment(parent) for parent in path.parents)


def _is_environment(directory: Path) -> bool:
    """A Python environment's root (pyvenv.cfg: any venv or virtualenv; conda-meta: a conda environment or
    installation) or its packages folder."""
    return (directory.name in ("site-packages", "dist-packages") or (directory / "pyvenv.cfg").is_file()
            or (directory / "conda-meta").is_dir())


def _is_ray_temp(directory: Path) -> bool:
    """Ray's temporary directory (its sessions, logs, sockets and the packages it unpacks), wherever it is."""

    default = Path(os.environ.get("RAY_TMPDIR") or tempfile.gettempdir()) / "ray"
    return (directory / "session_latest").exists() or directory == default


def user_code_dir(cfg: RunConfig) -> Optional[Path]:
    """The working directory, if any component of the config was imported from it (the code workers need) and not
    from an installed environment inside it."""
    directory = workdir.current()
    if directory is None:
        return None
    for component in cfg.components():
        module = components.module_file(component.path)
        if module is not None and directory in module.parents and not in_environment(module):
            return directory
    return None


def ship_plan(directory: Path, limit_bytes: int = SHIP_LIMIT_BYTES,
              limit_files: int = SHIP_LIMIT_FILES) -> list[str]:
    """The excludes with which `directory` ships as a runtime env's working_dir: SHIP_EXCLUDES, and every Python
    environment or Ray temporary directory found under it (anchored, so a folder of the same name elsewhere still
    ships). Measured as Ray will walk it (.gitignore and .rayignore honoured); one paragraph (ConfigError) when what
    remains exceeds `limit_bytes` or `limit_files`, found without walking further than the bound."""

    found: list[str] = []
    total = {"bytes": 0, "files": 0}

    def skip(path: Path) -> bool:
        if path != directory and path.is_dir() and not path.is_symlink() and (
                _is_environment(path) or _is_ray_temp(path)):
            found.append("/" + path.relative_to(directory).as_posix())
            return True
        return False

    def visit(path: Path) -> None:
        if path.is_symlink() or not path.is_file():
            return
        total["files"] += 1
        total["bytes"] += path.stat().st_size
        if total["bytes"] > limit_bytes or total["files"] > limit_files:
            raise _TooBig

    try:
        walk_working_dir(directory, list(SHIP_EXCLUDES), skip, visit)
    except _TooBig:
        raise ConfigError(
            f"raytrain would ship {directory} to the cluster as your code (a component of the config is imported "
            f"from it), but it holds more than {_size(limit_bytes)} or {limit_files} files ({_size(total['bytes'])} "
            f"in {total['files']} files before raytrain stopped counting): that is data, caches or environments, "
            f"not code. Fix: run from your project's directory or give it with --working-dir DIR, or leave the large "
            f"paths out with a .rayignore (or .gitignore) file in {directory}.") from None
    except OSError as err:
        raise ConfigError(f"raytrain cannot read {directory} to ship it to the cluster as your code: {err}. Fix: "
                          f"give your project's directory with --working-dir DIR.") from None
    return [*SHIP_EXCLUDES, *found]


def _size(count: int) -> str:
    return f"{count / 2**20:.0f} MiB" if count < 2**30 else f"{count / 2**30:.1f} GiB"


def runtime_env(cfg: RunConfig, embedded: bool, in_submitted_job: bool) -> dict:
    """How the user's code reaches the workers. An embedded Ray's workers inherit the driver's PYTHONPATH (set by
    the launcher); a submitted Ray job brings its own runtime env (`ray job submit --working-dir`, a RayJob's
    runtimeEnvYAML); a driver joining a cluster from outside ships the working directory, without the environments
    and Ray temporary directories in it, within ship_plan's bound."""
    directory = user_code_dir(cfg)
    if directory is None or embedded or in_submitted_job:
        return {}
    return {"working_dir": str(directory), "excludes": ship_plan(directory)}
