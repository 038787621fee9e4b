"""The experiment trackers run.tracking names, behind one protocol (Tracker): MLflow (its client on the tracking
server or store the config names) and Weights & Biases (online or offline). Each finds or creates its tracker run
from the identity kept in tracking.json, logs the config once, says which epochs it holds, takes metrics rows, names
the newest committed checkpoint by its path and records how the attempt ended. Their clients come from optional
extras, imported only when a config names one (check_installed says beforehand whether they can be); the syncer that
feeds them is raytrain.driver.tracking.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import posixpath
import re
import secrets
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Optional, Protocol, TextIO

from raytrain.checkpoint import checkpoints
from raytrain.errors import UsageError
from raytrain.lifecycle.endings import Ending
from raytrain.rundir import console, runrecords
from raytrain.spec.sections import MlflowTracking, RunConfig, WandbTracking

FINAL_SYNC_S = 10.0  # the last sync of a succeeded attempt (raytrain.driver.tracking; W&B's finish() waits no longer)
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
# the trackers


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

    def summarize(self, summary: dict[str, float], attempt: int) -> None:
        """At an attempt's end, before close: the run's goodput so far (raytrain.driver.tracking.goodput_summary),
        as of `attempt`'s end (MLflow: metrics at step `attempt`; W&B: the run's summary)."""

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

    def summarize(self, summary: dict[str, float], attempt: int) -> None:
        from mlflow.entities import Metric

        stamp = int(time.time() * 1000)  # step: the attempt, so that each attempt's end is a point of the history
        self._client().log_batch(self.run_id, metrics=[Metric(key, value, stamp, attempt)
                                                       for key, value in summary.items()])

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

    def summarize(self, summary: dict[str, float], attempt: int) -> None:
        self.run.summary.update({**summary, "raytrain/goodput_attempt": attempt})

    def close(self, status: str) -> None:
        self.run.finish(exit_code=0 if status == Ending.SUCCEEDED.value else 1)  # writes (or uploads) what it holds
        self.run = None
        self.settle(everything=True)


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
