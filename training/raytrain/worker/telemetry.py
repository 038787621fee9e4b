"""Live training metrics through Ray's metrics API (`ray.util.metrics`), so that a run's curves reach the same
Prometheus that scrapes Ray's own metrics (the chart's PodMonitor, Ray's service-discovery file) and the chart's
Grafana dashboard (helm/raytrain-cluster/dashboards/raytrain.json).

Ray exports each metric as `ray_<name>` (counters with a `_total` suffix) on every node's metrics port, with the
labels given here plus Ray's own (SessionName, NodeAddress, WorkerId, ...). Run-level values come from rank 0
only (tag `run`); per-worker values carry `rank` too.

Nothing here runs per training step: the worker's raytrain.Session (so a user's own loop gets this too) calls
`started` once per worker-group start, `epoch_end` once per epoch and `checkpointed` after each checkpoint; per step
it only counts the samples of `batches("train")`. Restarts and resumes are counted from the run's events.jsonl
(the durable record), not from in-process counters that a restarted worker would lose.

Ray (OpenTelemetry) exports what a worker set since its last report, and the node's metrics agent keeps a gauge
value for twice the export interval (Ray 2.60, ray-project/ray#64633; 2.55 forgot it once a scrape had read it). A
value set once per epoch would reach Prometheus for a few seconds only (or not at all if those scrapes time out), so
a daemon thread sets the last values again every REFRESH_S seconds, inside the report interval (1 s for raytrain's workers on a cluster:
WORKER_REPORT_INTERVAL_MS): a few dozen calls a second, off the training thread. Each report must reach the agent
within half the interval (Ray's core worker gives its exporter that timeout): a node so loaded that its agent
answers slower loses the reports, so a shorter interval trades robustness for freshness.
"""

from __future__ import annotations

import math
import os
import threading
import time
from pathlib import Path
from typing import Optional

from raytrain.checkpoint import checkpoints
from raytrain.rundir import goodput, runrecords

# name: (description, per worker). Exported as ray_<name>; RunTelemetry.COUNTERS get `_total` appended too.
GAUGES = {
    "raytrain_train_loss": ("Mean training loss of the last epoch (all workers)", False),
    "raytrain_val_loss": ("Validation loss after the last epoch", False),
    "raytrain_val_accuracy": ("Validation accuracy after the last epoch (classification tasks)", False),
    "raytrain_epoch": ("Last epoch completed", False),
    "raytrain_samples_per_second": ("Training samples per second of the last epoch, all workers together", False),
    "raytrain_worker_samples_per_second": ("Training samples per second of the last epoch, this worker", True),
    "raytrain_last_checkpoint_timestamp_seconds": ("Unix time of the run's newest checkpoint", False),
    "raytrain_restarts": ("Worker-group starts of this run beyond the first (failures, re-submissions)", False),
    "raytrain_resumes": ("Worker-group starts of this run that resumed from a checkpoint", False),
    # Every run: the worker group's size (an elastic run's changes); under scaling.fault_tolerance torchft
    # (raytrain.worker.replicas) the fewest replicas that trained in a committed step, below it while one is replaced
    "raytrain_training_workers": ("Workers whose gradients every committed step of the last epoch had (torchft: the "
                                  "fewest replicas that trained in a step)", False),
    # The run's goodput (raytrain.rundir.goodput, what `raytrain report` shows), as of its newest epoch
    "raytrain_goodput_ratio": ("Productive training time over the run's wall time, all attempts, as of its newest "
                               "epoch", False),
    "raytrain_progress_percent": ("Epochs done of train.epochs, in percent", False),
    "raytrain_time_left_seconds": ("The time to the run's last epoch at its epochs' mean pace", False),
}
# The run's wall time by cause (tag `cause`: training, the goodput, and each badput cause of goodput.CAUSES)
CAUSE_GAUGE = ("raytrain_goodput_seconds", "The run's wall time so far by cause: training (the goodput) and each "
               "cause of badput (waiting, startup, restore, data, evaluation, checkpoint, lost, recovery, resize, "
               "stopping, other)")
COUNTERS = {
    "raytrain_steps": ("Optimizer steps taken by this worker", True),
}
REFRESH_S = 0.5  # inside the workers' report interval, so that each report carries every value
# How often raytrain's Ray Train workers on a joined cluster send their metrics (RAY_metrics_report_interval_ms in
# the worker runtime env the driver gives Ray Train; the user's own setting for the driver is passed on instead):
# rank 0 waits one report after the last epoch (RunTelemetry.linger), 2 s at this interval against 11 s at Ray's
# default of 10 s, and every run's end waits for it. Ray gives each report half the interval to reach the node's
# agent; the test tiers run every cluster at this interval on a loaded 2-core machine, test_prometheus's last-epoch
# check included.
WORKER_REPORT_INTERVAL_MS = 1000
# linger waits one interval after the last change, and this: Ray's half-interval timeout for the report itself, and
# slack for its timer on a busy node.
LINGER_MARGIN_S = 1.0
GOODPUT_WAIT_S = 5.0  # linger: the longest wait for an epoch's goodput export still under way


def exported_names() -> list[str]:
    """The names Prometheus sees (what the dashboard queries)."""
    return [f"ray_{n}" for n in (*GAUGES, CAUSE_GAUGE[0])] + [f"ray_{n}_total" for n in COUNTERS]


class RunTelemetry:
    """One per Ray Train worker: cheap calls at start, epoch end and checkpoint."""

    def __init__(self, run_name: str, rank: int, per_worker_batch_size: int, epochs: int = 0, world_size: int = 0):
        from ray.util.metrics import Counter, Gauge

        self.rank_zero = rank == 0
        self.epochs = epochs
        self.world_size = world_size
        self.run_dir: Optional[Path] = None
        self._goodput_due = threading.Event()  # an epoch ended: the refresh thread reads the run's goodput
        self._exporting = False  # the refresh thread is reading it
        self._changed = time.monotonic()  # when a value last changed (linger waits one report after it)
        self.batch_size = max(int(per_worker_batch_size), 1)
        self.run_tags = {"run": run_name}
        self.worker_tags = {"run": run_name, "rank": str(rank)}
        self.metrics = {}
        for name, (description, per_worker) in GAUGES.items():
            self.metrics[name] = Gauge(name, description=description, tag_keys=("run", "rank") if per_worker else ("run",))
        for name, (description, per_worker) in COUNTERS.items():
            self.metrics[name] = Counter(name, description=description, tag_keys=("run", "rank") if per_worker else ("run",))
        self.metrics[CAUSE_GAUGE[0]] = Gauge(CAUSE_GAUGE[0], description=CAUSE_GAUGE[1], tag_keys=("run", "cause"))
        self._last: dict[tuple[str, tuple], tuple[float, dict]] = {}  # (gauge, its tags) -> (its last value, tags)
        self._lock = threading.Lock()
        threading.Thread(target=self._refresh, name="raytrain-telemetry", daemon=True).start()

    def _set(self, name: str, value: float, per_worker: bool = False, tags: Optional[dict] = None) -> None:
        tags = tags if tags is not None else self.worker_tags if per_worker else self.run_tags
        key = (name, tuple(sorted(tags.items())))
        with self._lock:
            if self._last.get(key, (None,))[0] != float(value):
                self._changed = time.monotonic()
            self._last[key] = (float(value), tags)
            self.metrics[name].set(float(value), tags=tags)

    def _refresh(self) -> None:
        while True:
            if self._goodput_due.wait(REFRESH_S):
                self._exporting = True
                self._goodput_due.clear()
                try:
                    self._export_goodput()
                finally:
                    self._exporting = False
            with self._lock:
                for (name, _), (value, tags) in self._last.items():
                    self.metrics[name].set(value, tags=tags)

    def _export_goodput(self) -> None:
        """Rank 0, off the training thread, once an epoch: the run's goodput from its records (a few small files)."""
        if self.run_dir is None:
            return
        try:
            found = goodput.read(self.run_dir, self.epochs)
        except Exception:  # noqa: BLE001 - the run's storage did not answer: the next epoch's export tries again
            return
        if found.goodput is not None:
            self._set("raytrain_goodput_ratio", found.goodput)
            for cause, seconds in found.seconds.items():
                self._set(CAUSE_GAUGE[0], seconds, tags={**self.run_tags, "cause": cause})
        for key, gauge in (("percent", "raytrain_progress_percent"), ("time_left_s", "raytrain_time_left_seconds")):
            if found.progress.get(key) is not None:
                self._set(gauge, found.progress[key])

    def started(self, run_dir: Path, start_epoch: int) -> None:
        """After rank 0 recorded this start in events.jsonl: restarts and resumes so far, the resume point."""
        if not self.rank_zero:
            return
        self.run_dir = run_dir
        starts = [e for e in runrecords.read_events(run_dir) if e.get("event") == "start"]
        self._set("raytrain_restarts", max(len(starts) - 1, 0))
        self._set("raytrain_resumes", sum(1 for e in starts if e.get("resumed_from_epoch") is not None))
        self._set("raytrain_epoch", start_epoch - 1)
        newest = checkpoint_time(run_dir)
        if newest is not None:
            self._set("raytrain_last_checkpoint_timestamp_seconds", newest)

    def epoch_end(self, row: dict, local_samples: float, local_seconds: float) -> None:
        """row: the epoch's metrics row (all workers); local_*: this worker's own training samples and seconds
        (0 samples when a user's loop drew its batches without the session: no per-worker figures then)."""
        if local_samples > 0:
            self._set("raytrain_worker_samples_per_second", local_samples / max(local_seconds, 1e-9), per_worker=True)
            # Every step but an epoch's last holds a full per-worker batch, so this is this worker's step count.
            # (Ray's Counter refuses an increment of 0.)
            self.metrics["raytrain_steps"].inc(math.ceil(local_samples / self.batch_size), tags=self.worker_tags)
        if not self.rank_zero:
            return
        self._set("raytrain_epoch", row["epoch"])
        # A user's loop reports what it has: each gauge is set only from a number in the row.
        for key, gauge in (("train_loss", "raytrain_train_loss"), ("samples_per_s", "raytrain_samples_per_second"),
                           ("val_loss", "raytrain_val_loss"), ("val_accuracy", "raytrain_val_accuracy")):
            value = row.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                self._set(gauge, value)
        replicas = row.get("replicas_min")  # torchft's rows say it; elsewhere every step had the whole group
        if isinstance(replicas, (int, float)) and not isinstance(replicas, bool):
            self._set("raytrain_training_workers", replicas)
        elif self.world_size > 0:
            self._set("raytrain_training_workers", self.world_size)
        self._goodput_due.set()

    def linger(self) -> None:
        """Rank 0, once the loop has returned: keep the last values alive for one of Ray's metric reports, which a
        worker sends every RAY_metrics_report_interval_ms (WORKER_REPORT_INTERVAL_MS on a cluster, unless the user
        set it) and not when it exits: without this the last epoch's values may never reach Prometheus, and the
        dashboard would show the epoch before. The wait counts from the last value's change: the time the loop
        spent after its last epoch (the last checkpoint's commit) is not waited again."""
        if not self.rank_zero:
            return
        deadline = time.monotonic() + GOODPUT_WAIT_S
        while (self._goodput_due.is_set() or self._exporting) and time.monotonic() < deadline:
            time.sleep(0.05)  # the last epoch's goodput is still being read: its values come after
        with self._lock:
            changed = self._changed
        time.sleep(max(changed + report_interval_s() + LINGER_MARGIN_S - time.monotonic(), 0.0))

    def checkpointed(self, when: Optional[float] = None) -> None:
        if self.rank_zero:
            self._set("raytrain_last_checkpoint_timestamp_seconds", time.time() if when is None else when)


def report_interval_s() -> float:
    """How often this Ray worker sends its metrics to the node's agent (Ray's RAY_metrics_report_interval_ms)."""
    try:
        return max(float(os.environ.get("RAY_metrics_report_interval_ms", "10000")) / 1000.0, 0.0)
    except ValueError:
        return 10.0


def checkpoint_time(run_dir: Path) -> Optional[float]:
    """When the run's newest checkpoint was written (its meta.json lands last), or None."""
    for path in checkpoints.committed(run_dir):
        meta = path / checkpoints.META_FILE
        if meta.is_file():
            return meta.stat().st_mtime
    return None
