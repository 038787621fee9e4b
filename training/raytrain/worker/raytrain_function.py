"""The Ray Train function contract: a `train_func(config)` written against `ray.train` runs under raytrain unchanged.

A run config names it the way TorchTrainer takes it, and needs no model or data section:

    loop:
      _component_: my_project.train:train_func     # train_func(config), or train_func() with no parameter
      train_loop_config: {lr: 0.01, epochs: 3}      # what TorchTrainer's train_loop_config would be
      datasets_to_split: [train]                    # optional: TorchTrainer's DataConfig(datasets_to_split=...)
    data: {_component_: my_project.data:datasets, loader: ray}   # optional: {name: ray.data.Dataset}, whose
                                                    # shards ray.train.get_dataset_shard(name) returns

config.py recognises such a loop: its callable takes no parameter, or exactly one named `config` (with the key
`train_loop_config` present, one positional parameter of any name), and its section holds nothing but
`train_loop_config`, a mapping. The function runs on every Ray Train worker (`raytrain run`, a RayJob, `raytrain
emulate`: the same worker entry as a raytrain.Session loop), with `ray.train.report` and `ray.train.get_checkpoint`
replaced, in that worker process only and before the function's module is imported (so `ray.train.report(...)`,
`train.report(...)` and `from ray.train import report` all get them), by raytrain's:

- `report(metrics, checkpoint=None, ...)`, called by every worker as Ray Train asks: rank 0 appends a metrics row to
  metrics.jsonl (`epoch`: the `epoch` the function reported when it is an integer, else a running count of its
  reports that continues across resumes); a reported checkpoint directory is copied into a staging directory
  (every worker's reported files, as Ray Train merges them, a name several workers report from the lowest of
  them: rank 0's, the saver's in a DDP script; each file's sha256 computed while it is copied), named in a
  manifest and committed by the same fenced rename and pruning as raytrain's own checkpoints
  (raytrain.checkpoint.checkpoints: `run.keep_checkpoints` newest complete ones kept); every other worker stages
  on its own and hands over the files it owns (on an object store, on its own node, uploading them), and rank 0
  commits, the manifest last, once they are all in place. What cannot be committed (a directory gone before the
  report, an empty one, a negative epoch) is refused at the report, naming it; a position the run's rows already
  hold (a function that ignored get_checkpoint(), steps repeated after a restart) replaces the rows from there on,
  with a warning. Then Ray Train's own `report(metrics)`
  (no checkpoint: Ray Train and Ray Tune see the metrics, raytrain keeps the files). Then the step control's
  synced decision: a graceful stop (SIGTERM, a deleted pod or job), a draining node or a lost lease ends the
  attempt here, at the function's next report. A report every N steps is the user's knob for how soon that is;
  a function that never reports runs to its end (or until the pod's grace period runs out).
- `get_checkpoint()`: a `ray.train.Checkpoint` of the newest complete committed checkpoint of this NAME/STORAGE
  (its files as the function reported them), or None on a fresh run: after any restart, retry or resubmission.
  The newest is verified (its files' hashes) by rank 0 when the worker group starts; a damaged one is skipped with
  a warning, falling back to the one before.

While the function runs, its loaders' iteration is timed for goodput (raytrain.worker.loadertiming): each row's data
wait and evaluation, and its first batch, where its group's start-up ends.

What differs from TorchTrainer: Ray Train's own checkpoint storage is not used (raytrain commits the files into
STORAGE/NAME; `checkpoint_dir_name`, upload modes and `validation` are not passed on); a stop acts at a report, not
at a step; metrics.jsonl keeps rank 0's metrics. Resume rules: the loop section (or the function, as an attribute)
may declare `fixed_on_resume` (patterns of the run config, e.g. [loop.train_loop_config.hidden_size]: a resume that
changes them is refused, naming them); `applied_on_resume` is refused (the function restores its own optimizer). `raytrain local` refuses such a function: it needs Ray Train's
worker context (use `raytrain run`, which starts an embedded Ray on the machine).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Callable, Optional

from raytrain.checkpoint import checkpoints
from raytrain.checkpoint.checkpoints import Position
from raytrain.errors import RaytrainError
from raytrain.lifecycle.endings import AttemptEnded, Ending
from raytrain.parallel import collectives
from raytrain.rundir import runrecords
from raytrain.spec import loops
from raytrain.spec.loops import TRAIN_LOOP_CONFIG
from raytrain.worker import loadertiming

# Typed loosely: config.py and session.py import this module (RunConfig, raytrain.worker.session.Session).
RunConfig = Session = Any

# ----------------------------------------------------------------------------------------------------------
# the worker side


class CheckpointRefused(RaytrainError):
    """A checkpoint a function reported that cannot be committed (a directory gone or empty, a position raytrain's
    reader cannot read back), or that did not reach the run's storage whole: refused at its report, on every worker
    alike (one line: Ray's error shows the last line of its cause)."""


class Bridge:
    """raytrain's report/get_checkpoint for one worker of a worker group running a Ray Train function."""

    def __init__(self, session: Session, real_report: Callable[..., Any]):
        self.session = session
        self.real_report = real_report
        self.offer: Optional[Path] = None  # the checkpoint get_checkpoint() returns
        self.offer_position: Optional[Position] = None
        self.asked = False  # the function called get_checkpoint()
        self.next_count = 1
        self.began = time.perf_counter()
        self.last_key: Optional[tuple[int, int]] = None  # rank 0: the position of the run's newest metrics row
        self.reports = 0

    # -- the group's start

    def start(self) -> None:
        """Choose the newest complete checkpoint (rank 0 verifies it and names it to the others); drop metrics rows
        past it (they are trained again); number the reports on from it."""
        session = self.session
        if session.config.scaling.torchft:  # every worker is a replica group of its own: each finds the newest itself
            chosen = self._newest_verified()
        else:
            chosen = collectives.broadcast_from_rank0(self._newest_verified() if session.is_rank_zero else None,
                                                      session.rank)
        if chosen is not None:
            self.offer = session.run_dir / chosen
            self.offer_position = checkpoints.position_of(self.offer)
        epoch = self.offer_position.epoch if self.offer_position is not None else None
        if session.is_rank_zero:  # with no checkpoint every row goes, an epoch 0 a function reported included
            session.records.truncate_metrics(-1 if epoch is None else epoch)
            rows = runrecords.read_metrics(session.run_dir)
            self.last_key = runrecords.row_key(rows[-1]) if rows else None
        session._rows_truncated = True  # Session's own truncation at its start would drop rows resumed past here
        self.next_count = max(epoch or 0, 0) + 1

    def _newest_verified(self) -> Optional[str]:
        records = self.session.records
        for path in checkpoints.committed(self.session.run_dir):
            why = checkpoints.incomplete_reason(path)
            if why is None:
                try:
                    checkpoints.verify_hash(path)
                    return path.name
                except checkpoints.CheckpointUnreadable as err:
                    why = str(err)
            records.append_event("warning", message=f"checkpoint {path.name} is unreadable: {why}; falling back "
                                                    f"to the one before")
        return None

    def _announce(self) -> None:
        session = self.session
        if session._announced:
            return
        if self.asked and self.offer_position is not None:
            session.resumed_from_epoch = self.offer_position.epoch
        elif self.offer is not None and session.is_rank_zero:
            session.records.append_event(
                "warning", message=f"the function did not call ray.train.get_checkpoint() before its first report, "
                                   f"so it started from its own beginning although checkpoint {self.offer.name} "
                                   f"exists; its reports are numbered on from {self.next_count}")
        session._announce()

    def announce_failed_start(self) -> None:
        """A group whose function raised before its first report still started: its start event is how the driver
        counts the restart (without the warning about get_checkpoint, which is about reports)."""
        if self.session._announced:
            return
        if self.asked and self.offer_position is not None:
            self.session.resumed_from_epoch = self.offer_position.epoch
        self.session.announce_failed_start()

    # -- ray.train.get_checkpoint

    def get_checkpoint(self) -> Any:
        import ray.train

        first = not self.asked
        self.asked = True
        if self.offer is None:
            return None
        if first and not self.session._announced and self.session.is_rank_zero:
            assert self.offer_position is not None
            self.session.records.append_event("restored", checkpoint=self.offer.name, epoch=self.offer_position.epoch,
                                              step=0, applied={})
        return ray.train.Checkpoint(str(self.offer / checkpoints.DATA_DIR))

    # -- ray.train.report

    def report(self, metrics: Mapping[str, Any], checkpoint: Any = None, checkpoint_dir_name: Optional[str] = None,
               *args: Any, **kwargs: Any) -> None:
        self._announce()
        session = self.session
        if session.config.scaling.torchft and "torchft.manager" not in sys.modules:
            # Ray Train's TorchftConfig gives every worker a process group of its own: without a torchft Manager
            # of the function's, each would train a model of its own
            raise RaytrainError(f"scaling.fault_tolerance is torchft but the Ray Train function {session.config.loop.path}"
                                f" does not use torchft: every worker would train alone. Fix: set scaling."
                                f"fault_tolerance: restart, or build the function on torchft's Manager (as Ray's "
                                f"torchft_linear_example does)")
        metrics = dict(metrics or {})
        reported = metrics.get("epoch")
        epoch = reported if isinstance(reported, int) and not isinstance(reported, bool) else self.next_count
        self.next_count = epoch + 1
        row = {**{str(k): runrecords.plain_number(v) for k, v in metrics.items()}, "epoch": epoch,
               "resumed_from_epoch": session.resumed_from_epoch}
        if session.is_rank_zero:
            self._drop_repeated(row)
            # Goodput's split of the time since the last row: the checkpoint commits, and the function's data wait
            # and evaluation (its loaders' iteration, raytrain.worker.loadertiming)
            session.records.append_metrics({**row, "timing": session._timing()})
        session._data_s = session._val_s = session._checkpoint_s = 0.0
        self.reports += 1
        telemetry = getattr(session, "telemetry", None)
        if telemetry is not None:
            telemetry.epoch_end(row, 0, time.perf_counter() - self.began)
        committing = time.perf_counter()
        committed = self._commit(Position(epoch), checkpoint)
        session._checkpoint_s += time.perf_counter() - committing
        if committed is not None:
            self.offer, self.offer_position = committed, checkpoints.position_of(committed)
            if session._steps is not None:
                session._steps.checkpointed()
            session._checkpointed()
        self.began = time.perf_counter()
        if not session.config.scaling.torchft:  # Ray's report is a barrier over every worker, which a missing
            self.real_report(metrics)  # replica would hold. Ray Train's and Ray Tune's view; the files stay raytrain's
        if session._steps is None:
            return
        decision = session._steps.decide(at_epoch_end=True)
        if decision.ending is Ending.LEASE_LOST:
            raise AttemptEnded(Ending.LEASE_LOST, decision.reason or "the lease was lost")
        if decision.ending is not None:
            session._end(decision.ending, decision.reason or "stop requested", saved=committed is not None)

    def _drop_repeated(self, row: dict) -> None:
        """Rank 0, before a row is appended: a function that reports a position the run's rows already hold (it
        ignored get_checkpoint() and began again, or repeats steps after a mid-epoch restart) trains it again, so
        the rows from there on are dropped and the warning names the repeat. A group's first report repeating the
        newest row is a repeat too; later, rows of one epoch without a `step` are several reports of that epoch."""
        key, last = runrecords.row_key(row), self.last_key
        self.last_key = key
        if last is None or key > last or (key == last and self.reports and key[1] < 0):
            return
        self.session.records.drop_metrics_from(*key)
        at = f"epoch {key[0]}" + (f" step {key[1]}" if key[1] >= 0 else "")
        self.session.records.append_event(
            "warning", message=f"the function reported {at} again (metrics.jsonl already held rows up to epoch "
                               f"{last[0]}{f' step {last[1]}' if last[1] >= 0 else ''}): it did not resume where "
                               f"its checkpoint left off, so the rows from {at} on were dropped and it trains them "
                               f"again")

    def _commit(self, position: Position, checkpoint: Any) -> Optional[Path]:
        """Every worker's reported files staged (each file's hash computed as it is copied), then rank 0's fenced
        commit of all of them. Rank 0 stages into the checkpoint's staging directory, every other worker on its own
        and then hands over the files it owns (a name several report: the lowest rank's copy, whatever the order
        they were copied in) before rank 0 commits, its manifest last. A checkpoint that cannot be committed whole
        is refused on every worker alike (CheckpointRefused): nothing of it is committed."""
        session = self.session
        if session.config.scaling.torchft and not session.is_rank_zero:
            # torchft: the replicas hold the same state (the function's Manager heals them), and a missing one must
            # not hold a commit back: the writer's reported files are the checkpoint, committed by it alone
            return None
        # Rank 0's report names the checkpoint and its position (the others may report other metrics).
        name, epoch = collectives.broadcast_from_rank0(
            (checkpoints.checkpoint_dir_name(position), position.epoch) if session.is_rank_zero else None, session.rank)
        position = Position(epoch)
        checkpointer = session.checkpointer
        store = checkpointer.store
        files: dict[str, dict] = {}
        problem: Optional[str] = None
        if checkpoint is not None:
            session.control.check()  # a worker of an attempt that lost the run does not even copy
            staging = store.reported_staging(name, session.rank)
            try:
                files = self._stage(checkpoint, staging, epoch)
            except CheckpointRefused as err:
                problem = str(err)
            except OSError as err:
                problem = self._write_failed(err, staging)
        gathered = collectives.gather_all((checkpoint is not None, files, problem))
        if not any(reported for reported, _, _ in gathered):
            return None
        refusal = next((why for _, _, why in gathered if why), None) or _position_refused(epoch)
        if refusal is None and not any(worker_files for _, worker_files, _ in gathered):
            refusal = (f"the checkpoint reported at epoch {epoch} holds no file: nothing would be restored from it. "
                       f"Fix: write the state into the directory before ray.train.report(..., checkpoint=...)")
        if refusal is not None:
            self._discard(name)
            raise CheckpointRefused(f"ray.train.report refused a checkpoint: {refusal}")
        owners = _owners([worker_files for _, worker_files, _ in gathered])
        problem = self._upload_own(name, files, owners)
        failed = next((why for why in collectives.gather_all(problem) if why), None)
        if failed is not None:
            self._discard(name)
            if session.is_rank_zero:
                store.abandon(name)  # what reached the run's storage without its manifest: never committed
            raise CheckpointRefused(f"checkpoint {name} was not committed: {failed}")
        if not session.is_rank_zero:
            return session.run_dir / name
        staging = checkpointer.staging_path(name)
        merged = {relative: gathered[rank][1][relative] for relative, rank in owners.items()}  # the copies staged
        missing = store.not_uploaded(name, checkpoints.DATA_DIR,
                                     {relative: entry["size"] for relative, entry in merged.items()
                                      if owners[relative] != 0})
        if missing is not None:
            store.abandon(name)
            raise CheckpointRefused(f"checkpoint {name} was not committed: {missing}, reported by rank "
                                    f"{owners[missing]}, is not in {session.run_dir / name} at its size")
        config = session.config.to_dict()
        return checkpointer.commit(name, lambda: checkpoints.write_directory_manifest(
            staging, position, merged, config=config, attempt=session.control.token))

    def _stage(self, checkpoint: Any, staging: Path, epoch: int) -> dict[str, dict]:
        """This worker's reported directory copied into `staging`/data, hashed; CheckpointRefused for what is not
        a directory checkpoint."""
        rank = self.session.rank
        if not callable(getattr(checkpoint, "as_directory", None)):
            raise CheckpointRefused(f"rank {rank} reported a {type(checkpoint).__name__} at epoch {epoch}, not a "
                                    f"ray.train.Checkpoint. Fix: report checkpoint=ray.train.Checkpoint."
                                    f"from_directory(DIR)")
        try:
            with checkpoint.as_directory() as source:
                if not Path(source).is_dir():
                    raise FileNotFoundError(source)
                return checkpoints.copy_tree_hashed(Path(source), staging / checkpoints.DATA_DIR)
        except FileNotFoundError as err:
            gone = getattr(checkpoint, "path", None) or err.filename or err
            raise CheckpointRefused(f"the checkpoint directory rank {rank} reported at epoch {epoch}, {gone}, does "
                                    f"not exist (deleted before ray.train.report: a TemporaryDirectory left before "
                                    f"the report?). Fix: call ray.train.report inside the block that wrote the "
                                    f"directory") from None

    def _write_failed(self, err: OSError, staging: Path) -> str:
        full = self.session.checkpointer.store.staging_full(staging, err)
        if full is not None:
            return f"rank {self.session.rank}: {full}"
        return f"rank {self.session.rank} could not stage it in {staging}: {err.strerror or err}"

    def _upload_own(self, name: str, files: dict[str, dict], owners: dict[str, int]) -> Optional[str]:
        """A worker other than rank 0: the reported files it owns handed to the checkpoint (moved into its staging
        directory, or uploaded), then its own staging copy removed; rank 0's go with its commit. Why it failed, or
        None."""
        session = self.session
        if session.is_rank_zero:
            return None
        owned = sorted(r for r in files if owners[r] == session.rank)
        why = session.checkpointer.store.upload_own(name, checkpoints.DATA_DIR, owned, session.control.check)
        return f"rank {session.rank} {why}" if why else None

    def _discard(self, name: str) -> None:
        """A refused checkpoint's staged copies: this worker's own ones; rank 0 removes the staging directory the
        workers hand their files to, and any worker's own one (every worker stopped writing: all passed the
        gather)."""
        self.session.checkpointer.store.discard(name, last=self.session.is_rank_zero)


def _owners(reported: list[dict[str, dict]]) -> dict[str, int]:
    """{file name: the lowest rank that reported it}: whose copy is committed where several report one name."""
    owners: dict[str, int] = {}
    for rank, worker_files in enumerate(reported):
        for relative in worker_files:
            owners.setdefault(relative, rank)
    return owners


def _position_refused(epoch: int) -> Optional[str]:
    """Why a checkpoint at `epoch` could not be read back (checkpoints.read_meta takes counts only)."""
    if epoch < 0:
        return (f"its epoch is {epoch}: a checkpoint's epoch counts epochs completed (0 or more), and raytrain "
                f"could neither resume from nor prune one at a negative epoch. Fix: report an epoch of 0 or more "
                f"with a checkpoint")
    return None


# ----------------------------------------------------------------------------------------------------------
# installing it in a worker process


_bridge: Optional[Bridge] = None
_originals: dict[str, Any] = {}


def _report(metrics: Mapping[str, Any], checkpoint: Any = None, *args: Any, **kwargs: Any) -> None:
    if _bridge is None:
        raise RuntimeError("raytrain's ray.train.report was called outside a raytrain worker group")
    _bridge.report(metrics, checkpoint, *args, **kwargs)


def _get_checkpoint() -> Any:
    if _bridge is None:
        return None
    return _bridge.get_checkpoint()


def install() -> None:
    """Put raytrain's report and get_checkpoint in place of ray.train's, in this process. Call before the
    function's module is imported (so that `from ray.train import report` binds raytrain's)."""
    import ray.train

    if "report" not in _originals:
        _originals["report"] = ray.train.report
        _originals["get_checkpoint"] = ray.train.get_checkpoint
    _report.__doc__ = ray.train.report.__doc__
    ray.train.report = _report
    ray.train.get_checkpoint = _get_checkpoint


def run(cfg: RunConfig, session: Session) -> Any:
    """Call the run config's Ray Train function on this worker, with raytrain's report and get_checkpoint."""
    global _bridge

    install()
    _bridge = Bridge(session, _originals["report"])
    try:
        _bridge.start()
        target = cfg.loop.target
        loop_config = dict(cfg.loop.kwargs.get(TRAIN_LOOP_CONFIG) or {})
        parameters = loops.positional_parameters(target)
        try:
            with loadertiming.timing(session):
                result = target(loop_config) if parameters else target()
        except Exception:
            _bridge.announce_failed_start()
            raise
        _bridge._announce()  # a function that never reported still started
        return result
    finally:
        _bridge = None
