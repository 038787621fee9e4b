"""Elastic runs (`scaling.num_workers: [min, max]`) on Ray Train's own elasticity, with resizes that lose no step.

What Ray Train 2.60 does (Train v2: ray/train/v2/_internal/execution/scaling_policy/elastic.py ElasticScalingPolicy,
controller/controller.py):
- a group (re)starts with as many workers as the nodes hold, capped at max; while fewer than min fit, it waits;
- every `elastic_resize_monitor_interval_s` it looks at a running group again: when a different count fits, the
  controller shuts the group down and starts one of the new size (`_execute_resize_decision`), killing the workers
  wherever they are;
- a lost node fails the group like any worker failure: the restart takes what fits then. A drained one (a deleted
  pod's preStop hook, raytrain.worker.drain) checkpoints at its step first.

Which workers fit is the answer of Ray's AutoscalingCoordinator (a detached actor Ray Data shares), which looks at
the nodes every 20 s and counts a DRAINING node as alive: a group restarted after a drain would ask for a worker on
the drained node and wait out the start timeout (below) before it starts on what is left, about 40 s here. The
controller callback has the coordinator leave DRAINING nodes out and look again at each restart, and every
COORDINATOR_REFRESH_S while a group runs (raytrain.platform.rayinternals.refresh_autoscaling_coordinator): the
shrink starts at once, and a returning node counts within seconds.

The steps since the last checkpoint would be lost at that shutdown. `ResizeCheckpoint`, a controller callback,
runs just before it (`before_controller_execute_resize_decision`, only for a running group): it writes a request
into the run directory, which rank 0 reads at its step decisions as it reads a stop request (raytrain.worker.stepcontrol);
every worker checkpoints at that step, rank 0 answers once the checkpoint has committed, and the workers hold
there until the controller shuts them down. The new group resumes at that step: nothing is trained twice or lost.

The batch and learning-rate rule: the global batch (`train.batch_size`) never changes; each of N workers takes
batch_size / N per step (config.py refuses a batch that does not split evenly over every count in min..max), so
the optimizer sees the same batches and the learning rate stays as configured. raytrain's ShardSampler splits an
epoch's order by rank with a stride of N, so global step s always covers the same samples, whatever N: a resume
on another count goes on exactly where the checkpoint was. Each worker's memory must hold batch_size / min.

Every change of count is a `resize` event (from, to, epoch, step) written by the new group's rank 0, and a mark in
`raytrain report`.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from pathlib import Path
from typing import Any, Optional

from raytrain.lifecycle.endings import AttemptEnded
from raytrain.platform import rayinternals
from raytrain.rundir import atomicfile, layout, runrecords, storage
from raytrain.rundir.runcontrol import Control, WorkerControl

logger = logging.getLogger(__name__)

# How long the controller waits for the running group's checkpoint before it resizes anyway (the steps since the
# last checkpoint are then lost, as without raytrain): a step and one checkpoint write must fit.
# The cli reads RAYTRAIN_RESIZE_CHECKPOINT_TIMEOUT_S.
CHECKPOINT_TIMEOUT_S = 120.0
# How long checkpointed workers wait to be shut down before they end the group themselves (a failure for Ray Train,
# which restarts it from that checkpoint): only if the controller never resized, which its answer makes it do at once.
HOLD_S = 600.0
POLL_S = 0.2
# Ray Train waits this long (RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S, default 60 s) for a new group's workers. An
# elastic start asks only for workers whose nodes are up, so a start that takes longer is one counted on a node
# that has just gone without a drain (Ray has not marked it dead yet): give up on it sooner and start again with
# what is left. An explicit value in the environment wins.
ELASTIC_START_TIMEOUT_S = "30"
# How often, while a group runs, the controller callback has Ray's AutoscalingCoordinator look at the nodes (its
# own tick is every 20 s): a returning node counts for a grow within this, at the cost of one small actor call.
COORDINATOR_REFRESH_S = 5.0


class ResizeNotApplied(RuntimeError):
    """A worker checkpointed for a resize that never came (see HOLD_S): the group ends and restarts from there."""


def _write(path: Path, record: dict, control: Optional[Control]) -> None:
    # Fenced where the writer is an attempt's controller: one that lost the run never overwrites the newer one's.
    atomicfile.write_atomic(path, json.dumps(record), before_replace=control.check if control is not None else None)


def prepare(run_dir: Path, control: Optional[Control] = None) -> None:
    """Both files exist, as empty records, before any worker polls them (the driver, before training): a reader on
    another node then always opens an existing name, which NFS's close-to-open consistency keeps current (a lookup
    of a missing name may be cached for up to a minute: raytrain.rundir.lease). They are replaced, never deleted."""
    for name in (layout.RESIZE_REQUEST_FILE, layout.RESIZE_HELD_FILE):
        _write(storage.as_path(run_dir) / name, {"id": None}, control)


def request(run_dir: Path, attempt: int, to_workers: int, control: Optional[Control] = None) -> str:
    """The controller's request that the running group checkpoint at its next step and hold; returns its id."""
    request_id = uuid.uuid4().hex
    _write(storage.as_path(run_dir) / layout.RESIZE_REQUEST_FILE, {"id": request_id, "attempt": attempt, "to": to_workers,
                                          "time": time.time()}, control)
    return request_id


def pending(run_dir: Path, attempt: int, world_size: int) -> Optional[dict]:
    """The request for this attempt's running group of `world_size` workers, or None. A request left behind for
    a group of another attempt, or a resize to this very size (a new group reading an old request), is not one."""
    data = atomicfile.read_record(storage.as_path(run_dir) / layout.RESIZE_REQUEST_FILE)
    if data is None or not isinstance(data.get("id"), str) or data.get("attempt") != attempt:
        return None
    to = data.get("to")
    if not isinstance(to, int) or isinstance(to, bool) or to == world_size:
        return None
    return data


# The id of rank 0's standing answer once its loop has returned: every later request of that attempt is answered
# "finished" (rank 0 lingers for its telemetry, and Ray Train may decide a resize then; nothing is left to save).
FINISHED = "finished"


def answer(run_dir: Path, request_id: str, checkpoint: Optional[str], ending: str = "resizing",
           attempt: Optional[int] = None, control: Optional[Control] = None) -> None:
    """Rank 0's answer: "resizing" once the resize step's checkpoint has committed (the workers hold from there);
    or how the group ended otherwise (a stop, a drain, the loop's end) with a request still open, so that the
    controller never waits out its timeout for an answer that cannot come. request_id FINISHED (with the attempt)
    answers this attempt's requests to come as well; control fences it (a stale attempt's never replaces a newer
    one's answer)."""
    record = {"id": request_id, "checkpoint": checkpoint, "ending": ending, "time": time.time()}
    if attempt is not None:
        record["attempt"] = attempt
    _write(storage.as_path(run_dir) / layout.RESIZE_HELD_FILE, record, control)


def clear_finished(run_dir: Path, attempt: int, control: Optional[Control] = None) -> None:
    """A new group of the attempt has training ahead of it: the last group's standing FINISHED answer goes."""
    path = storage.as_path(run_dir) / layout.RESIZE_HELD_FILE
    data = atomicfile.read_record(path)
    if data is not None and data.get("id") == FINISHED and data.get("attempt") == attempt:
        _write(path, {"id": None}, control)


def answered(run_dir: Path, request_id: str, attempt: Optional[int] = None) -> Optional[dict]:
    """Rank 0's answer to this request ({"id", "checkpoint", "ending", "time"}), or None; with the attempt, its
    standing FINISHED answer too."""
    data = atomicfile.read_record(storage.as_path(run_dir) / layout.RESIZE_HELD_FILE)
    if data is None:
        return None
    if data.get("id") == request_id or (attempt is not None and data.get("id") == FINISHED
                                        and data.get("attempt") == attempt):
        return data
    return None


def clear(run_dir: Path, control: Optional[Control] = None) -> None:
    """Back to empty records (see prepare): the next group reads no request."""
    try:
        prepare(run_dir, control)
    except (OSError, AttemptEnded):  # the next group ignores a request of another size or attempt anyway
        pass


def hold(seconds: float = HOLD_S) -> None:
    """A checkpointed worker waits for the controller to shut its group down (it kills the worker); if that
    never comes, it ends the group itself."""
    time.sleep(seconds)
    raise ResizeNotApplied(f"checkpointed for a resize that did not come within {seconds:.0f} s; the group ends and "
                           f"resumes from that checkpoint")


def wait_answered(run_dir: Path, request_id: str, timeout_s: float, poll_s: float = POLL_S,
                  attempt: Optional[int] = None) -> Optional[dict]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        held = answered(run_dir, request_id, attempt)
        if held is not None:
            return held
        time.sleep(poll_s)
    return answered(run_dir, request_id, attempt)


def coordinator_callback(run_dir: Path, attempt: Optional[int], refresh: bool = True) -> Any:
    """The controller callback of every elastic run (a Ray Train function's too) that keeps Ray's
    AutoscalingCoordinator's view of the nodes current (see the module's doc) and records a group start that failed.
    refresh=False (RAYTRAIN_ELASTIC_REFRESH_COORDINATOR=0) leaves the coordinator as Ray made it: it puts back Ray's
    own view of the nodes, should an earlier run have changed it."""
    from ray.train.v2._internal.exceptions import WorkerGroupStartupFailedError, WorkerGroupStartupTimeoutError
    from ray.train.v2._internal.execution.callback import ControllerCallback
    from ray.train.v2._internal.execution.controller.state import (
        ReschedulingState,
        RestartingState,
        RunningState,
    )
    from ray.train.v2._internal.execution.scaling_policy.elastic import ElasticScalingPolicy

    retrying = (RestartingState, ReschedulingState)

    class CoordinatorRefresh(ControllerCallback):
        def __init__(self) -> None:
            self.warned = False
            self.refreshed = float("-inf")

        def after_controller_start(self, train_run_context: Any) -> None:
            self._refresh(skip_draining=refresh)

        def after_controller_state_update(self, previous_state: Any, current_state: Any) -> None:
            if isinstance(current_state, ReschedulingState) and not isinstance(previous_state, retrying):
                self._record_failed_start(current_state.training_failed_error)
            if not refresh:
                return
            entering_retry = isinstance(current_state, retrying) and not isinstance(previous_state, retrying)
            if entering_retry:
                # The next step decides the new group's size from the coordinator's allocation (before the old
                # group is shut down): have it count the nodes as they are now, a drained one left out. The
                # policy answers from its last query for GET_RESERVED_RESOURCES_INTERVAL_S (1 s), which may
                # predate the refresh: wait that out, a second against Ray Train's 30 s start timeout.
                began = time.monotonic()
                if self._refresh():
                    time.sleep(max(0.0, ElasticScalingPolicy.GET_RESERVED_RESOURCES_INTERVAL_S
                                   - (time.monotonic() - began)))
            elif isinstance(current_state, (RunningState, *retrying)) and \
                    time.monotonic() - self.refreshed >= COORDINATOR_REFRESH_S:
                # A node that came back counts within seconds, not at the coordinator's next tick; a retry that
                # waits for min workers (the controller's loop turns Restarting -> Restarting) is throttled alike.
                self._refresh()

        def _record_failed_start(self, error: Any) -> None:
            """A group start that failed (Ray Train's start timeout: it counted a node that is gone) cost the run
            that timeout: the run's records say so. Other failures of a start (a callback's) are not this."""
            # Ray Train wraps it: ControllerError(controller_failure), whose own message starts with a header line
            failure = getattr(error, "controller_failure", None) or error
            if not attempt or not isinstance(failure, (WorkerGroupStartupTimeoutError, WorkerGroupStartupFailedError)):
                return
            cause = (str(failure).strip().splitlines() or ["no cause given"])[0][:300]
            try:
                runrecords.Records(run_dir, WorkerControl(run_dir, attempt)).append_event(
                    "warning", attempt=attempt,
                    message=f"Ray Train could not start the worker group ({cause}); it starts one again with the "
                            f"workers that fit now")
            except Exception as err:  # a record is never worth failing the controller (nor its failure count)
                logger.warning("raytrain: could not record a failed group start: %s", err)

        def _refresh(self, skip_draining: bool = True) -> bool:
            self.refreshed = time.monotonic()
            try:
                rayinternals.refresh_autoscaling_coordinator(skip_draining=skip_draining)
                return True
            except Exception as err:  # never fail the controller over it: the coordinator's own tick comes
                if not self.warned:
                    self.warned = True
                    logger.warning("raytrain: could not have Ray's AutoscalingCoordinator leave drained nodes out "
                                   "(%s); a group restarted after a drain may wait out Ray Train's start timeout "
                                   "(RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S) first", err)
                return False

    return CoordinatorRefresh()


def resize_checkpoint_callback(run_dir: Path, attempt: int, timeout_s: float = CHECKPOINT_TIMEOUT_S) -> Any:
    """The controller callback (see the module's doc). Made here so that Ray Train's internals are imported only on
    the driver of an elastic run."""
    from ray.train.v2._internal.execution.callback import ControllerCallback
    from ray.train.v2._internal.execution.controller.state import ResizingState

    class ResizeCheckpoint(ControllerCallback):
        def __init__(self) -> None:
            self.resizing_running_group = False

        def after_controller_state_update(self, previous_state: Any, current_state: Any) -> None:
            # Running -> Resizing -> Scheduling, then the resize decision (controller.py _step): ResizingState
            # comes only from a running group. A (re)start after a failure reaches Scheduling from elsewhere and
            # has no group to checkpoint.
            self.resizing_running_group = isinstance(previous_state, ResizingState)

        def before_controller_execute_resize_decision(self, resize_decision: Any) -> None:
            if not self.resizing_running_group:
                return
            self.resizing_running_group = False
            try:
                self._checkpoint_first(int(resize_decision.num_workers))
            except Exception as err:  # never fail the controller over it: resize as Ray Train would
                logger.warning("raytrain: the checkpoint before the resize failed (%s); resizing anyway", err)

        def _checkpoint_first(self, to_workers: int) -> None:

            control = WorkerControl(run_dir, attempt)  # fenced: this attempt's run only
            records = runrecords.Records(run_dir, control)
            try:
                request_id = request(run_dir, attempt, to_workers, control)
            except AttemptEnded:  # a newer attempt holds the run: it is not ours to checkpoint
                return
            try:
                held = wait_answered(run_dir, request_id, timeout_s, attempt=attempt)
                if held is not None and held.get("ending") == "resizing":
                    records.append_event("resizing", workers=to_workers, checkpoint=held.get("checkpoint"),
                                         attempt=attempt,
                                         message=f"Ray Train resizes the worker group to {to_workers} workers; it "
                                                 f"checkpointed at its step ({held.get('checkpoint')}) first")
                elif held is None:
                    records.append_event(
                        "warning", message=f"the workers did not checkpoint within {timeout_s:.0f} s of Ray Train's "
                                           f"resize to {to_workers} workers; resized anyway (the steps since the last "
                                           f"checkpoint train again). Fix: raise RAYTRAIN_RESIZE_CHECKPOINT_TIMEOUT_S "
                                           f"(on the driver) above one step plus one checkpoint write.")
                # else: the group ended another way (stopped, drained, done) and said so: nothing to add
            except AttemptEnded:
                return
            finally:
                clear(run_dir, control)

    return ResizeCheckpoint()
