"""`raytrain.Session`: what a per-worker training loop gets from raytrain, the built-in loop and a user's own alike.

A loop is any function `def my_loop(session: raytrain.Session, **its_own_kwargs)` named by the run config's
`loop._component_`. It runs on every Ray Train worker (or once, in `raytrain local`), builds what it wants, and
leaves the run contract to the session:

    def train_func(session, warmup_epochs: int = 0):
        model = session.prepare_model(MyNet())                  # DDP on Ray Train; .to(device) locally
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        start = session.restore(model, optimizer)               # first epoch to train: 1, or after the newest
        for epoch in range(start, session.config.train.epochs + 1):   # checkpoint that loads
            for x, y in session.batches("train", epoch):        # this worker's shard, global batch split
                ...
            session.report(epoch, {"train_loss": loss}, model=model, optimizer=optimizer)

The session is made of three parts, one concern each:
- the data feed (raytrain.worker.datafeed): sharded batches, a per-epoch shuffle, a mid-epoch resume that starts the
  sampler at the next batch, bounded loader caches;
- the checkpointer (raytrain.checkpoint.checkpoints): save at a position, commit atomically and fenced, newest complete, load,
  prune;
- the step control (raytrain.worker.stepcontrol): at step boundaries, the synced decision to checkpoint mid-epoch, or to
  end the attempt (a stop request, a lost lease: raytrain.rundir.runcontrol) or the worker group (a draining node).
The entry (Ray Train's worker function, or `raytrain local`) calls `start()` before the loop: step boundaries,
graceful stops and drains work whether or not the loop ever restores.

`report` is called by every worker once per epoch: rank 0 appends the metrics row (each epoch once, also across
resumes) and, when the epoch is due (`run.checkpoint_every`, and the last epoch), saves a checkpoint. `restore`
loads the newest checkpoint that loads (a damaged one is skipped with a warning; on Ray Train rank 0 reads it once
and hands it to the others), drops metrics rows past it, and applies to the restored optimizer the settings the
loop declared (`applied_on_resume`, raytrain.checkpoint.resume): the built-in loop declares train.lr and friends; a loop that
declares nothing keeps its optimizer's own hyperparameters. Extra objects with state_dict()/load_state_dict() (an
LR scheduler, a GradScaler, running sums) are saved and restored by keyword. Rank-0 work is named:
`session.is_rank_zero`.

Step boundaries: the iterator of `batches("train", epoch)` sees one each time the loop asks for the next optimizer
step's batch (with train.grad_accum_steps > 1, after every that many micro-batches). A loop that does not iterate
`session.batches("train", epoch)` gets epoch checkpoints only, and a stop request ends it at its next report.
Whatever must end the attempt raises raytrain.lifecycle.endings.AttemptEnded out of batches() or report().

Every commit (metrics row, event, checkpoint) first passes the run's fence (the session's run control): a worker of
an attempt whose lease was taken over commits nothing. torch is imported when a session is made.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

from raytrain.checkpoint import checkpoints, resume
from raytrain.checkpoint.checkpoints import Position
from raytrain.data import data_context
from raytrain.errors import RaytrainError
from raytrain.lifecycle.endings import REACTIONS, AttemptEnded, Ending
from raytrain.parallel import sharding
from raytrain.rundir import runrecords, storage
from raytrain.rundir.runcontrol import UNFENCED, Control
from raytrain.spec import build
from raytrain.spec.sections import RunConfig
from raytrain.worker import elastic
from raytrain.worker.datafeed import DataFeed, to_device
from raytrain.worker.replica_steps import ReplicaSteps
from raytrain.worker.stepcontrol import StepControl

if TYPE_CHECKING:
    import torch
    from torch import nn

class Session(ReplicaSteps, ABC):
    """The run contract around a training loop. Subclasses: RayTrainSession (a Ray Train worker), LocalSession."""

    rank: int = 0
    world_size: int = 1
    local_batch_size: int  # this worker's share of the global batch per optimizer step

    def __init__(self, config: RunConfig, run_dir: Path, control: Control = UNFENCED):
        self.config = config
        self.began = time.time()  # this worker's process group is up: the worker group's start-up phase ends here
        self.run_dir = storage.as_path(run_dir)
        self.control = control
        self.records = runrecords.Records(self.run_dir, control)
        storage.remove_stale_scratch()  # what killed workers staged on this node before an upload (object storage)
        # The run config chooses (run.checkpointer): rank 0 writes one state.pt, or every worker its shards.
        self.sharded = config.checkpointer == "sharded"
        self.checkpointer: Any
        if self.sharded:
            from raytrain.checkpoint.sharded import ShardedCheckpointer

            self.checkpointer = ShardedCheckpointer(self.run_dir, control, keep=config.run.keep_checkpoints,
                                                    rank=self.rank, asynchronous=config.run.async_checkpoint)
        else:
            self.checkpointer = checkpoints.FileCheckpointer(self.run_dir, control, keep=config.run.keep_checkpoints)
        self.resumed_from_epoch: Optional[int] = None
        self._resume_step = 0
        self._datasets: Optional[dict] = None
        self._feed: Optional[DataFeed] = None
        # This worker's own training samples (from batches("train")) and time since the last report: telemetry.
        self._epoch_samples = 0
        self._epoch_began = time.perf_counter()
        # Seconds since the last metrics row spent waiting on the training loader, in validation and blocked in
        # checkpoint saves: the row's `timing`, which raytrain.rundir.goodput splits the run's time by.
        self._data_s = self._val_s = self._checkpoint_s = 0.0
        # A Ray Train function's first batch (time.time()), whose group start is recorded later, at its first report:
        # the start event carries it, where goodput's start-up ends (raytrain.worker.loadertiming)
        self.first_batch_at: Optional[float] = None
        # What restore() or report() was given: what a mid-epoch checkpoint saves.
        self._tracked: Optional[tuple[Any, Any, dict]] = None
        self._steps: Any = None  # raytrain.worker.stepcontrol.StepControl, made by start()
        self._announced = False
        self._rows_truncated = False  # this worker group dropped the rows past its start (raytrain_function's own)
        # scaling.fault_tolerance torchft: this worker's replica group (raytrain.worker.replicas), made by the Ray
        # Train session; None elsewhere (raytrain.worker.replica_steps holds the rest of the state)
        self.replicas = None

    # ------------------------------------------------------------------------------------------ who and where

    @property
    def is_rank_zero(self) -> bool:
        """Whether this worker does rank 0's work (writes the rows, events and checkpoints). Under torchft it is
        the first replica of the last quorum: while rank 0 is being replaced, a survivor writes them."""
        if getattr(self, "replicas", None) is not None:
            return self.replicas.writer
        return self.rank == 0

    @property
    @abstractmethod
    def device(self) -> "torch.device": ...

    def start(self) -> None:
        """Called by the entry before the loop runs: from here on the loop's training batches have step boundaries
        (mid-epoch checkpoints, graceful stops, drains), whether or not it calls restore()."""

        if self.is_rank_zero and self._resize_requested is not None:
            elastic.clear_finished(self.run_dir, self.records.token, self.control)
        if self._steps is None:
            # torchft: every replica polls for the attempt's end itself, and the flags travel in each step's buffer
            self._steps = StepControl(self.control, every_steps=self.config.run.checkpoint_every_steps,
                                      every_s=self.config.run.checkpoint_every_s,
                                      is_rank_zero=self.is_rank_zero or self.replicas is not None,
                                      device=self.device, node_draining=self._node_draining,
                                      resize_requested=self._resize_requested,
                                      share=self._ft_share if self.replicas is not None else None)

    def _announce(self) -> None:
        """Record this worker group's start once (rank 0): at restore(), or at the first batch or report of a loop
        that never restores."""
        if self._announced:
            return
        self._announced = True
        start = (self.resumed_from_epoch or 0) + 1
        if self.is_rank_zero and not self._rows_truncated:
            # Every worker-group start (a restart after a failure too) trains again from here: the rows past its
            # position go, all of them when it starts from nothing (the driver's truncation ran once per attempt).
            self._rows_truncated = True
            self.records.truncate_metrics(-1 if self.resumed_from_epoch is None else self.resumed_from_epoch,
                                          self._resume_step)
        if self.is_rank_zero:
            before = [e.get("world_size") for e in runrecords.read_events(self.run_dir) if e.get("event") == "start"]
            if before and isinstance(before[-1], int) and before[-1] != self.world_size:
                # An elastic run's resize (or a resubmission at another size): a mark in `raytrain report`.
                self.records.append_event("resize", previous=before[-1], workers=self.world_size,
                                          epoch=self.resumed_from_epoch or 0, step=self._resume_step)
            first_batch = {} if self.first_batch_at is None else {"first_batch": round(self.first_batch_at, 3)}
            self.records.append_event("start", start_epoch=start, resumed_from_epoch=self.resumed_from_epoch,
                                      resumed_at_step=self._resume_step, world_size=self.world_size,
                                      began=round(self.began, 3), attempt=self.records.token, **first_batch)
        self._started(start)
        self._epoch_samples, self._epoch_began = 0, time.perf_counter()

    def announce_failed_start(self) -> None:
        """A group whose loop raised before its first batch, restore or report still started: record it (the
        driver counts restarts by these events), unless the records cannot be written either."""
        if self._announced:
            return
        try:
            self._announce()
        except (OSError, AttemptEnded):  # the failure being raised is the one to report
            pass

    # ------------------------------------------------------------------------------------------ model and data

    def build_model(self) -> "nn.Module":
        """The config's model component, built as a plain module (not yet on the device or wrapped)."""
        return build.build_model(self.config)

    @abstractmethod
    def prepare_model(self, model: "nn.Module") -> "nn.Module":
        """Move to the device and wrap for data parallelism (scaling.strategy: DDP, or FSDP2's fully_shard), with
        scaling.activation_checkpointing applied."""

    @property
    def loss_fn(self) -> Callable:
        return build.build_loss(self.config)

    def datasets(self) -> dict:
        """The data component's {"train": ..., "val": ...} for this worker (map-style datasets; Ray Data shards on
        the Ray path)."""
        if self._datasets is None:
            self._datasets = self._load_datasets()
        return self._datasets

    def _load_datasets(self) -> dict:
        if self.config.data is None:
            return build.call_data_component(self.config, None)  # says the config has no data section
        return build.call_data_component(self.config, data_context(self.config))

    @property
    def feed(self) -> DataFeed:
        if self._feed is None:
            self._feed = DataFeed(rank=self.rank, world_size=self.world_size, seed=self.config.train.seed,
                                  batch_size=self.micro_batch_size)
        return self._feed

    @property
    def micro_batch_size(self) -> int:
        """The batch this worker's loader yields: its share of the global batch, split for gradient accumulation."""
        return self.local_batch_size // self.config.train.grad_accum_steps

    def data_loader(self, dataset: Any, *, shuffle: bool = False, batch_size: Optional[int] = None) -> Any:
        """A DataLoader over a map-style dataset, sharded for this worker (raytrain.worker.datafeed.ShardSampler)."""
        return self.feed.loader(dataset, shuffle=shuffle, batch_size=batch_size)

    def batches(self, source: Any = "train", epoch: int = 0) -> Optional[Iterator[tuple["torch.Tensor", "torch.Tensor"]]]:
        """(x, y) batches for this worker, on its device: of the config's data split `source` ("train" or "val"; None
        if there is no such split), or of a map-style dataset or DataLoader the loop built itself. Each worker gets
        its shard; training data is reshuffled per epoch, the same order on every worker."""
        resuming = source == "train" or not isinstance(source, str)
        skip = self._resume_step if resuming and epoch == (self.resumed_from_epoch or 0) + 1 else 0
        if isinstance(source, str):
            dataset = self.datasets().get(source)
            if dataset is None:
                return None
            if hasattr(dataset, "iter_torch_batches"):  # a Ray Data shard: the same count of batches is skipped
                iterator = dataset.iter_torch_batches(batch_size=self.micro_batch_size, local_shuffle_buffer_size=None)
                return self._on_device(source, epoch, iterator, skip)
            loader = self.feed.cached(source, dataset, shuffle=source == "train")
        else:
            loader = self.feed.cached(None, source, shuffle=True)
        iterator, replay = self.feed.epoch_batches(loader, epoch, skip if resuming else 0)
        return self._on_device(source, epoch, iterator, replay, first_step=skip if resuming else 0)

    def _on_device(self, source: Any, epoch: int, batches: Iterator, replay: int,
                   first_step: Optional[int] = None) -> Iterator:
        if source == "val":
            return self._val_batches(batches)
        if self.replicas is not None:
            return self._ft_train_steps(batches, epoch, replay, replay if first_step is None else first_step)
        return self._train_steps(batches, epoch, replay, replay if first_step is None else first_step)

    def _val_batches(self, batches: Iterator) -> Iterator:
        """Validation batches on the device; from the first batch asked for to the last, the loop evaluates: its
        seconds go to the next metrics row (goodput's evaluation)."""
        began = time.perf_counter()
        try:
            for batch in batches:
                yield to_device(batch, self.device)
        finally:
            self._val_s += time.perf_counter() - began

    def _kept_batches(self, batches: Iterator, replay: int, first: int) -> Iterator:
        """The loader's batches from micro-batch `first` on: `replay` batches the loader yields again are dropped (a
        loader raytrain cannot position), at most train.max_steps_per_epoch optimizer steps; the wait for each is
        the data time of goodput."""
        limit = self.config.train.max_steps_per_epoch * self.config.train.grad_accum_steps
        micro = first
        batches = iter(batches)
        index = -1
        while True:
            # Two clock reads a batch (well under a microsecond, docs/benchmarks.md): the data wait of goodput.
            waited = time.perf_counter()
            try:
                batch = next(batches)
            except StopIteration:
                return
            finally:
                self._data_s += time.perf_counter() - waited
            index += 1
            if index < replay:
                continue
            if limit and micro >= limit:
                return
            micro += 1
            yield batch

    def _train_steps(self, batches: Iterator, epoch: int, replay: int, first: int) -> Iterator:
        """An epoch's training batches (_kept_batches), numbered after the `first` already trained, with a step
        boundary after each optimizer step's last micro-batch."""
        self._announce()
        accum = self.config.train.grad_accum_steps
        micro = first
        for batch in self._kept_batches(batches, replay, first):
            micro += 1
            x, y = to_device(batch, self.device)
            self._epoch_samples += len(y)
            yield x, y
            if micro % accum == 0:
                self._step_done(epoch, micro)

    def _step_done(self, epoch: int, micro: int) -> None:
        """The loop finished an optimizer step (`micro` batches into `epoch`) and asks for the next batch."""
        if self._steps is None:
            return
        decision = self._steps.decide()
        if decision.ending is Ending.LEASE_LOST:
            raise AttemptEnded(Ending.LEASE_LOST, decision.reason)
        saved = decision.checkpoint and self._tracked is not None
        if saved:
            model, optimizer, stateful = self._tracked
            self._checkpoint(Position(epoch - 1, micro), model, optimizer, stateful)
        if decision.ending is not None:
            self._end(decision.ending, decision.reason, saved=saved)

    def _end(self, ending: Ending, reason: str, saved: bool = False) -> None:
        """End the group or attempt; `saved`: at a step whose checkpoint was just taken, which the next group
        resumes from."""
        reaction = REACTIONS[ending]
        self.wait_for_checkpoint()  # the checkpoint just taken commits before the attempt (or group) ends
        if saved and self.is_rank_zero:
            # What was trained since the last row is kept, not trained again: goodput's mark (a row's timing)
            self.records.append_event("progress_saved", timing=self._timing(), attempt=self.records.token)
        if reaction.event is not None and self.is_rank_zero:
            self.records.append_event(reaction.event, message=reason)
        if reaction.group == "holds":
            self.answer_resize(ending.value)  # the workers hold from here: raytrain.worker.elastic
        raise AttemptEnded(ending, reason)

    def answer_resize(self, ending: str) -> None:
        """Rank 0 answers an open resize request (raytrain.worker.elastic) when its group ends, however it ends, so that
        Ray Train's controller does not wait out its timeout. Once the loop has returned ("finished"), the answer
        stands for the requests still to come: the group lingers (telemetry) while Ray Train may decide a resize."""
        if not self.is_rank_zero or self._resize_requested is None:
            return
        if ending == elastic.FINISHED:
            try:
                elastic.answer(self.run_dir, elastic.FINISHED, self._newest_checkpoint(), ending,
                               attempt=self.records.token, control=self.control)
            except AttemptEnded:  # a newer attempt holds the run: its answers are not ours to replace
                pass
            return
        request = (self._steps.resize_request if self._steps is not None else None) or self._resize_requested()
        if request is not None:
            elastic.answer(self.run_dir, request["id"], self._newest_checkpoint(), ending)

    def _newest_checkpoint(self) -> Optional[str]:
        newest = self.checkpointer.latest()
        return newest[0].name if newest else None

    # ------------------------------------------------------------------------------------------ reduce

    def all_reduce(self, values: list[float], op: str = "sum") -> list[float]:
        """`values` summed (or max'ed) over all workers; the same list back on a single process."""
        return list(values)

    # ------------------------------------------------------------------------------------------ the contract

    def checkpoint_due(self, epoch: int) -> bool:
        return epoch % self.config.run.checkpoint_every == 0 or epoch == self.config.train.epochs

    def restore(self, model: "nn.Module", optimizer: Any = None, **stateful: Any) -> int:
        """Load the newest checkpoint that loads into model/optimizer/stateful objects; returns the first epoch to
        train (1 when there is none). Metrics rows past the restored position are dropped: they train again."""
        if self.replicas is not None:
            healed_epoch = self._ft_restore(model, optimizer, stateful)
            if healed_epoch is not None:
                return healed_epoch
        began = time.perf_counter()
        warnings: list[str] = []
        if self.sharded:  # every worker reads its own shards, straight into model and optimizer
            loaded = self.checkpointer.load_newest(warnings.append, model, optimizer)
        else:
            loaded = self._load_newest(warnings.append)
            if loaded is not None:
                self._load_state(loaded.state, model, optimizer)
        if loaded is None and self.checkpointer.latest():
            # The driver checked that one loads before the start; never train over them from scratch silently.
            raise CheckpointsUnloadable(f"run directory {self.run_dir} has checkpoints but none of them loads: "
                                        f"{'; '.join(warnings)}. Fix: train under a new --name, or delete them to "
                                        f"train from scratch.")
        applied: dict = {}
        if loaded is not None:
            state = loaded.state
            if optimizer is not None and (self.sharded or state.get("optimizer") is not None):
                # What the loop hands to raytrain (applied_on_resume) and this run's config changed, trains now.
                applied = resume.applied_changes(state.get("config") or {}, self.config.to_dict(),
                                                 resume.rules_of(self.config.loop.target))
                resume.apply_optimizer_settings(optimizer, applied)
            for name, obj in stateful.items():
                if name in state.get("extra", {}):
                    obj.load_state_dict(state["extra"][name])
            self.resumed_from_epoch = int(state["epoch"])
            self._resume_step = int(state.get("step") or 0)
        if self.is_rank_zero:
            for message in warnings:
                self.records.append_event("warning", message=message)
            if loaded is not None:
                written_by = loaded.state.get("world_size")
                resharded = {"resharded_from": written_by} if written_by and written_by != self.world_size else {}
                self.records.append_event("restored", checkpoint=loaded.path.name, epoch=self.resumed_from_epoch,
                                          step=self._resume_step, applied={k: new for k, (_, new) in applied.items()},
                                          restore_s=round(time.perf_counter() - began, 3), **resharded)
        self._tracked = (model, optimizer, stateful)
        self._announce()
        return (self.resumed_from_epoch or 0) + 1

    def _load_newest(self, warn: Callable[[str], None]) -> Optional[checkpoints.Loaded]:
        return self.checkpointer.load_newest(warn)

    def _load_state(self, state: dict, model: "nn.Module", optimizer: Any) -> None:
        """A single-file checkpoint's model and optimizer state into this worker's."""
        if _by_name(self.config, model):
            sharding.load_model_state(model, state["model"], full=True)
        else:
            build.unwrap(model).load_state_dict(state["model"])
        if optimizer is None or state.get("optimizer") is None:
            return
        if state.get("optimizer_by_name"):
            sharding.load_optimizer_state(model, optimizer, state["optimizer"], full=True)
        elif sharding.is_sharded(model):
            raise CheckpointsUnloadable(f"run directory {self.run_dir}: its newest checkpoint holds the optimizer "
                                        f"state of a DDP run, which does not load into a model sharded with "
                                        f"scaling.strategy fsdp. Fix: resume with scaling.strategy: ddp, or train "
                                        f"under a new --name.")
        else:
            optimizer.load_state_dict(state["optimizer"])

    def report(self, epoch: int, metrics: Mapping[str, Any], *, model: "nn.Module", optimizer: Any = None,
               **stateful: Any) -> None:
        """Every worker, once per epoch: rank 0 appends the metrics row; a checkpoint when the epoch is due."""
        self._announce()
        self._tracked = (model, optimizer, stateful)
        row = {"epoch": int(epoch), **{k: _plain_number(v) for k, v in metrics.items()},
               "resumed_from_epoch": self.resumed_from_epoch}
        if self.replicas is not None:
            # What the committed steps trained, over every replica (the loop's own count misses a lost replica's
            # share): raytrain.worker.replicas
            row.update(self.replicas.end_epoch(), replicas_in_sync=self.replicas.in_sync(model),
                       replicas_partial=self._ft_partial)
            self._ft_partial = False
        if self.is_rank_zero:
            # The row goes first: if the checkpoint below never lands, resume drops this row and retrains. Its
            # timing (rank 0's) goes to metrics.jsonl only: the trackers, Ray Train and the console take the row.
            self.records.append_metrics({**row, "timing": self._timing()})
        self._data_s = self._val_s = self._checkpoint_s = 0.0
        diverged = runrecords.diverged(metrics)
        if diverged:
            self._diverged(int(epoch), diverged)
        self._epoch_done(row, self._epoch_samples, time.perf_counter() - self._epoch_began)
        checkpointed = self.checkpoint_due(epoch)
        if checkpointed:
            self._checkpoint(Position(epoch), model, optimizer, stateful)
        self._epoch_samples, self._epoch_began = 0, time.perf_counter()
        if self._steps is not None and epoch < self.config.train.epochs:
            # Also at every epoch's end: a loop that does not iterate session.batches("train") ends here.
            decision = self._steps.decide(at_epoch_end=True)
            if decision.ending is Ending.LEASE_LOST:
                raise AttemptEnded(Ending.LEASE_LOST, decision.reason)
            if decision.ending is not None:
                if not checkpointed:
                    self._checkpoint(Position(epoch), model, optimizer, stateful)
                self._end(decision.ending, decision.reason, saved=True)

    def _timing(self) -> dict:
        """What the segment of time since the previous metrics row (or the group's start) held besides training:
        raytrain.rundir.goodput's input, a few numbers per epoch."""
        return {"time": round(time.time(), 3), "data_s": round(self._data_s, 3), "val_s": round(self._val_s, 3),
                "checkpoint_s": round(self._checkpoint_s, 3)}

    def trained(self) -> None:
        """The loop returned and its last checkpoint committed: rank 0 marks the moment (a `trained` event with the
        checkpoint seconds since the last row), so that goodput tells the last checkpoint from the attempt's end."""
        if self.is_rank_zero:
            self.records.append_event("trained", checkpoint_s=round(self._checkpoint_s, 3), attempt=self.records.token)

    def _diverged(self, epoch: int, names: list[str]) -> None:
        """A loss that is NaN or infinite: the weights are past saving, so no checkpoint of this epoch is written
        and the attempt fails with the reason (every worker sees the same all-reduced loss and ends here); the
        last good checkpoint stays, for a resume with a lower learning rate."""
        newest = self.checkpointer.latest()
        good = (f"resume from the last good checkpoint ({newest[0].name}) by running the same command again"
                if newest else "run the same command again (no checkpoint was written before it diverged)")
        lr = f" (it is {self.config.train.lr:g})" if self.config.optimizer is None else ""
        reason = (f"training diverged at epoch {epoch}: {' and '.join(names)} became NaN or infinite, so the "
                  f"model's weights are no longer usable and this epoch's checkpoint is not written. Fix: lower "
                  f"train.lr{lr} or set train.grad_clip, then {good}.")
        if self.is_rank_zero:
            self.records.append_event("diverged", message=reason, epoch=epoch, attempt=self.records.token)
        raise AttemptEnded(Ending.FAILED, reason)

    def steps_before(self, epoch: int) -> int:
        """The optimizer steps of `epoch` an earlier group trained (a mid-epoch resume, or the step a healed
        torchft replica joins at): a loop's own step count of the epoch starts after them."""
        if epoch != (self.resumed_from_epoch or 0) + 1:
            return 0
        return self._resume_step // self.config.train.grad_accum_steps

    def log_step(self, epoch: int, step: int, metrics: Mapping[str, Any]) -> None:
        """A per-step row in steps.jsonl (rank 0's values; run.log_every_steps sets how often the built-in loop
        calls it). The caller decides when to read values off the device: this costs one host sync per call."""
        if self.is_rank_zero:
            self.records.append_step({"epoch": int(epoch), "step": int(step),
                                      **{k: _plain_number(v) for k, v in metrics.items()}})

    def _checkpoint(self, position: Position, model: "nn.Module", optimizer: Any, stateful: dict) -> None:
        """Every worker at the same step: the single-file checkpointer's rank 0 writes; the sharded one's every
        worker writes its shards (asynchronously unless run.async_checkpoint is false)."""
        began = time.perf_counter()
        config = self.config.to_dict()
        if self.sharded:
            self.checkpointer.save(position, model, optimizer, lambda: self._small_state(position, stateful),
                                   config=config)
        elif sharding.is_sharded(model):  # gathering a sharded model's full state is every worker's collective
            state = self._state(position, model, optimizer, stateful)
            self.checkpointer.save(position, lambda: state, writer=self.is_rank_zero, config=config)
        else:
            self.checkpointer.save(position, lambda: self._state(position, model, optimizer, stateful),
                                   writer=self.is_rank_zero, config=config)
        self._checkpoint_s += time.perf_counter() - began  # what the loop waited for (an async save: its start)
        if self._steps is not None:
            self._steps.checkpointed()
        self._checkpointed()

    def wait_for_checkpoint(self) -> None:
        """The checkpoint in flight (the sharded checkpointer's asynchronous write) committed, or its failure raised:
        the entry calls this when the loop ends or the attempt stops."""
        if self.sharded:
            began = time.perf_counter()
            self.checkpointer.wait()
            self._checkpoint_s += time.perf_counter() - began

    def _small_state(self, position: Position, stateful: dict) -> dict:
        return {"epoch": position.epoch, "step": position.step, "config": self.config.to_dict(),
                "extra": {name: obj.state_dict() for name, obj in stateful.items()}}

    def _state(self, position: Position, model: "nn.Module", optimizer: Any, stateful: dict) -> dict:
        by_name = _by_name(self.config, model)
        if optimizer is None:
            optimizer_state = None
        elif sharding.is_sharded(model):
            optimizer_state = sharding.optimizer_state(model, optimizer, full=True)
        else:
            optimizer_state = optimizer.state_dict()
        return {"model": sharding.model_state(model, full=True) if by_name else build.unwrap(model).state_dict(),
                "optimizer": optimizer_state, "optimizer_by_name": sharding.is_sharded(model),
                **self._small_state(position, stateful)}

    def finished(self) -> None:
        """The loop returned and its last checkpoint committed (a Ray Train worker lingers for its telemetry)."""

    # Telemetry hooks (a Ray Train worker exports live metrics; a local run has nowhere to send them).
    def _started(self, start_epoch: int) -> None: ...

    def _epoch_done(self, row: dict, local_samples: int, local_seconds: float) -> None: ...

    def _checkpointed(self) -> None: ...

    # Whether this worker's node is being drained (its pod deleted): None where there is no such thing (local).
    _node_draining: Optional[Callable[[], bool]] = None
    # An elastic run's pending resize request (raytrain.worker.elastic.pending): None where nothing resizes.
    _resize_requested: Optional[Callable[[], Optional[dict]]] = None


class CheckpointsUnloadable(RaytrainError):
    """A worker found committed checkpoints none of which loads (the driver's check passed before the start)."""


def _by_name(cfg: RunConfig, model: "nn.Module") -> bool:
    """Whether the model's state goes through torch.distributed.checkpoint's state-dict API (a sharded model, or
    wrapped units whose own state_dict() keys carry the wrapper's prefix) rather than its own state_dict()."""
    return sharding.is_sharded(model) or cfg.scaling.activation_checkpointing


_plain_number = runrecords.plain_number  # metrics values as plain JSON numbers


def torch_threads(cfg: RunConfig, cpus_per_worker: float) -> int:
    return cfg.train.torch_threads or max(1, int(cpus_per_worker))
