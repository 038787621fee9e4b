"""Experiment tracking (run.tracking): the syncer that feeds the trackers (raytrain.driver.trackers: MLflow and
Weights & Biases) from the driver, each metrics row exactly once, and `raytrain track RUN_DIR`.

One tracker run per raytrain run, across every attempt, retry, resubmission and lost head: the tracker run's
identity is kept in the run directory's tracking.json (written fenced, as every record), so each attempt reopens
the same one. It is saved before the tracker is asked to create anything (an MLflow run is found again by the
uid tag it was created with; a W&B run id is chosen here), so a kill at any moment makes no second run.

What is sent: metrics.jsonl's rows, step = epoch, each once. A row may still be dropped until a checkpoint at or
after its epoch commits (a resume truncates the rows past the restored position, and they are trained again), and
a tracker cannot take a point back. So the syncer sends only the rows at or before the newest committed
checkpoint's epoch, and every row once the attempt has succeeded. Before it sends, it learns which epochs the
tracker holds already: MLflow is asked (the run's `epoch` metric, written in the same atomic batch as the row's
other values); W&B, which cannot be asked offline, keeps the newest epoch it holds in tracking.json, saved only
once W&B's own file must hold it, so that a kill repeats a point (which W&B drops, its steps only growing) rather
than loses one. The config is logged once, when the tracker run is created (MLflow params, W&B config); the newest
checkpoint is referenced by its path (MLflow tags raytrain.checkpoint*, W&B summary), never uploaded.

The syncer is a daemon thread of the driver (raytrain.driver.attempt): training never waits for it. A tracker that is
down or refuses is retried with backoff, said once on the console; what it missed is sent when it answers. At the
end of an attempt a last sync gets a few seconds; what is unsent then is sent by the run's next attempt, or by
`raytrain track RUN_DIR`. Every send passes the run's fence first: an attempt that lost the run sends nothing.
Run-directory I/O goes through raytrain.rundir.runrecords' readers, checkpoints.newest_complete, Records.write_atomic and
files.read_record only.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Optional, TextIO

from raytrain.checkpoint import checkpoints
from raytrain.driver.trackers import FINAL_SYNC_S, PACKAGES, Mlflow, Tracker, check_installed, make_trackers
from raytrain.errors import RaytrainError, UsageError
from raytrain.lifecycle.endings import AttemptEnded, Ending
from raytrain.rundir import atomicfile, console, goodput, layout, runrecords, storage
from raytrain.spec.sections import RunConfig

STOP_SYNC_S = 3.0  # the last sync of an attempt that stopped or failed: a stopping pod's grace period is short
MAX_BACKOFF_S = 60.0


# ----------------------------------------------------------------------------------------------------------
# what is sent


def final_rows(rows: list[dict], newest: Optional[Path], everything: bool) -> list[dict]:
    """The rows no resume can drop any more, one per epoch in epoch order: those at or before the newest committed
    checkpoint's epoch (a mid-epoch checkpoint completed the epochs before its own), or all of them once the attempt
    succeeded. A later row of an epoch wins, as a resume appends the retrained epoch after truncating."""
    by_epoch = {row["epoch"]: row for row in rows}
    if everything:
        upto = max(by_epoch, default=0)
    else:
        upto = checkpoints.position_of(newest).epoch if newest is not None else 0
    return [by_epoch[epoch] for epoch in sorted(by_epoch) if epoch <= upto]


def goodput_summary(run_dir: Path) -> dict[str, float]:
    """The run's goodput as `raytrain report` shows it, as of now (an attempt's end): `goodput` (the fraction),
    `goodput/wall_s` and `goodput/<cause>_s` for each cause; {} before any attempt has a time."""
    found = goodput.read(run_dir)
    if found.goodput is None:
        return {}
    return {"goodput": round(found.goodput, 4), "goodput/wall_s": round(found.wall_s, 3),
            **{f"goodput/{cause}_s": round(seconds, 3) for cause, seconds in found.seconds.items()}}


# ----------------------------------------------------------------------------------------------------------
# the syncer


@dataclass
class TrackerState:
    """What the syncer knows of one tracker: whether its run is open, the newest epoch it holds, its failures."""

    opened: bool = False
    sent: int = 0  # the newest epoch the tracker holds
    failures: int = 0
    retry_at: float = 0.0
    down: Optional[str] = None  # the failure the console was told of
    checkpoint: Optional[str] = None  # the checkpoint referenced last


def read_state(run_dir: Path) -> dict:
    """tracking.json: {tracker name: its settings, the tracker run's identity and bookkeeping}."""
    return atomicfile.read_record(storage.as_path(run_dir) / layout.TRACKING_FILE) or {}


class Syncer:
    """Sends a run's final metrics rows to its trackers from a daemon thread (see the module's doc)."""

    def __init__(self, records: runrecords.Records, trackers: list[Tracker], state: dict, every_s: float,
                 out: Optional[TextIO] = None):
        self.records, self.run_dir = records, records.run_dir
        self.trackers, self.state, self.every_s, self.out = trackers, state, every_s, out
        self.progress = {tracker.name: TrackerState() for tracker in trackers}
        self._final: Optional[str] = None
        self._wake = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self.fenced: Optional[str] = None  # why the syncer stopped sending: the run is no longer this attempt's
        self.quiet = False  # `raytrain track`: its error says what failed

    @classmethod
    def for_run(cls, cfg: RunConfig, records: runrecords.Records, out: Optional[TextIO] = None) -> Optional["Syncer"]:
        """The syncer of a run whose config asks for tracking (None otherwise). tracking.json keeps each tracker's
        state while its settings stay as they were; a tracker whose settings changed starts a new tracker run."""
        settings = cfg.run.tracking
        if settings is None:
            return None
        state = read_state(records.run_dir)  # a tracker no longer configured keeps its entry, for when it is again
        for name in settings.trackers():
            wanted = asdict(getattr(settings, name))
            kept = state.get(name)
            if isinstance(kept, dict) and kept.get("settings") == wanted:
                continue
            if isinstance(kept, dict):
                console.info("tracking", f"tracking: run.tracking.{name} changed since the run's last attempt: a new "
                             f"tracker run starts", out=out, tracker=name)
            # the config rides along until the tracker has logged it (raytrain track may be the one to)
            state[name] = {"settings": wanted, "run_name": cfg.run.name, "config": cfg.to_dict()}
        trackers = make_trackers(state, settings.trackers(), records.run_dir, out, records)
        return cls(records, trackers, state, settings.sync_every_s, out)

    # -- the thread

    def start(self) -> "Syncer":
        self._thread = threading.Thread(target=self._loop, name="raytrain-tracking", daemon=True)
        self._thread.start()
        return self

    def finish(self, status: str, timeout_s: Optional[float] = None) -> None:
        """The attempt ended with `status`: a last sync (every row if it succeeded), bounded by timeout_s; says on
        the console what is left unsent and who sends it."""
        if timeout_s is None:
            timeout_s = FINAL_SYNC_S if status == Ending.SUCCEEDED.value else STOP_SYNC_S
        self._final = status
        self._wake.set()
        if self._thread is None:  # never started: the last sync is its only one
            self.start()
        assert self._thread is not None
        self._thread.join(timeout_s)
        self._report_unsent(status, timed_out=self._thread.is_alive())

    def ids(self) -> dict[str, str]:
        """{tracker: its run's id} for those known so far (result.json names them)."""
        return {name: entry.get("run_id") or entry.get("id") for name, entry in self.state.items()
                if name in self.progress and (entry.get("run_id") or entry.get("id"))}

    def abandon(self) -> None:
        """Stop without a last sync (the run was lost to a newer attempt, which sends from now on)."""
        self._final = "abandoned"
        self._wake.set()

    def _loop(self) -> None:
        while True:
            final = self._final
            if final == "abandoned":
                return
            try:
                self.sync(everything=final == Ending.SUCCEEDED.value, now=final is not None)
                if final is not None:
                    self.close_trackers(final)
                    return
            except AttemptEnded as ended:
                self.fenced = ended.reason
                return
            except Exception as err:  # reading the run directory failed (its storage): the next sync tries again
                console.warning(f"tracking: could not read run directory {self.run_dir} ({describe(err)}); the next "
                                f"sync tries again", out=self.out)
                if final is not None:
                    return
            self._wake.wait(self.every_s)
            self._wake.clear()

    # -- one sync

    def save(self) -> None:
        self.records.write_atomic(self.run_dir / layout.TRACKING_FILE, json.dumps(self.state, indent=2) + "\n")

    def sync(self, everything: bool = False, now: bool = False) -> None:
        """Send each tracker the final rows it does not hold. now: ignore the backoff (the last sync). Raises
        AttemptEnded when the run is no longer this attempt's."""
        newest = checkpoints.newest_complete(self.run_dir)
        rows = final_rows(runrecords.read_metrics(self.run_dir), newest, everything)
        for tracker in self.trackers:
            progress = self.progress[tracker.name]
            if not now and time.monotonic() < progress.retry_at:
                continue
            try:
                self.records.check()
                if not progress.opened:
                    progress.sent = tracker.open(self.state[tracker.name], self.save)
                    progress.opened = True
                tracker.settle()
                todo = [row for row in rows if row["epoch"] > progress.sent]
                if todo:
                    self.records.check()
                    tracker.send(todo)
                    progress.sent = todo[-1]["epoch"]
                if newest is not None and str(newest) != progress.checkpoint:
                    self.records.check()
                    tracker.reference(newest, checkpoints.position_of(newest))
                    progress.checkpoint = str(newest)
            except AttemptEnded:
                raise
            except Exception as err:  # the tracker's client: down, refusing, or an error of its own
                self._failed(tracker, progress, err)
            else:
                if progress.down is not None:
                    console.info("tracking", f"tracking: {tracker.label} answers again; it holds epochs up to "
                                 f"{progress.sent}", out=self.out, tracker=tracker.name, epoch=progress.sent)
                progress.failures, progress.retry_at, progress.down = 0, 0.0, None

    def _failed(self, tracker: Tracker, progress: TrackerState, err: Exception) -> None:
        progress.opened = False  # ask again what it holds: a send that failed may have landed
        progress.failures += 1
        wait = min(MAX_BACKOFF_S, self.every_s * 2 ** (progress.failures - 1))
        progress.retry_at = time.monotonic() + wait
        why = describe(err)
        if progress.down is None and not self.quiet:
            console.warning(f"tracking: {tracker.label} failed ({why}); training goes on, and the epochs it misses are "
                            f"sent when it answers (retrying every {MAX_BACKOFF_S:.0f} s at most)", out=self.out)
        progress.down = why

    def close_trackers(self, status: str) -> None:
        """Tell each opened tracker the run's goodput so far and how the attempt ended (MLflow's run status, W&B's
        exit code)."""
        opened = [tracker for tracker in self.trackers if self.progress[tracker.name].opened]
        summary: dict[str, float] = {}
        if opened:
            try:
                summary = goodput_summary(self.run_dir)
            except Exception as err:  # storage gone since the last sync: the runs still close, without goodput
                console.warning(f"tracking: run {self.run_dir.name}'s goodput is not sent ({err}); "
                                f"raytrain report {self.run_dir} shows it", out=self.out)
        for tracker in opened:
            try:
                self.records.check()
                if summary:
                    tracker.summarize(summary, self.records.token or 0)
                tracker.close(status)
            except AttemptEnded:
                raise
            except Exception as err:
                self._failed(tracker, self.progress[tracker.name], err)

    def _report_unsent(self, status: str, timed_out: bool) -> None:
        if self.fenced is not None:
            return
        newest = checkpoints.newest_complete(self.run_dir)
        rows = final_rows(runrecords.read_metrics(self.run_dir), newest, status == Ending.SUCCEEDED.value)
        for tracker in self.trackers:
            progress = self.progress[tracker.name]
            unsent = [row["epoch"] for row in rows if row["epoch"] > progress.sent]
            if not unsent and not timed_out:
                continue
            missing = f"epochs {unsent[0]}..{unsent[-1]}" if unsent else "its last updates"
            why = "it did not answer" if progress.down else "the last sync ran out of time"
            console.warning(f"tracking: {missing} of run {self.run_dir.name} are not in {tracker.label} yet ({why}); "
                            f"the run's next attempt sends them, or now: raytrain track {self.run_dir}", out=self.out)


def describe(err: BaseException) -> str:
    """An exception in one short line (a client's messages can run to pages): for a failed HTTP request the root
    cause urllib3 names ("Caused by NewConnectionError(...: [Errno 111] Connection refused)")."""
    text = " ".join(str(err).split())
    if "Caused by " in text:
        return text.rsplit("Caused by ", 1)[1].rsplit(": ", 1)[-1].rstrip("\"')")
    return f"{err.__class__.__name__}: {text[:200]}{'...' if len(text) > 200 else ''}" if text else \
        err.__class__.__name__


def start(cfg: RunConfig, records: runrecords.Records, out: Optional[TextIO] = None) -> Optional[Syncer]:
    """The attempt's syncer, started (None without run.tracking)."""
    syncer = Syncer.for_run(cfg, records, out)
    return syncer.start() if syncer is not None else None


# ----------------------------------------------------------------------------------------------------------
# raytrain track RUN_DIR


def track(run_dir: Path, control: Any, out: Optional[TextIO] = None) -> dict[str, int]:
    """Send what a run's trackers miss now, under the run's lease (`control`, held by the caller): the final rows,
    every row if the run's last attempt succeeded, and that attempt's ending. Returns {tracker: newest epoch it
    holds}."""
    state = read_state(run_dir)
    names = [name for name in PACKAGES if isinstance(state.get(name), dict)]
    if not names:
        raise UsageError(f"{run_dir}: no {layout.TRACKING_FILE} naming a tracker. Fix: give the run directory of a run whose "
                         f"config sets run.tracking (the file is written when such a run starts).")
    check_installed(names)
    records = runrecords.Records(run_dir, control)
    syncer = Syncer(records, make_trackers(state, names, run_dir, out, records), state, 1.0, out)
    syncer.quiet = True
    status = (runrecords.read_result(run_dir) or {}).get("status")
    syncer.sync(everything=status == Ending.SUCCEEDED.value, now=True)
    if status in Mlflow.STATUS:
        syncer.close_trackers(status)
    down = {tracker.label: syncer.progress[tracker.name].down for tracker in syncer.trackers
            if syncer.progress[tracker.name].down is not None}
    if down:
        raise TrackerUnreachable(f"{'; '.join(f'{label}: {why}' for label, why in down.items())}. The run's points "
                                 f"stay in {run_dir / layout.METRICS_FILE}. Fix: make the tracker reachable from here "
                                 f"(its URI, and credentials in its environment variables), then run raytrain track "
                                 f"{run_dir} again.")
    return {tracker.name: syncer.progress[tracker.name].sent for tracker in syncer.trackers}


class TrackerUnreachable(RaytrainError):
    """`raytrain track` could not send to a tracker; str() is one paragraph."""
