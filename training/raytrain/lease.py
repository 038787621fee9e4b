"""One writer per run: a lease on STORAGE/NAME/ that works between pods on different nodes over NFS.

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
rows, result.json, checkpoints) first checks that lease.json still names its token (Lease.check on the driver,
Fence.check on workers). The race that remains: a writer that passes the check and is then paused (SIGSTOP, a
VM freeze) between the check and its rename can still land one write after a takeover. It is bounded to that
one in-flight write, and the new holder does not write before its preflight and Ray start (seconds) and drops
rows past its restored checkpoint, so the stale row is overwritten rather than kept.
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

LEASE_FILE = "lease.json"
CLAIMS_DIR = ".lease"
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


def _read_json(path: Path) -> Optional[dict]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _holder(data: Optional[dict]) -> Optional[Holder]:
    try:
        return Holder(**{k: data[k] for k in ("token", "host", "pid", "since", "renewed", "ttl_s")},
                      released=bool(data.get("released", False))) if data else None
    except (KeyError, TypeError):
        return None


def _write_replace(path: Path, data: dict) -> None:
    # Unique temporary name: two hosts can share a pid (pid 1 in containers).
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(json.dumps(data))
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def _create_exclusive(path: Path, data: dict) -> bool:
    """Create `path` holding `data` unless it exists, atomically, also on NFS: write a private file, link() it
    to the name. If the server did the link but its reply was lost, the client sees EEXIST: the private file's
    link count (2) says that it was ours after all."""
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
    try:
        names = os.listdir(run_dir / CLAIMS_DIR)
    except FileNotFoundError:
        return []
    return sorted(int(n[:-5]) for n in names if n.endswith(".json") and n[:-5].isdigit())


def current_holder(run_dir: Path) -> Optional[Holder]:
    """The newest claim and its liveness: lease.json when it names that claim, else the claim's own record (a
    claimant between its claim and its first write of lease.json, or one that crashed there)."""
    pointer = _holder(_read_json(run_dir / LEASE_FILE))
    newest = max(_claims(run_dir), default=0)
    if pointer is not None and pointer.token >= newest:
        return pointer
    return _holder(_read_json(run_dir / CLAIMS_DIR / f"{newest}.json")) if newest else pointer


def held_message(run_dir: Path, holder: Holder, now: float) -> str:
    return (f"run directory {run_dir} is in use by another attempt of this run ({holder.describe(now)}): it renewed "
            f"its lease while this start watched, so it is running. Two attempts writing one run would mix their "
            f"checkpoints and metrics. Fix: wait for it to finish or stop it, start this one with --wait-for-lease "
            f"to take over as soon as it ends, or train under another --name. (An attempt that dies without "
            f"releasing its lease needs no flag: it is taken over {holder.ttl_s:.0f} s after its last renewal.)")


def token_in(run_dir: Path) -> int:
    """The token lease.json names now (0 without one)."""
    pointer = _holder(_read_json(run_dir / LEASE_FILE))
    return pointer.token if pointer else 0


def stop_requested(run_dir: Path, token: int) -> Optional[str]:
    """For workers at a step boundary: why attempt `token` must end now (its driver asked it to stop, or a newer
    attempt holds the run), or None. lease.json is the channel because every node reads it consistently."""
    data = _read_json(Path(run_dir) / LEASE_FILE) or {}
    current = data.get("token", 0)
    if isinstance(current, int) and current > token:
        return f"attempt {current} took the run over"
    return data.get("stop") if current == token and data.get("stop") else None


class Fence:
    """What a worker checks before each commit: that its attempt still holds the run. Workers do not renew (the
    driver does); they stop committing as soon as lease.json names a newer attempt."""

    def __init__(self, run_dir: Path, token: int):
        self.run_dir, self.token = Path(run_dir), int(token)

    def check(self) -> None:
        now_token = token_in(self.run_dir)
        if now_token > self.token:
            raise LeaseLost(f"attempt {self.token} lost run directory {self.run_dir} to attempt {now_token}; "
                            f"it commits nothing more")


class Lease(Fence):
    """The driver's lease: acquired once, renewed by a thread, released at the end of the attempt."""

    def __init__(self, run_dir: Path, ttl_s: float = DEFAULT_TTL_S,
                 on_lost: Optional[Callable[[str], None]] = None):
        super().__init__(run_dir, 0)
        self.ttl_s = float(ttl_s)
        self.on_lost = on_lost
        self.host, self.pid = socket.gethostname(), os.getpid()
        self.since = 0.0
        self.renewed_mono = 0.0  # monotonic time of the read that began the last successful renewal
        self.lost: Optional[str] = None
        self.stop_reason: Optional[str] = None
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    # -- acquiring

    def acquire(self, wait: bool = False, poll_s: float = 1.0, notify: Callable[[str], None] = lambda _: None,
                ) -> "Lease":
        """Take the lease. A holder that stopped renewing (its attempt died: a killed driver, a lost pod, the
        RayJob's retry after either) is taken over once its renewal is ttl_s old. One that renews while this
        start watches is running: LeaseHeld names it, or with `wait` this start waits until it ends."""
        (self.run_dir / CLAIMS_DIR).mkdir(parents=True, exist_ok=True)
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
            if not _create_exclusive(self.run_dir / CLAIMS_DIR / f"{token}.json", record):
                continue  # another contender got this number first: look again
            self.token, self.since, self.renewed_mono = token, now, claimed
            _write_replace(self.run_dir / LEASE_FILE, record)
            self._thread = threading.Thread(target=self._renew_loop, name="raytrain-lease", daemon=True)
            self._thread.start()
            return self

    def _record(self, token: int, since: float, renewed: float, released: bool = False) -> dict:
        record = asdict(Holder(token=token, host=self.host, pid=self.pid, since=since, renewed=renewed,
                               ttl_s=self.ttl_s, released=released))
        return {**record, "stop": self.stop_reason} if self.stop_reason else record

    def request_stop(self, reason: str) -> None:
        """Ask this attempt's workers to checkpoint at their next step boundary and end (stop_requested)."""
        self.stop_reason = reason
        self.check()
        _write_replace(self.run_dir / LEASE_FILE, self._record(self.token, self.since, time.time()))

    # -- holding

    def check(self) -> None:
        """Raise LeaseLost unless this attempt still holds the run (called before every commit)."""
        if self.lost is None and time.monotonic() - self.renewed_mono > self.ttl_s * SELF_EXPIRY:
            silent = f"it could not renew its lease for {time.monotonic() - self.renewed_mono:.0f} s (paused, or " \
                     f"the storage unreachable)"
            try:
                newer = token_in(self.run_dir)
            except OSError:
                newer = 0
            self._lose(f"attempt {self.token} lost run directory {self.run_dir} to attempt {newer}: {silent}"
                       if newer > self.token else
                       f"attempt {self.token} gave up run directory {self.run_dir}: {silent}, so another attempt "
                       f"may take the run over")
        if self.lost is None:
            try:
                super().check()
            except LeaseLost as err:
                self._lose(str(err))
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
            newer = _holder(_read_json(self.run_dir / CLAIMS_DIR / f"{newest}.json"))
            if newer is not None and newer.live(time.time()):
                self._lose(f"attempt {self.token} lost run directory {self.run_dir} to attempt {newest}")
                raise LeaseLost(self.lost)
        if time.monotonic() - began > self.ttl_s * SELF_EXPIRY / 2:
            return  # this renewal took too long to be trusted; check() decides at the next one
        _write_replace(self.run_dir / LEASE_FILE, self._record(self.token, self.since, time.time()))
        self.renewed_mono = began

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.ttl_s / RENEWALS_PER_TTL):
            try:
                self.renew()
            except LeaseLost:
                return
            except OSError:
                continue  # storage hiccup: check() gives the lease up if it lasts

    def release(self) -> None:
        """Let the next attempt start at once (only while this attempt still holds the run)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self.token and self.lost is None and token_in(self.run_dir) == self.token:
            _write_replace(self.run_dir / LEASE_FILE, self._record(self.token, self.since, time.time(), True))
