"""`raytrain.Session`: what a per-worker training loop gets from raytrain, the built-in loop and a user's own alike.

A loop is any function `def my_loop(session: raytrain.Session, **its_own_kwargs)` named by the run config's
`loop._component_`. It runs on every Ray Train worker (or once, in `raytrain local`), builds what it wants, and
leaves the run contract to the session:

    def train_func(session, warmup_epochs: int = 0):
        model = session.prepare_model(MyNet())                  # DDP on Ray Train; .to(device) locally
        optimizer = torch.optim.SGD(model.parameters(), lr=session.config.train.lr)
        start = session.restore(model, optimizer)               # first epoch to train: 1, or after the newest
        for epoch in range(start, session.config.train.epochs + 1):   # checkpoint that loads
            for x, y in session.batches("train", epoch):        # this worker's shard, global batch split
                ...
            session.report(epoch, {"train_loss": loss}, model=model, optimizer=optimizer)

`report` is called by every worker once per epoch: rank 0 appends the metrics row (each epoch once, also across
resumes) and, when the epoch is due (`run.checkpoint_every`, and the last epoch), every worker joins the checkpoint:
rank 0 writes state.pt + meta.json (sha256) atomically. `restore` loads the newest checkpoint that loads (a damaged
one is skipped with a warning), sets this run's train.lr/weight_decay/momentum into the restored optimizer (the
driver refused, before Ray started, a resume that changes the model: raytrain.resume) and drops metrics rows past
it. Extra objects with state_dict()/load_state_dict() (an LR scheduler, a GradScaler, the epoch's running sums) are
saved and restored by keyword: `restore(..., scheduler=s)`, `report(..., scheduler=s)`. Rank-0 work is named:
`session.is_rank_zero`.

Step boundaries: the iterator of `batches("train", epoch)` sees one each time the loop asks for the next batch (the
step before it is done). There the session takes mid-epoch checkpoints (`run.checkpoint_every_steps`,
`run.checkpoint_every_s`) of the objects given to restore(), and ends the attempt gracefully when its driver got
SIGTERM or Ctrl-C (checkpoint, then StopTraining, which the worker's entry catches): raytrain.preemption decides,
the same step on every worker. A resume from a mid-epoch checkpoint starts at the exact next batch: that epoch's
iterator skips the batches already trained (the sampler's order comes from the seed and the epoch; with Ray Data
ingest the same number of batches is skipped, not necessarily the same samples). The iterator also stops the epoch
at `train.max_steps_per_epoch`. A loop that does not iterate `session.batches("train", epoch)` gets epoch
checkpoints only, and a stop request ends it at its next report.

Every commit (metrics row, event, checkpoint) first checks the run's fence (raytrain.runs.fence_writes): a worker of
an attempt whose lease was taken over commits nothing.

torch is imported when a session is made, not when this module is imported.
"""

from __future__ import annotations

import math
import tempfile
import time
import typing
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

from raytrain import checkpoints, components, runs
from raytrain.config import RunConfig, config_from_dict
from raytrain.data import DataContext, DataSource, data_context
from raytrain.errors import ConfigError
from raytrain.resume import apply_optimizer_settings, optimizer_changes
from raytrain.telemetry import RunTelemetry

if TYPE_CHECKING:
    import torch
    from torch import nn


class Session(ABC):
    """The run contract around a training loop. Subclasses: RayTrainSession (a Ray Train worker), LocalSession."""

    def __init__(self, config: RunConfig, run_dir: Path):
        self.config = config
        self.run_dir = Path(run_dir)
        self.resumed_from_epoch: Optional[int] = None
        self._datasets: Optional[dict] = None
        self._loaders: dict[Any, Any] = {}
        # This worker's own training samples (from batches("train")) and time since the last report: telemetry.
        self._epoch_samples = 0
        self._epoch_began = time.perf_counter()
        # What restore() was given (saved by mid-epoch checkpoints) and where the newest checkpoint left an epoch.
        self._tracked: Optional[tuple[Any, Any, dict]] = None
        self._resume_step = 0
        self._boundary: Any = None  # raytrain.preemption.StepBoundary, made by restore()

    # ------------------------------------------------------------------------------------------ who and where

    rank: int = 0
    world_size: int = 1

    @property
    def is_rank_zero(self) -> bool:
        return self.rank == 0

    @property
    @abstractmethod
    def device(self) -> "torch.device": ...

    # ------------------------------------------------------------------------------------------ model and data

    def build_model(self) -> "nn.Module":
        """The config's model component, built as a plain module (not yet on the device or wrapped)."""
        return build_model(self.config)

    @abstractmethod
    def prepare_model(self, model: "nn.Module") -> "nn.Module":
        """Move to the device and wrap for data parallelism where there are several workers."""

    @property
    def loss_fn(self) -> Callable:
        return build_loss(self.config)

    def datasets(self) -> dict:
        """The data component's {"train": ..., "val": ...} for this worker (map-style datasets; Ray Data shards on
        the Ray path)."""
        if self._datasets is None:
            self._datasets = self._load_datasets()
        return self._datasets

    def _load_datasets(self) -> dict:
        return call_data_component(self.config, data_context(self.config))

    def batches(self, source: Any = "train", epoch: int = 0) -> Optional[Iterator[tuple["torch.Tensor", "torch.Tensor"]]]:
        """(x, y) batches for this worker, on its device: of the config's data split `source` ("train" or "val"; None
        if there is no such split), or of a map-style dataset or DataLoader the loop built itself. Each worker gets
        its shard, `per_worker_batch_size` per batch; training data is reshuffled per epoch, the same order on every
        worker."""
        if isinstance(source, str):
            dataset = self.datasets().get(source)
            if dataset is None:
                return None
            if self._is_ray_dataset(dataset):
                iterator = dataset.iter_torch_batches(batch_size=self.config.per_worker_batch_size,
                                                      local_shuffle_buffer_size=None)
                return self._on_device(source, epoch, iterator)
            key: Any = source
            shuffle = source == "train"
        else:
            dataset, key, shuffle = source, id(source), True
        if key not in self._loaders:
            self._loaders[key] = dataset if _is_loader(dataset) else self.data_loader(dataset, shuffle=shuffle)
        loader = self._loaders[key]
        sampler = getattr(loader, "sampler", None)
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)  # a different shuffle each epoch, the same on every worker
        elif getattr(loader, "generator", None) is not None:
            loader.generator.manual_seed(self.config.train.seed + epoch)
        return self._on_device(source, epoch, iter(loader))

    def _on_device(self, source: Any, epoch: int, batches: Iterator) -> Iterator:
        if source != "train":
            return (_xy(batch, self.device) for batch in batches)
        return self._train_steps(batches, epoch)

    def _train_steps(self, batches: Iterator, epoch: int) -> Iterator:
        """An epoch's training batches: the ones a mid-epoch checkpoint already trained skipped (loaded, not moved
        or trained), at most train.max_steps_per_epoch, and a step boundary each time the loop asks for the batch
        after one it trained (the last one included: every worker has the same number of batches)."""
        skip = self._resume_step if epoch == (self.resumed_from_epoch or 0) + 1 else 0
        limit = self.config.train.max_steps_per_epoch
        step = 0
        for batch in batches:
            step += 1
            if step <= skip:
                continue
            x, y = _xy(batch, self.device)
            self._epoch_samples += len(y)
            yield x, y
            self._step_done(epoch, step)
            if limit and step >= limit:
                return

    def _step_done(self, epoch: int, step: int) -> None:
        """The loop finished `step` of `epoch` and asks for the next batch: checkpoint and/or stop if decided."""
        if self._boundary is None or self._tracked is None:
            return
        decision = self._boundary.decide()
        if decision.lost:
            raise StopTraining(self._boundary.reason or "the run's lease was lost")
        if decision.checkpoint:
            model, optimizer, stateful = self._tracked
            self._checkpoint(epoch - 1, {"epoch": epoch - 1, "step": step}, model, optimizer, stateful, step=step)
            self._boundary.checkpointed()
            self._checkpointed()
        if decision.stop:
            raise StopTraining(self._boundary.reason or "stop requested")
        if decision.drain:
            self._end_for_drain()

    def _end_for_drain(self) -> typing.NoReturn:
        from raytrain.drain import DRAIN_MESSAGE, NodeDraining

        if self.is_rank_zero:
            runs.append_event(self.run_dir, "drain", message=DRAIN_MESSAGE)
        raise NodeDraining(DRAIN_MESSAGE)

    @abstractmethod
    def data_loader(self, dataset: Any, *, shuffle: bool = False, batch_size: Optional[int] = None) -> Any:
        """A DataLoader over a map-style dataset, sharded for this worker (DistributedSampler on Ray Train)."""

    @staticmethod
    def _is_ray_dataset(dataset: Any) -> bool:
        return hasattr(dataset, "iter_torch_batches")

    # ------------------------------------------------------------------------------------------ reduce

    def all_reduce(self, values: list[float], op: str = "sum") -> list[float]:
        """`values` summed (or max'ed) over all workers; the same list back on a single process."""
        return list(values)

    # ------------------------------------------------------------------------------------------ the contract

    def checkpoint_due(self, epoch: int) -> bool:
        return epoch % self.config.run.checkpoint_every == 0 or epoch == self.config.train.epochs

    def restore(self, model: "nn.Module", optimizer: Any = None, **stateful: Any) -> int:
        """Load the newest checkpoint that loads into model/optimizer/stateful objects; returns the first epoch to
        train (1 when there is none). Metrics rows past the restored epoch are dropped: they will be trained again."""
        warn = (lambda msg: runs.append_event(self.run_dir, "warning", message=msg)) if self.is_rank_zero \
            else (lambda msg: None)
        found = checkpoints.load_newest(checkpoints.candidates(self.run_dir, self._latest_checkpoints()), warn)
        applied: dict = {}
        if found is not None:
            path, state = found
            unwrap(model).load_state_dict(state["model"])
            if optimizer is not None and state.get("optimizer") is not None:
                optimizer.load_state_dict(state["optimizer"])
            for name, obj in stateful.items():
                if name in state.get("extra", {}):
                    obj.load_state_dict(state["extra"][name])
            if optimizer is not None and state.get("optimizer") is not None:
                # The restored optimizer carries the checkpoint's settings: what this run's config changed trains now.
                applied = optimizer_changes(state.get("config") or {}, self.config.to_dict())
                apply_optimizer_settings(optimizer, applied)
            self.resumed_from_epoch = int(state["epoch"])
            self._resume_step = int(state.get("step") or 0)
        start = (self.resumed_from_epoch or 0) + 1
        if self.is_rank_zero:
            if found is not None:
                runs.append_event(self.run_dir, "restored", checkpoint=found[0].name, epoch=self.resumed_from_epoch,
                                  step=self._resume_step, applied={k: new for k, (_, new) in applied.items()})
                runs.truncate_metrics(self.run_dir, self.resumed_from_epoch)
            runs.append_event(self.run_dir, "start", start_epoch=start, resumed_from_epoch=self.resumed_from_epoch,
                              resumed_at_step=self._resume_step, world_size=self.world_size)
        self._tracked = (model, optimizer, stateful)
        self._boundary = self._step_boundary()
        self._started(start)
        self._epoch_samples, self._epoch_began = 0, time.perf_counter()
        return start

    def report(self, epoch: int, metrics: Mapping[str, Any], *, model: "nn.Module", optimizer: Any = None,
               **stateful: Any) -> None:
        """Every worker, once per epoch: rank 0 appends the metrics row; a checkpoint when the epoch is due."""
        row = {"epoch": int(epoch), **{k: _plain_number(v) for k, v in metrics.items()},
               "resumed_from_epoch": self.resumed_from_epoch}
        if self.is_rank_zero:
            # The row goes first: if the checkpoint below never lands, resume drops this row and retrains.
            runs.append_metrics(self.run_dir, row)
        self._epoch_done(row, self._epoch_samples, time.perf_counter() - self._epoch_began)
        if self.checkpoint_due(epoch):
            self._checkpoint(epoch, row, model, optimizer, stateful)
            if self._boundary is not None:
                self._boundary.checkpointed()
            self._checkpointed()
        self._epoch_samples, self._epoch_began = 0, time.perf_counter()
        if self._boundary is not None and epoch < self.config.train.epochs:
            # Also at every epoch's end: a loop that does not iterate session.batches("train") ends here.
            decision = self._boundary.decide(at_epoch_end=True)
            if (decision.stop or decision.drain) and not decision.lost and not self.checkpoint_due(epoch):
                self._checkpoint(epoch, row, model, optimizer, stateful)
            if decision.stop or decision.lost:
                raise StopTraining(self._boundary.reason or "stop requested")
            if decision.drain:
                self._end_for_drain()

    # Telemetry hooks (a Ray Train worker exports live metrics; a local run has nowhere to send them).
    def _started(self, start_epoch: int) -> None: ...

    def _epoch_done(self, row: dict, local_samples: int, local_seconds: float) -> None: ...

    def _checkpointed(self) -> None: ...

    def _step_boundary(self) -> Any:
        """Where mid-epoch checkpoints and stop requests are decided (None: neither)."""
        from raytrain.preemption import StepBoundary

        return StepBoundary(self.run_dir, self._lease_token, every_steps=self.config.run.checkpoint_every_steps,
                            every_s=self.config.run.checkpoint_every_s, is_rank_zero=self.is_rank_zero,
                            device=self.device, node_draining=self._node_draining)

    # Whether this worker's node is being drained (its pod deleted): None where there is no such thing (local).
    _node_draining: Optional[Callable[[], bool]] = None

    _lease_token: Optional[int] = None  # the attempt this worker trains for (None: no lease, no stop requests)
    _telemetry_linger = False  # a joined cluster, whose Prometheus scrapes the workers' metrics

    def _state(self, epoch: int, model: "nn.Module", optimizer: Any, stateful: dict, step: int = 0) -> dict:
        return {"model_state": unwrap(model).state_dict(),
                "optimizer_state": optimizer.state_dict() if optimizer is not None else None,
                "epoch": epoch, "config": self.config.to_dict(),
                "extra": {name: obj.state_dict() for name, obj in stateful.items()},
                "step": step, "attempt": runs.check_fence(self.run_dir)}

    @abstractmethod
    def _checkpoint(self, epoch: int, row: dict, model: "nn.Module", optimizer: Any, stateful: dict,
                    step: int = 0) -> None:
        """Every worker at the same step; epoch: the last completed one, step > 0: batches into the next."""

    def _latest_checkpoints(self) -> list[Path]:
        return []


class StopTraining(BaseException):
    """Raised out of session.batches()/report() when the attempt must end (its driver was stopped, its lease taken
    over) after the session checkpointed what it could. A BaseException, like KeyboardInterrupt, so that a loop's
    `except Exception` does not swallow it; the worker's entry catches it and returns."""


# ----------------------------------------------------------------------------------------------------------
# building the config's components (the built-in loop, local runs and the driver's checks share these)


def build_model(cfg: RunConfig) -> "nn.Module":
    from torch import nn

    model = components.instantiate(cfg.model)
    if not isinstance(model, nn.Module):
        raise ConfigError(f"{cfg.source}: model._component_: {cfg.model.path} returned {type(model).__name__}, not a "
                          f"torch.nn.Module. Fix: name a callable (class or function) that returns the model.")
    return model


def build_loss(cfg: RunConfig) -> Callable:
    import functools
    import inspect

    loss = cfg.loss
    if inspect.isclass(loss.target):
        return components.instantiate(loss)
    return functools.partial(loss.target, **loss.kwargs) if loss.kwargs else loss.target


def data_source(cfg: RunConfig) -> Optional[DataSource]:
    """The DataSource instance of a class-based data component (None for a plain function)."""
    target = cfg.data.component.target
    if isinstance(target, type) and issubclass(target, DataSource):
        return components.instantiate(cfg.data.component)
    return None


def call_data_component(cfg: RunConfig, ctx: DataContext) -> dict:
    """The data component's datasets as {"train": ..., "val": ...}, checked."""
    source = data_source(cfg)
    produced = source.datasets(ctx) if source is not None else components.instantiate(cfg.data.component, ctx=ctx)
    where = f"{cfg.source}: data._component_: {cfg.data.path}"
    if not isinstance(produced, Mapping) or "train" not in produced:
        raise ConfigError(f"{where} returned {type(produced).__name__}, not a mapping with a 'train' dataset. Fix: "
                          f"return {{'train': train_dataset, 'val': val_dataset}} ('val' optional).")
    unknown = [key for key in produced if key not in ("train", "val")]
    if unknown:
        raise ConfigError(f"{where} returned unknown split(s) {', '.join(map(repr, unknown))}. Fix: return only "
                          f"'train' and 'val'.")
    for split, dataset in produced.items():
        if dataset is None:
            continue
        if ctx.loader == "ray":
            import ray.data

            if not isinstance(dataset, ray.data.Dataset):
                raise ConfigError(f"{where}: data.loader is ray but '{split}' is a {type(dataset).__name__}. Fix: "
                                  f"return Ray Datasets with columns x and y, or set data.loader: torch.")
        elif not (hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")):
            raise ConfigError(f"{where}: '{split}' is a {type(dataset).__name__}, not a map-style dataset (with "
                              f"__getitem__ and __len__) of (input, target) pairs. Fix: return torch Datasets, or set "
                              f"data.loader: ray and return Ray Datasets.")
    return {split: dataset for split, dataset in produced.items() if dataset is not None}


def unwrap(model: "nn.Module") -> "nn.Module":
    return model.module if hasattr(model, "module") else model


def _plain_number(value: Any) -> Any:
    """Tensors and numpy scalars as plain numbers, so that metrics rows are JSON."""
    if hasattr(value, "item") and callable(value.item):
        try:
            value = value.item()
        except (TypeError, ValueError, RuntimeError):
            return value
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else value
    return value


def _is_loader(obj: Any) -> bool:
    from torch.utils.data import DataLoader

    return isinstance(obj, DataLoader)


def _xy(batch: Any, device: "torch.device") -> tuple["torch.Tensor", "torch.Tensor"]:
    x, y = (batch["x"], batch["y"]) if isinstance(batch, dict) else batch  # Ray Data: columns x and y
    return x.to(device, non_blocking=True), y.to(device, non_blocking=True)


def torch_threads(cfg: RunConfig, cpus_per_worker: float) -> int:
    return cfg.train.torch_threads or max(1, int(cpus_per_worker))


# ----------------------------------------------------------------------------------------------------------
# a Ray Train worker


class RayTrainSession(Session):
    def __init__(self, config: RunConfig, run_dir: Path, cpus_per_worker: float, lease_token: Optional[int] = None):
        import ray.train
        import ray.train.torch
        import torch

        super().__init__(config, run_dir)
        if lease_token:  # this worker's commits stop once its attempt's lease is taken over
            from raytrain.lease import Fence

            runs.fence_writes(self.run_dir, Fence(self.run_dir, lease_token))
            self._lease_token = int(lease_token)
        context = ray.train.get_context()
        self.rank = context.get_world_rank()
        self.world_size = context.get_world_size()
        self.local_rank = context.get_local_rank()
        self._device = ray.train.torch.get_device()
        torch.set_num_threads(torch_threads(config, cpus_per_worker))
        torch.manual_seed(config.train.seed + self.rank)
        self.telemetry = RunTelemetry(config.run.name, self.rank, config.per_worker_batch_size)
        from raytrain.drain import node_draining

        self._node_draining = node_draining  # a deleted pod's preStop hook drains its node: see raytrain.drain

    def _started(self, start_epoch: int) -> None:
        self.telemetry.started(self.run_dir, start_epoch)

    def _epoch_done(self, row: dict, local_samples: int, local_seconds: float) -> None:
        self.telemetry.epoch_end(row, local_samples, local_seconds)

    def _checkpointed(self) -> None:
        self.telemetry.checkpointed()

    def finished(self) -> None:
        """The loop returned: on a cluster, rank 0 lingers until the last values were exported (telemetry)."""
        if self._telemetry_linger:
            self.telemetry.linger()

    @property
    def device(self) -> "torch.device":
        return self._device

    def prepare_model(self, model: "nn.Module") -> "nn.Module":
        import ray.train.torch

        return ray.train.torch.prepare_model(model)

    def _load_datasets(self) -> dict:
        if self.config.data.loader != "ray":
            return super()._load_datasets()
        import ray.train

        shards = {"train": ray.train.get_dataset_shard("train")}
        try:
            shards["val"] = ray.train.get_dataset_shard("val")
        except KeyError:  # the dataset has no validation split
            pass
        return shards

    def data_loader(self, dataset: Any, *, shuffle: bool = False, batch_size: Optional[int] = None) -> Any:
        import ray.train.torch
        from torch.utils.data import DataLoader

        return ray.train.torch.prepare_data_loader(
            DataLoader(dataset, batch_size=batch_size or self.config.per_worker_batch_size, shuffle=shuffle),
            move_to_device=False)

    def all_reduce(self, values: list[float], op: str = "sum") -> list[float]:
        import torch
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return list(values)
        tensor = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM)
        return tensor.tolist()

    def _latest_checkpoints(self) -> list[Path]:
        import ray.train

        latest = ray.train.get_checkpoint()
        return [Path(latest.path)] if latest is not None else []

    def _checkpoint(self, epoch: int, row: dict, model, optimizer, stateful: dict, step: int = 0) -> None:
        """ray.train.report is a barrier: every worker calls it at the same steps; rank 0 hands over the files."""
        import ray.train

        with tempfile.TemporaryDirectory(prefix="raytrain-ckpt-") as tmp:
            checkpoint = None
            if self.is_rank_zero:
                checkpoints.write_checkpoint(Path(tmp), **self._state(epoch, model, optimizer, stateful, step))
                runs.check_fence(self.run_dir)  # just before Ray publishes it into the run directory
                checkpoint = ray.train.Checkpoint.from_directory(tmp)
            ray.train.report(row, checkpoint=checkpoint,
                             checkpoint_dir_name=checkpoints.checkpoint_dir_name(epoch, step))


def worker_entry(loop_config: dict) -> None:
    """Ray Train's train_loop_per_worker: {"config": resolved run config, "run_dir", "cpus_per_worker",
    "working_dir"}. Builds the session and calls the config's loop component with it."""
    from raytrain import workdir

    quiet_report_logs()
    if loop_config.get("working_dir"):  # the same import path as the driver, where the directory is reachable
        try:
            workdir.use(loop_config["working_dir"])
        except workdir.WorkingDirError:
            pass  # another node: the code came with Ray's runtime env (working_dir) instead
    cfg = config_from_dict(loop_config["config"])
    session = RayTrainSession(cfg, Path(loop_config["run_dir"]), loop_config["cpus_per_worker"],
                              loop_config.get("lease_token"))
    session._telemetry_linger = bool(loop_config.get("telemetry_linger"))
    try:
        components.instantiate(cfg.loop, session)
    except StopTraining:
        return  # checkpointed (unless the lease was lost); the driver writes the result
    session.finished()


def quiet_report_logs() -> None:
    """Ray Train logs every report at INFO on each worker (from a logger named after its module file); the
    per-epoch lines that rank 0 writes already say the same, so keep the user's console readable."""
    import logging

    try:
        from ray.train.v2._internal.execution import context as train_context
    except ImportError:  # a Ray version that moved it: the lines are noise, not a failure
        return
    logging.getLogger(train_context.__file__).setLevel(logging.WARNING)


# ----------------------------------------------------------------------------------------------------------
# one plain process (raytrain local)


class LocalSession(Session):
    """The same contract in one process with no Ray: the whole global batch per step, checkpoints written straight
    into the run directory (the newest `run.keep_checkpoints` kept), so `raytrain local` resumes like `run`."""

    def __init__(self, config: RunConfig, run_dir: Path, cpus: int, on_row: Optional[Callable[[dict], None]] = None):
        import torch

        super().__init__(config, run_dir)
        self.on_row = on_row  # `raytrain local` prints each row as it is written
        self._device = torch.device("cuda" if config.scaling.use_gpu and torch.cuda.is_available() else "cpu")
        torch.set_num_threads(torch_threads(config, cpus))
        torch.manual_seed(config.train.seed)

    @property
    def device(self) -> "torch.device":
        return self._device

    def prepare_model(self, model: "nn.Module") -> "nn.Module":
        return model.to(self.device)

    def _load_datasets(self) -> dict:
        ctx = data_context(self.config)
        return call_data_component(self.config, DataContext(root=ctx.root, seed=ctx.seed, loader="torch"))

    def data_loader(self, dataset: Any, *, shuffle: bool = False, batch_size: Optional[int] = None) -> Any:
        import torch
        from torch.utils.data import DataLoader

        # One process sees the whole global batch, as the N workers together do.
        generator = torch.Generator().manual_seed(self.config.train.seed)
        return DataLoader(dataset, batch_size=batch_size or self.config.train.batch_size, shuffle=shuffle,
                          generator=generator)

    def report(self, epoch: int, metrics: Mapping[str, Any], *, model: "nn.Module", optimizer: Any = None,
               **stateful: Any) -> None:
        super().report(epoch, metrics, model=model, optimizer=optimizer, **stateful)
        if self.on_row is not None:
            self.on_row(runs.read_metrics(self.run_dir)[-1])

    def _checkpoint(self, epoch: int, row: dict, model, optimizer, stateful: dict, step: int = 0) -> None:
        directory = self.run_dir / checkpoints.checkpoint_dir_name(epoch, step)
        staging = self.run_dir / f".{directory.name}.tmp"
        checkpoints.write_checkpoint(staging, **self._state(epoch, model, optimizer, stateful, step))
        runs.check_fence(self.run_dir)
        staging.rename(directory)  # a checkpoint directory appears whole or not at all
        for old in checkpoints.candidates(self.run_dir)[self.config.run.keep_checkpoints:]:
            checkpoints.remove(old)
