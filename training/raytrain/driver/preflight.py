"""The checks of a run's config in the driver before Ray starts (shared by `raytrain run`, `local` and `tune`): the
model component builds on torch's meta device (and FSDP can shard it), one batch shaped like the training data goes
through the model and the loss (a small model's for real, on the CPU), MLflow has a destination, and `raytrain
local` has the GPU the config asks for.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import re
import traceback
import warnings

from raytrain.data import DataUnavailable, data_context
from raytrain.errors import ConfigError, LaunchError, UsageError
from raytrain.parallel import sharding
from raytrain.rundir import console
from raytrain.spec import components
from raytrain.spec.build import build_loss, build_model, data_source
from raytrain.spec.sections import RunConfig

# What torch says when the meta device cannot run an operation (no meta kernel, a value read out of a tensor that
# has none): a limit of the check, not the user's mistake. Anything else a constructor raises is the user's.
# check_model_fits_data runs a model this small (parameters and buffers) for real on the CPU, on samples of at most
# this many elements: an image up to 3x64x64; integer samples (token ids, whose attention grows with their square)
# up to 1024.
CPU_CHECK_MAX_BYTES = 32 * 2**20
CPU_CHECK_MAX_ELEMENTS = 3 * 64 * 64
CPU_CHECK_MAX_TOKENS = 1024
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
    try:
        with torch.device("meta"):
            model = build_model(cfg)
    except Exception:  # noqa: BLE001 - check_model_builds named a constructor's own error; the meta device's limits
        return  # (a constructor that reads a value, .item()) leave the check to the workers
    if _small(model, pair) and not torch.cuda.is_available() and _passes_on_cpu(cfg, pair):
        return  # (a GPU driver keeps the meta check: a constructor that calls .cuda() would take a device here)
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


def _small(model, pair) -> bool:
    """A model (built on the meta device) and a sample small enough to check with a real forward on the CPU
    (milliseconds). A lazy module's parameters have no size until its first forward: not small."""
    from torch.nn.parameter import is_lazy

    tensors = list(itertools.chain(model.parameters(), model.buffers()))
    if any(is_lazy(t) for t in tensors):
        return False
    x = pair[0]
    return (sum(t.numel() * t.element_size() for t in tensors) <= CPU_CHECK_MAX_BYTES
            and x.numel() <= (CPU_CHECK_MAX_ELEMENTS if x.is_floating_point() else CPU_CHECK_MAX_TOKENS)
            and pair[1].numel() <= CPU_CHECK_MAX_ELEMENTS)


def _passes_on_cpu(cfg: RunConfig, pair) -> bool:
    """The fit check with real tensors (zeros) on the CPU: True when the model and the loss take them. On the meta
    device torch runs its operations' Python decompositions, whose first use imports sympy and torch._dynamo (about
    1 s of the driver's start); a small model's real forward needs neither. False (anything raised, a value-dependent
    operation on zeros included) leaves the verdict and its message to the meta check."""
    import torch

    try:
        model = build_model(cfg)
        x, y = (torch.zeros((2, *t.shape), dtype=t.dtype) for t in pair)
        with warnings.catch_warnings():  # autograd on, as in training: an in-place change of a parameter fails
            warnings.simplefilter("error", UserWarning)  # as the meta check: a broadcasting mse/l1 is wrong
            out = model(x)
            if isinstance(out, torch.Tensor):
                build_loss(cfg)(out, y)
    except Exception:  # noqa: BLE001 - the meta check decides, and names what is wrong
        return False
    return True


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


def _kwargs(kwargs: dict) -> str:
    text = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
    return text if len(text) < 200 else text[:197] + "..."
