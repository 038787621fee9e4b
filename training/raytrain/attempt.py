"""One attempt of `raytrain run`, around the launcher: what is decided before Ray starts, and how it ends.

Before Ray starts: the storage is writable by this user (raytrain.storage); the run's lease is held
(raytrain.lease: a dead holder is taken over after the TTL; a running one refuses the start, naming it, or is
awaited with --wait-for-lease); torn checkpoints are
removed and the resume is checked (raytrain.preflight.check_resume). The driver's console lines are kept beside the
run by raytrain.console (the cli starts the copy), so a failed attempt's log outlives its pod.

While it trains: SIGTERM (kubelet deleting the head pod, a RayJob being stopped) and Ctrl-C end the attempt with
a message and a result.json that says so ("stopped", the signal), exit 128 + the signal. A lost lease ends it
without writing anything more. With an embedded Ray, a watchdog process stops Ray's processes (workers,
raylet, agents) as soon as the driver dies, even by SIGKILL.

The launcher runs in a thread so that this module, in the main thread, owns the signals (Ray's own SIGINT and
SIGTERM handlers are only installed from the main thread).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

from raytrain import console, preflight, runs
from raytrain import lease as leases
from raytrain.config import RunConfig

if TYPE_CHECKING:
    from raytrain.launcher import Outcome

# How long a stopping driver waits for its workers to checkpoint at their next step and end. Kubernetes gives a
# pod terminationGracePeriodSeconds (default 30 s) between SIGTERM and SIGKILL; this leaves ~10 s of it for
# stopping Ray and writing result.json. A step plus one checkpoint upload must fit: give the pods more grace
# (and raise this with RAYTRAIN_STOP_GRACE_S, read by the cli) when a checkpoint takes longer to write.
STOP_GRACE_S = 20.0

SIGNAL_HINTS = {
    signal.SIGTERM: "SIGTERM: the pod is being deleted, the job stopped, or the process was asked to end",
    signal.SIGINT: "Ctrl-C",
}


class Stopped(Exception):
    """Raised into a fenced writer once the attempt is over: nothing more may be written."""


class _Closed:
    token = 0

    def __init__(self, why: str):
        self.why = why

    def check(self) -> None:
        raise Stopped(self.why)


class _MainThreadOnly:
    """While an attempt stops: the main thread writes the result; the launcher's thread, still finishing, may not."""

    def __init__(self, lease: leases.Lease):
        self.lease, self.token = lease, lease.token

    def check(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            raise Stopped("the attempt is stopping: its result is written by the main thread")
        self.lease.check()


def start_watchdog(driver_pid: int) -> subprocess.Popen:
    """A process that outlives the driver and stops what is left of the embedded Ray it started (gcs, raylet,
    workers, agents) once the driver's pipe closes: when the driver ends, or dies, even by SIGKILL."""
    return subprocess.Popen(
        [sys.executable, "-c", f"from raytrain.attempt import watchdog; watchdog({driver_pid})"],
        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )


def watchdog(driver_pid: int, interval_s: float = 1.0) -> None:
    """The watchdog's body: remember the driver's descendants; when it dies, stop those still running."""
    import selectors

    from raytrain.processes import kill_pids, process_start, tree_pids

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


def _quiet_ray_thread_warning() -> None:
    """ray.init from a thread other than the main one warns that it leaves SIGTERM alone: that is the point."""
    logging.getLogger("ray._private.worker").addFilter(
        lambda record: "SIGTERM handler is not set" not in record.getMessage())


class Attempt:
    def __init__(self, cfg: RunConfig, address: Optional[str], *, wait_for_lease: bool = False,
                 lease_ttl_s: float = leases.DEFAULT_TTL_S, stop_grace_s: float = STOP_GRACE_S,
                 in_submitted_job: bool = False):
        self.cfg, self.address, self.in_submitted_job = cfg, address, in_submitted_job
        self.stop_grace_s = stop_grace_s
        self.wait_for_lease, self.lease_ttl_s = wait_for_lease, lease_ttl_s
        self.run_dir = runs.run_dir_of(cfg.run.storage_path, cfg.run.name)
        self.stop_reason: Optional[str] = None
        self.stop_signal: Optional[int] = None
        self.lost: Optional[str] = None
        self.wake = threading.Event()
        # The launcher's thread when it was left inside Ray (stopped, lease lost): the process must then end
        # with os._exit, as an interpreter exit with that thread in Ray's C++ code crashes.
        self.left_running: Optional[threading.Thread] = None

    @staticmethod
    def say(message: str, event: str = "attempt", **fields) -> None:
        console.info(event, message, **fields)

    @staticmethod
    def warn(message: str) -> None:
        console.warning(message)

    # -- before Ray

    def take_lease(self) -> leases.Lease:
        return preflight.take_lease(self.cfg, self.lease_ttl_s, wait=self.wait_for_lease, notify=self.say,
                                    on_lost=self._on_lost)

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

    # -- the attempt

    def run(self, train: Callable) -> "Outcome":
        from raytrain.launcher import Outcome, summarize

        started = time.time()
        lease = self.take_lease()
        runs.fence_writes(self.run_dir, lease)
        self.watchdog: Optional[subprocess.Popen] = None
        try:
            log = console.copy_path()
            self.say(f"attempt {lease.token} holds run {self.cfg.run.name} (lease {self.run_dir / leases.LEASE_FILE}"
                     + (f", driver log {log}" if log else "") + ")", attempt=lease.token)
            preflight.check_resume(self.cfg, self.run_dir)

            previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
            _quiet_ray_thread_warning()
            # Ray's C++ failure-signal handler catches SIGTERM in the driver, dumps a stack and aborts (exit 134)
            # before this module's handler can end the attempt cleanly. (Ray's processes inherit it: a crash
            # there is still reported by Ray, without the C++ stack.)
            os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")
            if not self.address:
                self.watchdog = start_watchdog(os.getpid())
            box: dict = {}

            def body() -> None:
                try:
                    box["outcome"] = train(self.cfg, address=self.address, lease_token=lease.token,
                                           in_submitted_job=self.in_submitted_job)
                except BaseException as error:  # handed to the main thread
                    box["error"] = error
                finally:
                    # Shut Ray down in the thread that started it: an embedded Ray's gcs and raylet are forked
                    # with PR_SET_PDEATHSIG=SIGKILL (ray._private.utils), which fires when the forking *thread*
                    # exits. Left to the main thread, they were SIGKILLed here and ray.shutdown() then spent
                    # 13-20 s in timeouts talking to them.
                    if self.lost is None:
                        self._shutdown_ray()
                    self.wake.set()

            worker = threading.Thread(target=body, name="raytrain-launcher", daemon=True)
            worker.start()
            while worker.is_alive() and self.stop_reason is None and self.lost is None:
                self.wake.wait(0.5)
                self.wake.clear()
            if worker.is_alive():
                self.left_running = worker
            if self.lost is not None:
                runs.fence_writes(self.run_dir, _Closed(self.lost))
                raise leases.LeaseLost(f"{self.lost}. This attempt stopped without writing anything more; the "
                                       f"attempt that holds the run now owns its files.")
            if self.stop_reason is not None:
                self._let_workers_checkpoint(lease, worker)
                if worker.is_alive():
                    self.left_running = worker
                else:
                    self.left_running = None
                return self._stopped(started, summarize, Outcome)
            for s, handler in previous.items():
                signal.signal(s, handler)
            if "error" in box:
                raise box["error"]
            return box["outcome"]
        finally:
            if self.left_running is None:
                self._shutdown_ray()
            # Ray leaves its dashboard and runtime-env agents running for minutes after a shutdown, and nothing
            # was shut down if the launcher's thread is still inside Ray (an interpreter exit or a shutdown under
            # it crashes): the watchdog stops what is left once the pipe closes.
            self._end_watchdog(wait=False)
            if self.lost is None:
                runs.fence_writes(self.run_dir, None)
                lease.release()

    def _let_workers_checkpoint(self, lease: leases.Lease, worker: threading.Thread) -> None:
        """Ask the workers to checkpoint at their next step boundary and end; wait STOP_GRACE_S for them."""
        runs.fence_writes(self.run_dir, _MainThreadOnly(lease))
        self.say(f"received {self.stop_reason}: the workers checkpoint at their next step and stop (waiting up "
                 f"to {self.stop_grace_s:.0f} s; a second signal stops at once)")
        try:
            lease.request_stop(self.stop_reason)
        except (leases.LeaseLost, OSError) as err:
            self.warn(f"could not ask the workers to stop ({err}); stopping Ray now")
            return
        worker.join(self.stop_grace_s)
        if worker.is_alive():
            self.warn(f"the workers did not stop within {self.stop_grace_s:.0f} s; stopping Ray now (work since the "
                      f"last checkpoint is lost)")

    def _stopped(self, started: float, summarize: Callable, outcome_cls) -> "Outcome":
        name = signal.Signals(self.stop_signal).name
        # Ray's workers stop first, so that the result counts what they wrote.
        if self.left_running is None:
            self._shutdown_ray()
        else:  # a shutdown under the launcher's thread would crash: the watchdog stops Ray's processes
            self._end_watchdog(wait=True)
        result = summarize(self.run_dir, "stopped", started)
        kept = (f"checkpoints written so far are kept (newest: {Path(result['checkpoint']).name}); run the same "
                f"command again to resume from it" if result["checkpoint"] else
                "no checkpoint had been written yet; run the same command again to start over")
        result["signal"] = name
        result["error"] = f"stopped by {name} after {result['epochs_completed']} epoch(s); {kept}"
        runs.write_result(self.run_dir, result)
        runs.fence_writes(self.run_dir, _Closed(f"the attempt was stopped by {name}"))
        return outcome_cls(self.run_dir, result)

    @staticmethod
    def _shutdown_ray() -> None:
        try:
            import ray
        except ImportError:
            return
        if ray.is_initialized():
            ray.shutdown()

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


def run_attempt(cfg: RunConfig, address: Optional[str], report: Callable[["Outcome"], int], *,
                wait_for_lease: bool = False, lease_ttl_s: float = leases.DEFAULT_TTL_S,
                stop_grace_s: float = STOP_GRACE_S, in_submitted_job: bool = False) -> int:
    """Run one attempt and return its exit code: report's for an outcome, 128 + the signal when stopped by one."""
    from raytrain.launcher import train

    attempt = Attempt(cfg, address, wait_for_lease=wait_for_lease, lease_ttl_s=lease_ttl_s,
                      stop_grace_s=stop_grace_s, in_submitted_job=in_submitted_job)
    try:
        outcome = attempt.run(train)
        code = report(outcome)
        stopped_by = outcome.result.get("signal")
        return 128 + signal.Signals[stopped_by].value if stopped_by else code
    finally:
        if attempt.left_running is not None:
            _exit_now(attempt, sys.exc_info()[1])


def _exit_now(attempt: Attempt, error: Optional[BaseException]) -> None:
    if error is not None:
        console.error(str(error))
    console.stop_copy()
    code = 1 if error is not None else 128 + (attempt.stop_signal or 0)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
