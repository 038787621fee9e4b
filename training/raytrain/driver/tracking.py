"""Experiment trackers (run.tracking): MLflow and Weights & Biases, fed from the driver.

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
import math
import os
import posixpath
import re
import secrets
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Protocol, TextIO

from raytrain.checkpoint import checkpoints
from raytrain.errors import RaytrainError, UsageError
from raytrain.rundir import console, atomicfile, runrecords, storage
from raytrain.rundir.runcontrol import AttemptEnded, Ending
from raytrain.spec.sections import MlflowTracking, RunConfig, WandbTracking

TRACKING_FILE = "tracking.json"
FINAL_SYNC_S = 10.0  # the last sync of a succeeded attempt
STOP_SYNC_S = 3.0  # ...of one that stopped or failed: a stopping pod's grace period is short
MAX_BACKOFF_S = 60.0
NOT_METRICS = ("attempt", "resumed_from_epoch")  # a row's bookkeeping, not a measurement
UID_TAG = "raytrain.uid"
# The modules each tracker imports, and how to get them (pyproject.toml's extras).
PACKAGES = {"mlflow": ("mlflow", "pip install mlflow-skinny (or pip install 'raytrain[mlflow]')"),
            "wandb": ("wandb", "pip install wandb (or pip install 'raytrain[wandb]')")}


def configured(cfg: RunConfig) -> list[str]:
    """The trackers a run config asks for."""
    return cfg.run.tracking.trackers() if cfg.run.tracking is not None else []


def check_installed(names: list[str]) -> None:
    """Before anything starts: each named tracker's client is importable (found, not imported: MLflow's client takes
    seconds to import, which the syncer's thread spends instead)."""
    import importlib.util

    for name in names:
        module, fix = PACKAGES[name]
        if importlib.util.find_spec(module) is None:
            raise UsageError(f"run.tracking.{name} is set, but the {module} package is not installed. Fix: {fix}, "
                             f"or remove run.tracking.{name} from the config.")


# ----------------------------------------------------------------------------------------------------------
# what is sent


def metric_values(row: dict) -> dict[str, float]:
    """The measurements of a metrics row: finite numbers (the epoch too: it marks what a tracker holds)."""
    values = {}
    for key, value in row.items():
        if key in NOT_METRICS or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if math.isfinite(value):
            values[key] = float(value)
    return values


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


def flat_config(config: dict, prefix: str = "") -> dict[str, str]:
    """The resolved config as dotted keys and text values: MLflow's params (W&B takes it nested)."""
    flat: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flat_config(value, f"{name}."))
        else:
            flat[name] = value if isinstance(value, str) else json.dumps(value)
    return flat


# ----------------------------------------------------------------------------------------------------------
# trackers


class Tracker(Protocol):
    name: str  # its key in run.tracking and in tracking.json
    label: str  # for messages, e.g. "MLflow at http://mlflow:5000"

    def open(self, state: dict, save: Callable[[], None]) -> int:
        """Find or create the tracker run (its identity kept in `state`, saved through `save` before the tracker is
        asked to create it); log the config if `state` says it was not. Returns the newest epoch it holds (0:
        none). Called again after a failure."""

    def send(self, rows: list[dict]) -> None:
        """Send these rows (epochs past what open() returned, in order)."""

    def settle(self) -> None:
        """Once per sync, before sending: bookkeeping that must lag what was sent (W&B)."""

    def reference(self, checkpoint: Path, position: checkpoints.Position) -> None:
        """Name the newest committed checkpoint (its path, never its bytes)."""

    def close(self, status: str) -> None:
        """The attempt ended with `status` (succeeded, failed, stopped)."""


_METRIC_NAME = re.compile(r"^[/\w.\- :]*$")  # MLflow's rule (mlflow.utils.validation), without importing it


class Mlflow:
    name = "mlflow"
    STATUS = {Ending.SUCCEEDED.value: "FINISHED", Ending.FAILED.value: "FAILED", Ending.STOPPED.value: "KILLED"}

    def __init__(self, settings: MlflowTracking, run_name: str, run_dir: Path,
                 announce: Callable[..., None] = lambda *_args, **_fields: None):
        self.settings, self.run_name, self.run_dir, self.announce = settings, run_name, run_dir, announce
        self.label = f"MLflow at {settings.uri}" if settings.uri else "MLflow (MLFLOW_TRACKING_URI)"
        self.client: Any = None
        self.run_id: Optional[str] = None
        self.skipped: set[str] = set()

    def _client(self) -> Any:
        if self.client is None:
            # One try per request, 10 s at most: the syncer retries with its own backoff, and MLflow's defaults (7
            # retries with exponential backoff, 120 s timeouts) would hold the end of an attempt for minutes. These
            # are MLflow's variables, read on every request; a value the user set wins.
            os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
            os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
            from mlflow.tracking import MlflowClient

            self.client = MlflowClient(tracking_uri=self.settings.uri)
        return self.client

    def _experiment_id(self, client: Any) -> str:
        from mlflow.exceptions import MlflowException

        name = self.settings.experiment
        found = client.get_experiment_by_name(name)
        if found is None:
            try:
                return client.create_experiment(name)
            except MlflowException:  # another run created it meanwhile
                found = client.get_experiment_by_name(name)
                if found is None:
                    raise
        if found.lifecycle_stage != "active":
            raise RuntimeError(f"MLflow experiment {name!r} is deleted: restore it (mlflow experiments restore) or "
                               f"set run.tracking.mlflow.experiment to another name")
        return found.experiment_id

    def open(self, state: dict, save: Callable[[], None]) -> int:
        from mlflow.entities import Param

        client = self._client()
        if not state.get("run_id"):
            if not state.get("uid"):
                state["uid"] = uuid.uuid4().hex
                save()
            experiment = self._experiment_id(client)
            found = client.search_runs([experiment], f"tags.`{UID_TAG}` = '{state['uid']}'", max_results=1)
            if found:
                state["run_id"] = found[0].info.run_id
            else:
                state["run_id"] = client.create_run(experiment, run_name=self.run_name, tags={
                    UID_TAG: state["uid"], "raytrain.run_dir": str(self.run_dir)}).info.run_id
            save()
            self.announce(f"MLflow run {state['run_id']} (experiment {self.settings.experiment}) tracks run "
                          f"{self.run_name}", tracker=self.name, run_id=state["run_id"])
        self.run_id = state["run_id"]
        if not state.get("config_logged"):
            params = [Param(key[:250], value) for key, value in flat_config(state.get("config") or {}).items()]
            for start in range(0, len(params), 100):  # MLflow's most params per batch
                client.log_batch(self.run_id, params=params[start:start + 100])
            state["config_logged"] = True
            state.pop("config", None)
            save()
        run = client.get_run(self.run_id)
        if run.info.status != "RUNNING":
            client.update_run(self.run_id, status="RUNNING")  # a resumed run trains again
        held = run.data.metrics.get("epoch")
        return int(held) if held is not None else 0

    def send(self, rows: list[dict]) -> None:
        from mlflow.entities import Metric

        stamp = int(time.time() * 1000)
        batch: list = []
        for row in rows:
            metrics = []
            for key, value in metric_values(row).items():
                if not _METRIC_NAME.match(key) or posixpath.normpath(key) != key:
                    if key not in self.skipped:
                        self.skipped.add(key)
                        console.warning(f"tracking: metric {key!r} is not a name MLflow takes (letters, digits, "
                                        f"_ - . / : and spaces); it is not sent to MLflow")
                    continue
                metrics.append(Metric(key, value, stamp, row["epoch"]))
            if batch and len(batch) + len(metrics) > 1000:  # MLflow's most metrics per batch; whole rows per batch
                self._client().log_batch(self.run_id, metrics=batch)
                batch = []
            batch += metrics
        if batch:
            self._client().log_batch(self.run_id, metrics=batch)

    def settle(self) -> None:
        pass

    def reference(self, checkpoint: Path, position: checkpoints.Position) -> None:
        from mlflow.entities import RunTag

        self._client().log_batch(self.run_id, tags=[
            RunTag("raytrain.checkpoint", str(checkpoint)), RunTag("raytrain.checkpoint_epoch", str(position.epoch)),
            RunTag("raytrain.checkpoint_step", str(position.step))])

    def close(self, status: str) -> None:
        from mlflow.entities import RunStatus

        client, ended = self._client(), RunStatus.from_string(self.STATUS.get(status, "FAILED"))
        store = getattr(getattr(client, "_tracking_client", None), "store", None)
        if store is None:
            client.set_terminated(self.run_id, RunStatus.to_string(ended))
            return
        # set_terminated's own store call, without the "View run at" lines it prints onto raytrain's console
        store.update_run_info(self.run_id, run_status=ended, end_time=int(time.time() * 1000), run_name=None)


class Wandb:
    name = "wandb"
    # W&B's service writes an offline run's file every x_transaction_log_flush_interval seconds (15 by default; a
    # kill loses what it holds): raytrain asks for this, and counts an epoch as held only that long after it was
    # logged, twice over.
    FLUSH_S = 2.0

    def __init__(self, settings: WandbTracking, run_name: str, run_dir: Path,
                 announce: Callable[..., None] = lambda *_args, **_fields: None):
        self.settings, self.run_name, self.run_dir, self.announce = settings, run_name, run_dir, announce
        self.label = f"W&B project {settings.project} ({settings.mode})"
        self.run: Any = None
        self.state: dict = {}
        self.save: Callable[[], None] = lambda: None
        self.sent = 0  # the newest epoch logged by this process
        self.unsaved: list[tuple[float, int]] = []  # (when, epoch) logged but not yet counted as held
        self.lag_s = 2 * self.FLUSH_S + 1.0

    def open(self, state: dict, save: Callable[[], None]) -> int:
        self.state, self.save = state, save
        if self.run is None:
            import wandb

            if not state.get("id"):
                state["id"] = secrets.token_hex(4)  # W&B's run ids: lower-case letters and digits
                save()
            first = not state.get("config_logged")
            if self.settings.dir:
                Path(self.settings.dir).expanduser().mkdir(parents=True, exist_ok=True)
            # finish() gives up uploading after the attempt's last-sync time (by default it blocks until done, and
            # so would the process's exit while W&B is unreachable); what it could not upload stays in its local
            # run files, for `wandb sync`
            known = getattr(wandb.Settings, "model_fields", {})
            extra = {name: value for name, value in (("x_transaction_log_flush_interval", self.FLUSH_S),
                                                     ("finish_timeout", FINAL_SYNC_S)) if name in known}
            if "x_transaction_log_flush_interval" not in extra:
                self.lag_s = 2 * 15.0 + 1.0  # an older W&B: its own interval
            self.run = wandb.init(
                project=self.settings.project, entity=self.settings.entity, id=state["id"], resume="allow",
                mode=self.settings.mode, dir=self.settings.dir, name=self.run_name,
                config=state.get("config") if first else None, reinit="create_new",
                # raytrain's console stays its own; no system metrics, code or git state: the config says what ran
                settings=wandb.Settings(console="off", silent=True, x_disable_stats=True, save_code=False,
                                        disable_git=True, **extra))
            if first:
                state["config_logged"] = True
                state.pop("config", None)
                save()
            self.announce(f"W&B run {state['id']} ({self.label}) tracks run {self.run_name}", tracker=self.name,
                          run_id=state["id"])
        return max(int(state.get("sent_epoch") or 0), self.sent)

    def send(self, rows: list[dict]) -> None:
        for row in rows:
            self.run.log(metric_values(row), step=row["epoch"])
            self.sent = row["epoch"]
            self.unsaved.append((time.monotonic(), self.sent))

    def settle(self, everything: bool = False) -> None:
        """Save the newest epoch W&B's file holds by now (everything: after finish(), all that was logged)."""
        held = [epoch for when, epoch in self.unsaved if everything or time.monotonic() - when >= self.lag_s]
        if held:
            self.unsaved = [(when, epoch) for when, epoch in self.unsaved if epoch > max(held)]
            self.state["sent_epoch"] = max(held)
            self.save()

    def reference(self, checkpoint: Path, position: checkpoints.Position) -> None:
        self.run.summary.update({"raytrain/checkpoint": str(checkpoint), "raytrain/checkpoint_epoch": position.epoch,
                                 "raytrain/checkpoint_step": position.step})

    def close(self, status: str) -> None:
        self.run.finish(exit_code=0 if status == Ending.SUCCEEDED.value else 1)  # writes (or uploads) what it holds
        self.run = None
        self.settle(everything=True)


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
    return atomicfile.read_record(storage.as_path(run_dir) / TRACKING_FILE) or {}


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
        self.records.write_atomic(self.run_dir / TRACKING_FILE, json.dumps(self.state, indent=2) + "\n")

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
        """Tell each opened tracker how the attempt ended (MLflow's run status, W&B's exit code)."""
        for tracker in self.trackers:
            if self.progress[tracker.name].opened:
                try:
                    self.records.check()
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


def make_trackers(state: dict, names: list[str], run_dir: Path, out: Optional[TextIO] = None,
                  records: Optional[runrecords.Records] = None) -> list[Tracker]:
    """The named trackers of tracking.json's state, each with the settings stored with it."""

    def announce(message: str, **fields: Any) -> None:
        console.info("tracking", f"tracking: {message}", out=out, **fields)
        if records is not None:
            records.append_event("tracking", **fields)

    made: list[Tracker] = []
    for name in names:
        entry = state[name]
        if name == "mlflow":
            made.append(Mlflow(MlflowTracking(**entry["settings"]), entry.get("run_name") or run_dir.name, run_dir,
                               announce))
        elif name == "wandb":
            made.append(Wandb(WandbTracking(**entry["settings"]), entry.get("run_name") or run_dir.name, run_dir,
                              announce))
    return made


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
        raise UsageError(f"{run_dir}: no {TRACKING_FILE} naming a tracker. Fix: give the run directory of a run whose "
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
                                 f"stay in {run_dir / runrecords.METRICS_FILE}. Fix: make the tracker reachable from here "
                                 f"(its URI, and credentials in its environment variables), then run raytrain track "
                                 f"{run_dir} again.")
    return {tracker.name: syncer.progress[tracker.name].sent for tracker in syncer.trackers}


class TrackerUnreachable(RaytrainError):
    """`raytrain track` could not send to a tracker; str() is one paragraph."""
