"""One writer per run: a lease on STORAGE/NAME/ that works between pods on different nodes over NFS, and on an
object store (S3, GCS) where a claim is created by a conditional PUT (If-None-Match: *) instead of link().

Files, beside the run's own:
  .lease/<token>.json  one claim per attempt, created once with link(): an exclusive create that is atomic on the
                       NFS server (O_EXCL is only atomic from NFSv3 on; link() always is). The number is the
                       attempt's fencing token: each claim takes the highest seen + 1 and exactly one contender
                       gets each number, so tokens only grow.
  lease.json           the current holder and its last renewal, replaced by rename by the holder alone. A reader
                       open()s it by name, and NFS's close-to-open consistency gives it what the last writer
                       closed (a directory listing or a lookup of a missing name can be cached for up to a
                       minute; the open of an existing name is not).

flock/fcntl locks are not used: they are local to a node (or depend on NFS lock daemons that a pod restart
loses). Liveness is a renewal time: a holder that stops renewing for `ttl_s` seconds (its process or node
died, or it is paused) is taken over. That compares the taker's clock with the holder's: node clocks must
agree to well within ttl_s (NTP keeps them within milliseconds).

A holder gives itself up first: one that has not renewed for 3/4 of ttl_s on its own monotonic clock (it was
paused, or the storage hung) stops committing before anyone may take over. Every commit (config.yaml, metrics
rows, result.json, checkpoints) first checks that lease.json still names its token (RunControl.check on the driver,
WorkerControl.check on workers: raytrain.rundir.runcontrol). The race that remains: a writer that passes the check and is then paused (SIGSTOP, a
VM freeze) between the check and its rename can still land one write after a takeover. It is bounded to that
one in-flight write, and the new holder does not write before its preflight and Ray start (seconds) and drops
rows past its restored checkpoint, so the stale row is overwritten rather than kept.

The holder writes lease.json from two threads (the renewal, and the main thread's stop request): each write builds
its record and replaces the file under one lock, so a slow renewal never overwrites a stop request with a record
built before it. raytrain.rundir.runcontrol wraps the lease into the process's one run-control object.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Optional

from raytrain.errors import RaytrainError
from raytrain.rundir import atomicfile, layout, storage

DEFAULT_TTL_S = 30.0
# A holder gives up after this share of ttl_s without a renewal, before anyone may take over (the rest is the
# margin for clock skew between nodes).
SELF_EXPIRY = 0.75
RENEWALS_PER_TTL = 5


class LeaseHeld(RaytrainError):
    """Another live attempt holds the run; str() is one paragraph for the user."""


class LeaseLost(RaytrainError):
    """This attempt's lease was taken over (or could not be renewed in time): it must not commit anything."""


@dataclass(frozen=True)
class Holder:
    token: int
    host: str
    pid: int
    since: float
    renewed: float
    ttl_s: float
    released: bool = False

    def expires(self) -> float:
        return self.renewed + self.ttl_s

    def live(self, now: float) -> bool:
        return not self.released and now < self.expires()

    def describe(self, now: float) -> str:
        return (f"attempt {self.token} on host {self.host}, pid {self.pid}, running since {_utc(self.since)}, "
                f"last renewed {max(now - self.renewed, 0):.0f} s ago")


def _utc(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))


def _holder(data: Optional[dict]) -> Optional[Holder]:
    try:
        return Holder(**{k: data[k] for k in ("token", "host", "pid", "since", "renewed", "ttl_s")},
                      released=bool(data.get("released", False))) if data else None
    except (KeyError, TypeError):
        return None


def _create_exclusive(path: Path, data: dict) -> bool:
    """Create `path` holding `data` unless it exists, atomically, also on NFS: write a private file, link() it
    to the name. If the server did the link but its reply was lost, the client sees EEXIST: the private file's
    link count (2) says that it was ours after all. On an object store: a conditional PUT (If-None-Match: *)."""
    if storage.is_remote(path):
        return storage.create_exclusive(path, json.dumps(data).encode("utf-8"))
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    tmp.write_text(json.dumps(data), encoding="utf-8")
    try:
        os.link(tmp, path)
        return True
    except FileExistsError:
        return os.stat(tmp).st_nlink == 2
    finally:
        tmp.unlink(missing_ok=True)


def _claims(run_dir: Path) -> list[int]:
    names = storage.listdir(run_dir / layout.CLAIMS_DIR)
    return sorted(int(n[:-5]) for n in names if n.endswith(".json") and n[:-5].isdigit())


def current_holder(run_dir: Path) -> Optional[Holder]:
    """The newest claim and its liveness: lease.json when it names that claim, else the claim's own record (a
    claimant between its claim and its first write of lease.json, or one that crashed there)."""
    pointer = _holder(atomicfile.read_record(run_dir / layout.LEASE_FILE))
    newest = max(_claims(run_dir), default=0)
    if pointer is not None and pointer.token >= newest:
        return pointer
    return _holder(atomicfile.read_record(run_dir / layout.CLAIMS_DIR / f"{newest}.json")) if newest else pointer


def held_message(run_dir: Path, holder: Holder, now: float) -> str:
    return (f"run directory {run_dir} is in use by another attempt of this run ({holder.describe(now)}): it renewed "
            f"its lease while this start watched, so it is running. Two attempts writing one run would mix their "
            f"checkpoints and metrics. Fix: wait for it to finish or stop it, start this one with --wait-for-lease "
            f"to take over as soon as it ends, or train under another --name. (An attempt that dies without "
            f"releasing its lease needs no flag: it is taken over {holder.ttl_s:.0f} s after its last renewal.)")


def token_in(run_dir: Path) -> int:
    """The token lease.json names now (0 without one)."""
    pointer = _holder(atomicfile.read_record(run_dir / layout.LEASE_FILE))
    return pointer.token if pointer else 0


def read_signal(run_dir: Path, token: int) -> Optional[tuple[int, Optional[str]]]:
    """For workers at a step boundary, from lease.json (the channel every node reads consistently): (the newer
    attempt's token, None) when a newer attempt holds the run, (0, the driver's stop reason) when attempt `token`
    was asked to stop, else None. A takeover is never read as a stop request, nor the reverse."""
    data = atomicfile.read_record(storage.as_path(run_dir) / layout.LEASE_FILE) or {}
    current = data.get("token", 0)
    if not isinstance(current, int) or isinstance(current, bool):
        return None
    if current > token:
        return current, None
    stop = data.get("stop")
    return (0, str(stop)) if current == token and stop else None


class Lease:
    """The driver's lease: acquired once, renewed by a thread, released at the end of the attempt."""

    def __init__(self, run_dir: Path, ttl_s: float = DEFAULT_TTL_S,
                 on_lost: Optional[Callable[[str], None]] = None):
        self.run_dir, self.token = storage.as_path(run_dir), 0
        self.ttl_s = float(ttl_s)
        self.on_lost = on_lost
        self.host, self.pid = socket.gethostname(), os.getpid()
        self.since = 0.0
        self.renewed_mono = 0.0  # monotonic time of the read that began the last successful renewal
        self.lost: Optional[str] = None
        self.stop_reason: Optional[str] = None
        self.storage_error: Optional[str] = None  # the last OSError of a renewal (e.g. no space left on device)
        # lease.json is written by the renewal thread and by request_stop/release: one record at a time.
        self._write_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    # -- acquiring

    def acquire(self, wait: bool = False, poll_s: float = 1.0, notify: Callable[[str], None] = lambda _: None,
                ) -> "Lease":
        """Take the lease. A holder that stopped renewing (its attempt died: a killed driver, a lost pod, the
        RayJob's retry after either) is taken over once its renewal is ttl_s old. One that renews while this
        start watches is running: LeaseHeld names it, or with `wait` this start waits until it ends."""
        storage.makedirs(self.run_dir / layout.CLAIMS_DIR)
        watched: Optional[Holder] = None
        while True:
            now = time.time()
            holder = current_holder(self.run_dir)
            if holder is not None and holder.live(now):
                renewed = watched is not None and (holder.token, holder.renewed) != (watched.token, watched.renewed)
                if renewed and not wait:
                    raise LeaseHeld(held_message(self.run_dir, holder, now))
                if watched is None:
                    takeover = f"taken over at {_utc(holder.expires())} (in {holder.expires() - now:.0f} s)"
                    notify(f"run directory {self.run_dir} is held by {holder.describe(now)}; " + (
                        f"waiting until it ends (if it has died, it is {takeover})" if wait else
                        f"watching its lease: if it renews, that attempt is running and this one stops; if not, it "
                        f"has died and is {takeover}"))
                watched = holder
                time.sleep(poll_s)
                continue
            token = max(holder.token if holder else 0, max(_claims(self.run_dir), default=0)) + 1
            claimed = time.monotonic()
            record = self._record(token, now, now)
            # A contender that looked at a stale view still cannot take a number someone else holds: each
            # number is created once. One paused after its claim gives itself up at its first check().
            if not _create_exclusive(self.run_dir / layout.CLAIMS_DIR / f"{token}.json", record):
                continue  # another contender got this number first: look again
            self.token, self.since, self.renewed_mono = token, now, claimed
            self._write(record)
            self._thread = threading.Thread(target=self._renew_loop, name="raytrain-lease", daemon=True)
            self._thread.start()
            return self

    def _record(self, token: int, since: float, renewed: float, released: bool = False) -> dict:
        record = asdict(Holder(token=token, host=self.host, pid=self.pid, since=since, renewed=renewed,
                               ttl_s=self.ttl_s, released=released))
        return {**record, "stop": self.stop_reason} if self.stop_reason else record

    def _write(self, record: dict) -> None:
        """Replace lease.json (durable: a takeover on another node must see it)."""
        atomicfile.write_atomic(self.run_dir / layout.LEASE_FILE, json.dumps(record), durable=True)

    def _write_current(self, released: bool = False) -> None:
        """Build this holder's record and write it, under the lock: a stop request set meanwhile is never lost."""
        with self._write_lock:
            self._write(self._record(self.token, self.since, time.time(), released))

    def request_stop(self, reason: str) -> None:
        """Ask this attempt's workers to checkpoint at their next step boundary and end (read_signal)."""
        with self._write_lock:
            self.stop_reason = reason
        self.check()
        self._write_current()

    # -- holding

    def check(self) -> None:
        """Raise LeaseLost unless this attempt still holds the run (called before every commit)."""
        if self.lost is None and time.monotonic() - self.renewed_mono > self.ttl_s * SELF_EXPIRY:
            cause = f"the storage failed: {self.storage_error}" if self.storage_error else \
                "paused, or the storage unreachable"
            silent = f"it could not renew its lease for {time.monotonic() - self.renewed_mono:.0f} s ({cause})"
            try:
                newer = token_in(self.run_dir)
            except OSError:
                newer = 0
            self._lose(f"attempt {self.token} lost run directory {self.run_dir} to attempt {newer}: {silent}"
                       if newer > self.token else
                       f"attempt {self.token} gave up run directory {self.run_dir}: {silent}, so another attempt "
                       f"may take the run over")
        if self.lost is None:
            newer = token_in(self.run_dir)
            if newer > self.token:
                self._lose(f"attempt {self.token} lost run directory {self.run_dir} to attempt {newer}; it commits "
                           f"nothing more")
        if self.lost is not None:
            raise LeaseLost(self.lost)

    def _lose(self, reason: str) -> None:
        if self.lost is None:
            self.lost = reason
            self._stop.set()
            if self.on_lost is not None:
                self.on_lost(reason)

    def renew(self) -> None:
        began = time.monotonic()
        self.check()
        newest = max(_claims(self.run_dir), default=0)
        if newest > self.token:
            newer = _holder(atomicfile.read_record(self.run_dir / layout.CLAIMS_DIR / f"{newest}.json"))
            if newer is not None and newer.live(time.time()):
                self._lose(f"attempt {self.token} lost run directory {self.run_dir} to attempt {newest}")
                raise LeaseLost(self.lost)
        if time.monotonic() - began > self.ttl_s * SELF_EXPIRY / 2:
            return  # this renewal took too long to be trusted; check() decides at the next one
        self._write_current()
        self.renewed_mono = began
        self.storage_error = None

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.ttl_s / RENEWALS_PER_TTL):
            try:
                self.renew()
            except LeaseLost:
                return
            except OSError as err:  # storage hiccup: check() gives the lease up if it lasts, naming the error
                self.storage_error = f"{err.strerror or err} ({err.filename or self.run_dir})"
                continue

    def stop_renewing(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def release(self) -> None:
        """Let the next attempt start at once (only while this attempt still holds the run). On storage that
        refuses the write (full, read-only) the lease is left to expire: the next start takes over after the TTL."""
        self.stop_renewing()
        try:
            if self.token and self.lost is None and token_in(self.run_dir) == self.token:
                self._write_current(released=True)
        except OSError:
            pass
