"""One attempt of a run: the one path `raytrain run`, `raytrain local` and each `raytrain tune` trial take.

In the driver, in this order:
1. the storage is checked and the run's lease taken into the process's run control (raytrain.driver.runstart,
   raytrain.rundir.runcontrol: a dead holder is taken over after the TTL; a running one refuses the start, naming it, or
   is awaited with --wait-for-lease);
2. the resume is checked (staging directories removed, a refused change named: raytrain.checkpoint.resume); when
   the checkpoint it resumes from already holds the run's last epoch (runstart.nothing_to_train), the attempt ends
   here, before Ray starts or anything is built: the line says so, events.jsonl records a `nothing_to_train`
   event, the result.json of the attempt that trained it stays (any other is replaced by a succeeded one: the
   run is finished), and the exit is 0. Not for a Tune trial (skip_finished=False: Tune waits for its
   reports) nor a Ray Train function (it alone knows its end);
3. the model builds, config.yaml is written, the data is prepared once (runstart.start_run); with run.tracking,
   the tracker syncer starts (raytrain.driver.tracking: a thread that sends the final metrics rows; never waited for);
4. the trainer's body runs in a thread (Ray Train, or the loop in this process), while this thread owns SIGTERM
   and Ctrl-C (Ray's own handlers are only installed from the main thread);
5. this thread writes the result: the body never does. "succeeded", "failed" (the error in one paragraph),
   "stopped" (a signal: the workers were asked to checkpoint at their next step, and given stop_grace_s), or
   nothing at all when the lease was lost to a newer attempt, which owns the run's files now. Then the syncer's
   last sync, bounded.
Then the run control is closed (any late writer of this attempt is refused) and the lease released.

A bug of raytrain's own (an exception that is neither a RaytrainError nor the user's code failing) is not
reported as a training failure: its traceback is printed and kept in the run's driver log, result.json says
"failed" with the exception, and it is raised.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Protocol, TextIO

from raytrain.checkpoint import checkpoints, resume
from raytrain.driver import preflight, runstart, trackers, tracking
from raytrain.errors import RaytrainError
from raytrain.lifecycle.endings import REACTIONS, AttemptEnded, Ending
from raytrain.platform.processes import kill_pids, process_start, tree_pids
from raytrain.rundir import console, layout, runrecords
from raytrain.rundir import lease as leases
from raytrain.rundir.runcontrol import RunControl
from raytrain.spec.sections import RunConfig

# How long a stopping driver waits for its workers to checkpoint at their next step and end. Kubernetes gives a
# pod terminationGracePeriodSeconds (default 30 s) between SIGTERM and SIGKILL; this leaves ~10 s of it for
# stopping Ray and writing result.json. A step plus one checkpoint upload must fit: give the pods more grace
# (and raise this with RAYTRAIN_STOP_GRACE_S, read by the cli) when a checkpoint takes longer to write.
STOP_GRACE_S = 20.0

SIGNAL_HINTS = {
    signal.SIGTERM: "SIGTERM: the pod is being deleted, the job stopped, or the process was asked to end",
    signal.SIGINT: "Ctrl-C",
}


@dataclass
class Outcome:
    run_dir: Path
    result: dict
    nothing_to_train: str | None = None  # the line said instead of training a finished run (no Ray started)

    @property
    def ok(self) -> bool:
        return self.result["status"] == Ending.SUCCEEDED.value


class NotFinished(Exception):
    """An attempt run without a trainer (only to end a run with nothing left to train, raytrain.cli's start before
    the full config load) found, under the lease, something to train after all: its newest checkpoint was damaged
    or removed since the look before the lease. It ended without writing a result and released the lease; the
    caller starts the run in full (a new attempt)."""


class Trainer(Protocol):
    """The body of an attempt: trains the run, commits only through `records` (fenced by its run control)."""

    embedded_ray: bool  # starts a Ray of its own, which a watchdog must stop if this process dies

    def train(self, records: runrecords.Records) -> None:
        """Train to the end, or return early when the attempt was asked to stop (records.control.poll()). Raise
        RaytrainError for an expected failure (its message is the result's error)."""

    def close(self) -> None:
        """Called in the body's thread after train(), unless the lease was lost (e.g. shut an embedded Ray down)."""


def summarize(run_dir: Path, status: str, started: float, error: Optional[str] = None) -> dict:
    rows = runrecords.read_metrics(run_dir)
    starts = [e for e in runrecords.read_events(run_dir) if e.get("event") == "start" and e.get("time", 0) >= started]
    resumes = [e["resumed_from_epoch"] for e in starts if e.get("resumed_from_epoch") is not None]
    newest = checkpoints.newest_complete(run_dir)
    result = {
        "status": status,
        "epochs_completed": rows[-1]["epoch"] if rows else 0,
        # The latest resume point of this invocation (null when it trained from scratch throughout).
        "resumed_from_epoch": resumes[-1] if resumes else None,
        "resumes": resumes,
        "worker_group_starts": len(starts),
        "metrics": rows[-1] if rows else {},
        "run_dir": str(run_dir),
        "checkpoint": str(newest) if newest else None,
        "duration_s": round(time.time() - started, 3),
    }
    if error:
        result["error"] = error
    return result


def start_watchdog(driver_pid: int) -> subprocess.Popen:
    """A process that outlives the driver and stops what is left of the embedded Ray it started (gcs, raylet,
    workers, agents) once the driver's pipe closes: when the driver ends, or dies, even by SIGKILL."""
    return subprocess.Popen(
        [sys.executable, "-c", f"from raytrain.driver.attempt import watchdog; watchdog({driver_pid})"],
        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )


def watchdog(driver_pid: int, interval_s: float = 1.0) -> None:
    """The watchdog's body: remember the driver's descendants; when it dies, stop those still running."""

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the driver; it tells us by its pipe
    selector = selectors.DefaultSelector()
    selector.register(sys.stdin, selectors.EVENT_READ)
    known: dict[int, Optional[float]] = {}
    while True:
        for pid in tree_pids(driver_pid)[1:]:
            known.setdefault(pid, process_start(pid))
        if selector.select(timeout=interval_s) and not sys.stdin.readline():
            break  # EOF: the driver ended or is gone
    alive = [pid for pid, start in known.items() if start is not None and process_start(pid) == start]
    kill_pids(alive, grace=2.0)


class Attempt:
    def __init__(self, cfg: RunConfig, *, wait_for_lease: bool = False, lease_ttl_s: float = leases.DEFAULT_TTL_S,
                 stop_grace_s: float = STOP_GRACE_S, out: Optional[TextIO] = None, handle_signals: bool = True,
                 skip_finished: bool = True):
        self.cfg = cfg
        self.skip_finished = skip_finished  # end before training when there is nothing left to train
        self.out = out if out is not None else sys.stdout  # now, not when this module was imported
        self.stop_grace_s = stop_grace_s
        self.wait_for_lease, self.lease_ttl_s = wait_for_lease, lease_ttl_s
        self.handle_signals = handle_signals and threading.current_thread() is threading.main_thread()
        self.run_dir = runrecords.run_dir_of(cfg.run.storage_path, cfg.run.name)
        self.stop_reason: Optional[str] = None
        self.stop_signal: Optional[int] = None
        self.lost: Optional[str] = None
        self.wake = threading.Event()
        self.watchdog: Optional[subprocess.Popen] = None
        # The body's thread when it was left inside Ray (stopped, lease lost): the process must then end with
        # os._exit, as an interpreter exit with that thread in Ray's C++ code crashes.
        self.left_running: Optional[threading.Thread] = None
        self.syncer: Optional[tracking.Syncer] = None  # run.tracking's: sends final metrics rows to the trackers

    def say(self, message: str, event: str = "attempt", **fields) -> None:
        console.info(event, message, out=self.out, **fields)

    def _on_lost(self, reason: str) -> None:
        self.lost = reason
        self.wake.set()

    def _on_signal(self, signum: int, frame) -> None:
        if self.stop_signal is not None:  # a second one: do not wait for anything
            self.say(f"received {signal.Signals(signum).name} again: stopping now")
            os._exit(128 + signum)
        self.stop_signal = signum
        self.stop_reason = SIGNAL_HINTS.get(signum, signal.Signals(signum).name)
        self.wake.set()

    def run(self, trainer: Trainer | None) -> Outcome:
        """trainer None: only end a finished run (nothing_to_train); NotFinished, the lease released, if it is not."""
        started = time.time()
        trackers.check_installed(trackers.configured(self.cfg))
        preflight.check_tracking_destination(self.cfg)
        control = runstart.take_lease(self.cfg, self.lease_ttl_s, wait=self.wait_for_lease, notify=self.say,
                                       on_lost=self._on_lost)
        records = runrecords.Records(self.run_dir, control)
        previous: dict = {}
        try:
            log = console.copy_destination()
            self.say(f"attempt {control.token} holds run {self.cfg.run.name} (lease "
                     f"{self.run_dir / layout.LEASE_FILE}" + (f", driver log {log}" if log else "") + ")",
                     attempt=control.token)
            plan = runstart.check_resume(self.cfg, records)
            finished = runstart.nothing_to_train(self.cfg, plan) if self.skip_finished else None
            if finished is not None:
                return self._nothing_to_train(records, control, started, plan, finished)
            if trainer is None:
                control.close("the attempt ended: the run has something to train, the caller starts it in full")
                raise NotFinished(f"run {self.cfg.run.name} has something to train after all (resuming after "
                                  f"epoch {plan.epoch})")
            runstart.announce_applied(plan)
            runstart.start_run(self.cfg, records,
                                lambda directory, error: summarize(directory, Ending.FAILED.value, started, error))
            self.syncer = tracking.start(self.cfg, records, self.out)
            if self.handle_signals:
                previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
            if trainer.embedded_ray:
                self.watchdog = start_watchdog(os.getpid())
            box: dict = {}

            def body() -> None:
                try:
                    trainer.train(records)
                except BaseException as error:  # handed to the main thread
                    box["error"] = error
                finally:
                    # Shut Ray down in the thread that started it: an embedded Ray's gcs and raylet are forked
                    # with PR_SET_PDEATHSIG=SIGKILL (ray._private.utils), which fires when the forking *thread*
                    # exits; left to the main thread, they were SIGKILLed here and ray.shutdown() then spent
                    # 13-20 s in timeouts talking to them.
                    if self.lost is None:
                        trainer.close()
                    self.wake.set()

            if not self.handle_signals:  # no signals to own (a Tune trial's thread): the body runs right here
                body()
                return self._conclude(records, control, started, box)
            worker = threading.Thread(target=body, name="raytrain-attempt", daemon=True)
            worker.start()
            while worker.is_alive() and self.stop_reason is None and self.lost is None:
                self.wake.wait(0.5)
                self.wake.clear()
            if self.lost is None and self.stop_reason is not None:
                self._let_workers_checkpoint(control, worker)
            if worker.is_alive():
                self.left_running = worker
            return self._conclude(records, control, started, box)
        finally:
            if self.syncer is not None:
                self.syncer.abandon()  # no-op after its last sync; otherwise the attempt ended without a result
            for s, handler in previous.items():
                signal.signal(s, handler)
            self._end_watchdog(wait=False)
            control.release()

    def _conclude(self, records: runrecords.Records, control: RunControl, started: float, box: dict) -> Outcome:
        """The result, written by this thread alone."""
        error = box.get("error")
        if isinstance(error, AttemptEnded) and error.ending is Ending.LEASE_LOST:
            self.lost = self.lost or error.reason
        if self.lost is not None:
            control.close(self.lost)
            raise leases.LeaseLost(f"{self.lost}. This attempt stopped without writing anything more; the attempt "
                                   f"that holds the run now owns its files.")
        if self.stop_reason is not None:
            if self.left_running is not None:  # a shutdown under the body's thread would crash: the watchdog
                self._end_watchdog(wait=True)  # stops Ray's processes, so that the result counts what they wrote
            return self._write(records, control, self._stopped(started))
        if isinstance(error, AttemptEnded) and error.ending is Ending.FAILED:  # a diverged loss (the session)
            return self._write(records, control, summarize(self.run_dir, Ending.FAILED.value, started,
                                                           error.reason))
        if isinstance(error, AttemptEnded):  # the loop ended itself the way a stop does (a local drain, say)
            status = REACTIONS[error.ending].result or Ending.STOPPED
            return self._write(records, control, summarize(self.run_dir, status.value, started, error.reason))
        if isinstance(error, RaytrainError):
            self._write(records, control, summarize(self.run_dir, Ending.FAILED.value, started, str(error)))
            raise error
        if error is not None:
            # raytrain's own bug, not the user's: keep the traceback (console and the run's driver log)
            trace = "".join(traceback.format_exception(error)).rstrip()
            console.error(f"raytrain hit an unexpected error; please report it with this traceback:\n{trace}")
            self._write(records, control, summarize(self.run_dir, Ending.FAILED.value, started,
                                                    f"unexpected error in raytrain: {error.__class__.__name__}: "
                                                    f"{error}"))
            raise error
        return self._write(records, control, summarize(self.run_dir, Ending.SUCCEEDED.value, started))

    def _nothing_to_train(self, records: runrecords.Records, control: RunControl, started: float,
                          plan: resume.ResumePlan, line: str) -> Outcome:
        """A finished run started again: nothing was built or trained. The result of the attempt that trained it
        stays (succeeded, naming the checkpoint this start would resume from); any other (none, one of an older
        checkpoint, or failed or stopped after the last checkpoint was committed) is replaced by this attempt's,
        succeeded, since the run's last epoch is in that checkpoint."""
        records.append_event("nothing_to_train", message=line, checkpoint=plan.checkpoint.name if plan.checkpoint
                             else None, epoch=plan.epoch, step=plan.step, epochs=self.cfg.train.epochs,
                             attempt=control.token)
        previous = runrecords.read_result(self.run_dir)
        if (previous is not None and previous.get("status") == Ending.SUCCEEDED.value and plan.checkpoint is not None
                and Path(str(previous.get("checkpoint"))).name == plan.checkpoint.name):
            control.close("the attempt ended (nothing to train)")
            return Outcome(self.run_dir, previous, nothing_to_train=line)
        result = summarize(self.run_dir, Ending.SUCCEEDED.value, started)
        result["nothing_to_train"] = line
        outcome = self._write(records, control, result)
        outcome.nothing_to_train = line
        return outcome

    def _write(self, records: runrecords.Records, control: RunControl, result: dict) -> Outcome:
        if self.syncer is not None and self.syncer.ids():
            result["tracking"] = self.syncer.ids()
        try:
            records.write_result(result)
        except OSError as err:  # a full or read-only disk: the outcome is still said on the console
            console.warning(f"could not write {self.run_dir / layout.RESULT_FILE}: {err.strerror or err}", out=self.out)
        if self.syncer is not None:  # after the result (a stopping pod's grace is short), while the run is still ours
            self.syncer.finish(result["status"])
        control.close(f"the attempt ended ({result['status']})")
        return Outcome(self.run_dir, result)

    def _let_workers_checkpoint(self, control: RunControl, worker: threading.Thread) -> None:
        """Ask the workers to checkpoint at their next step boundary and end; wait stop_grace_s for them."""
        self.say(f"received {self.stop_reason}: the workers checkpoint at their next step and stop (waiting up "
                 f"to {self.stop_grace_s:.0f} s; a second signal stops at once)")
        try:
            control.request_stop(self.stop_reason)
        except (leases.LeaseLost, OSError) as err:
            console.warning(f"could not ask the workers to stop ({err}); stopping now", out=self.out)
            return
        asked = time.time()
        worker.join(self.stop_grace_s)
        if worker.is_alive():
            # Their group may have checkpointed and ended already (a drain of their nodes came first) while Ray
            # Train waits for a new group that cannot start: say when the newest checkpoint was committed.
            newest = checkpoints.newest_complete(self.run_dir)
            try:
                age = asked - newest.stat().st_mtime if newest is not None else None
            except OSError:
                age = None
            lost = (f"work since the newest checkpoint, {newest.name}, committed {age:.0f} s before the stop "
                    f"request, is lost" if newest is not None and age is not None and age >= 0 else
                    f"the newest checkpoint, {newest.name}, was committed during the stop" if newest is not None
                    else "no checkpoint was written")
            console.warning(f"the workers did not stop within {self.stop_grace_s:.0f} s; stopping now ({lost})",
                            out=self.out)

    def _stopped(self, started: float) -> dict:
        name = signal.Signals(self.stop_signal).name if self.stop_signal else "a stop request"
        result = summarize(self.run_dir, Ending.STOPPED.value, started)
        kept = (f"checkpoints written so far are kept (newest: {Path(result['checkpoint']).name}); run the same "
                f"command again to resume from it" if result["checkpoint"] else
                "no checkpoint had been written yet; run the same command again to start over")
        if self.stop_signal:
            result["signal"] = name
        result["error"] = f"stopped by {name} after {result['epochs_completed']} epoch(s); {kept}"
        return result

    def _end_watchdog(self, wait: bool) -> None:
        """Close the watchdog's pipe: it stops the embedded Ray's processes that are still running."""
        if self.watchdog is None:
            return
        try:
            self.watchdog.stdin.close()
        except OSError:
            pass
        if wait:
            try:
                self.watchdog.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        self.watchdog = None


def run_attempt(cfg: RunConfig, trainer: Trainer | None, report: Callable[[Outcome], int], *,
                wait_for_lease: bool = False, lease_ttl_s: float = leases.DEFAULT_TTL_S,
                stop_grace_s: float = STOP_GRACE_S, out: Optional[TextIO] = None) -> int:
    """Run one attempt and return its exit code: report's for an outcome, 128 + the signal when stopped by one.
    trainer None: only end a run with nothing left to train (Attempt.run; NotFinished if it has something)."""
    attempt = Attempt(cfg, wait_for_lease=wait_for_lease, lease_ttl_s=lease_ttl_s, stop_grace_s=stop_grace_s,
                      out=out)
    try:
        outcome = attempt.run(trainer)
        code = report(outcome)
        stopped_by = outcome.result.get("signal")
        return 128 + signal.Signals[stopped_by].value if stopped_by else code
    finally:
        if attempt.left_running is not None:
            _exit_now(attempt, sys.exc_info()[1])


def _exit_now(attempt: Attempt, error: Optional[BaseException]) -> None:
    if error is not None:
        console.error(str(error))
    console.stop_copy(error)
    code = 1 if error is not None else 128 + (attempt.stop_signal or 0)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
