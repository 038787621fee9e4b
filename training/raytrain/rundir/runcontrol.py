"""Run control: who may write a run, and how an attempt ends. One object per process, one exception, one enum.

Every process that trains for a run holds one control object:
- `RunControl` in the driver (`raytrain run`'s attempt, `raytrain local`): it owns the run's lease (raytrain.rundir.lease),
  the fence every commit passes, and the stop decision. Its state changes behind one lock: HOLDING (commits pass
  while the lease is held) -> STOPPING (a stop was requested: the workers' last checkpoint still commits) ->
  CLOSED (the attempt wrote its result: every later writer is refused) or LOST (another attempt took the run
  over: nothing more is written). Only the attempt writes the result (raytrain.driver.attempt), after its body ended.
- `WorkerControl` on a Ray Train worker: the attempt's token. It fences the worker's commits and reads, at step
  boundaries, whether the attempt must end (lease.json carries the driver's stop request to every node).
- `UNFENCED` where no lease is held (a tool reading a run, a test).

How an attempt ends, and what each ending does, is raytrain.lifecycle.endings: the controls here raise its
`AttemptEnded(STOPPED or LEASE_LOST, reason)`.
"""

from __future__ import annotations

import enum
import threading
from pathlib import Path
from typing import Callable, Optional, Protocol

from raytrain.lifecycle.endings import AttemptEnded, Ending
from raytrain.rundir import lease as leases
from raytrain.rundir import storage


class Control(Protocol):
    """What a writer of the run checks before each commit, and what a step boundary asks."""

    token: Optional[int]

    def check(self) -> None:
        """Raise AttemptEnded unless this process may still commit to the run."""

    def poll(self) -> Optional[tuple[Ending, str]]:
        """Whether the attempt must end (STOPPED or LEASE_LOST, and why), or None. May read storage."""


class _Unfenced:
    token: Optional[int] = None

    def check(self) -> None:
        return None

    def poll(self) -> Optional[tuple[Ending, str]]:
        return None


UNFENCED: Control = _Unfenced()


class WorkerControl:
    """A Ray Train worker's view of its attempt: it never renews the lease (the driver does); it stops committing as
    soon as lease.json names a newer attempt, and reads the driver's stop request from the same file."""

    def __init__(self, run_dir: Path, token: int):
        self.run_dir, self.token = storage.as_path(run_dir), int(token)

    def check(self) -> None:
        newer = leases.token_in(self.run_dir)
        if newer > self.token:
            raise AttemptEnded(Ending.LEASE_LOST, f"attempt {self.token} lost run directory {self.run_dir} to "
                                                  f"attempt {newer}; it commits nothing more")

    def poll(self) -> Optional[tuple[Ending, str]]:
        signal = leases.read_signal(self.run_dir, self.token)
        if signal is None:
            return None
        newer, stop = signal
        if newer:
            return Ending.LEASE_LOST, f"attempt {newer} took the run over"
        return Ending.STOPPED, stop


class Phase(enum.Enum):
    HOLDING = "holding"
    STOPPING = "stopping"
    CLOSED = "closed"
    LOST = "lost"


class RunControl:
    """The driver's run control: the lease, the fence and the stop decision behind one lock."""

    def __init__(self, lease: leases.Lease, on_lost: Optional[Callable[[str], None]] = None):
        self.lease = lease
        self.run_dir = lease.run_dir
        self.token: Optional[int] = lease.token
        self._lock = threading.Lock()
        self.phase = Phase.HOLDING
        self.why: Optional[str] = None  # why the phase left HOLDING
        self._on_lost = on_lost
        lease.on_lost = self._lost

    @classmethod
    def acquire(cls, run_dir: Path, ttl_s: float = leases.DEFAULT_TTL_S, *, wait: bool = False,
                notify: Callable[[str], None] = lambda _: None,
                on_lost: Optional[Callable[[str], None]] = None) -> "RunControl":
        lease = leases.Lease(run_dir, ttl_s).acquire(wait=wait, notify=notify)
        return cls(lease, on_lost)

    # -- the fence

    def check(self) -> None:
        with self._lock:
            phase, why = self.phase, self.why
        if phase is Phase.LOST:
            raise AttemptEnded(Ending.LEASE_LOST, why or "the lease was lost")
        if phase is Phase.CLOSED:
            raise AttemptEnded(Ending.STOPPED, why or "the attempt is over: nothing more is written")
        try:
            self.lease.check()
        except leases.LeaseLost as err:
            raise AttemptEnded(Ending.LEASE_LOST, str(err)) from None

    def poll(self) -> Optional[tuple[Ending, str]]:
        with self._lock:
            if self.phase is Phase.LOST:
                return Ending.LEASE_LOST, self.why or "the lease was lost"
            if self.phase is Phase.STOPPING:
                return Ending.STOPPED, self.why or "stop requested"
        return None

    # -- the stop decision

    def request_stop(self, reason: str) -> None:
        """Ask this attempt's workers to checkpoint at their next step and end; from now on only the main thread
        commits. The request reaches the workers through lease.json (written under the lease's own lock, so a
        renewal in flight never overwrites it)."""
        with self._lock:
            if self.phase is not Phase.HOLDING:
                return
            self.phase, self.why = Phase.STOPPING, reason
        self.lease.request_stop(reason)

    def close(self, why: str) -> None:
        """The attempt is over (its result written): any late writer of it is refused."""
        with self._lock:
            if self.phase is not Phase.LOST:
                self.phase, self.why = Phase.CLOSED, why

    def _lost(self, reason: str) -> None:
        with self._lock:
            self.phase, self.why = Phase.LOST, reason
        if self._on_lost is not None:
            self._on_lost(reason)

    @property
    def lost(self) -> Optional[str]:
        with self._lock:
            return self.why if self.phase is Phase.LOST else None

    def release(self) -> None:
        """Let the next attempt start at once, unless the run was lost to one already."""
        if self.lost is None:
            self.lease.release()
        else:
            self.lease.stop_renewing()
