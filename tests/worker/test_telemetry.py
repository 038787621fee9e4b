"""raytrain.worker.telemetry: what it exports is what the chart's dashboard queries (the real Prometheus test is
tests/integration/test_prometheus.py), and the checkpoint time it starts from."""

import json
import re
import time
from pathlib import Path

import pytest

from raytrain.checkpoint import checkpoints
from raytrain.worker.telemetry import COUNTERS, GAUGES, RunTelemetry, checkpoint_time, exported_names

DASHBOARD = Path(__file__).resolve().parents[2] / "helm" / "raytrain-cluster" / "dashboards" / "raytrain.json"


def dashboard_exprs() -> list[tuple[str, str]]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [(panel["title"], target["expr"]) for panel in dashboard["panels"] for target in panel["targets"]]


def test_dashboard_queries_only_metrics_that_raytrain_exports_and_shows_every_one():
    names = set(exported_names())
    used_all = set()
    for title, expr in dashboard_exprs():
        used = set(re.findall(r"\bray_raytrain_\w+", expr))
        assert used and used <= names, f"{title}: {expr} uses {used - names or 'no raytrain metric'}"
        assert '{run=~"$run"}' in expr, f"{title}: not filtered by the dashboard's run selector"
        used_all |= used
    assert used_all == names


def test_exported_names_follow_rays_prefix_and_counter_suffix():
    assert "ray_raytrain_train_loss" in exported_names()
    assert "ray_raytrain_steps_total" in exported_names()
    assert len(exported_names()) == len(GAUGES) + len(COUNTERS) + 1  # the goodput by cause
    assert "ray_raytrain_goodput_seconds" in exported_names()


def test_checkpoint_time_is_that_of_the_newest_complete_checkpoint(tmp_path):
    assert checkpoint_time(tmp_path) is None
    directory = checkpoints.FileCheckpointer(tmp_path).save(
        checkpoints.Position(3), lambda: {"model": {}, "optimizer": {}, "epoch": 3, "step": 0}, writer=True)
    assert checkpoint_time(tmp_path) == (directory / checkpoints.META_FILE).stat().st_mtime


def test_calls_outside_a_ray_worker_do_not_fail(tmp_path):
    """Ray's metrics record nothing without a connected worker; the loop's calls must still be harmless."""
    telemetry = RunTelemetry("r", 0, 32)
    telemetry.started(tmp_path, 1)
    telemetry.epoch_end({"epoch": 1, "train_loss": 0.5, "samples_per_s": 10.0, "val_loss": 0.4}, 0, 0.0)
    telemetry.epoch_end({"epoch": 2, "train_loss": 0.4, "samples_per_s": 10.0}, 100, 1.0)
    telemetry.checkpointed()


def test_training_workers_are_the_group_or_torchfts_fewest_replicas():
    """Every run exports how many workers its last epoch's steps had: the group's size, or under torchft the row's
    fewest replicas in a quorum (a lost one being replaced)."""
    telemetry = RunTelemetry("r", 0, 32, world_size=4)
    telemetry.epoch_end({"epoch": 1, "train_loss": 0.5}, 0, 0.0)
    assert telemetry._last[("raytrain_training_workers", (("run", "r"),))][0] == 4
    telemetry.epoch_end({"epoch": 2, "train_loss": 0.5, "replicas_min": 3, "replicas_max": 4}, 0, 0.0)
    assert telemetry._last[("raytrain_training_workers", (("run", "r"),))][0] == 3


def test_rank_0_exports_the_runs_goodput_by_cause_and_its_progress_from_the_records(tmp_path):
    """What the dashboard's goodput panels show is goodput.read of the run's records: every cause (they sum to the
    wall time), the ratio, the percent done and the time left; a run directory that cannot be read exports nothing
    and raises nothing (the next epoch tries again)."""
    from raytrain.rundir import goodput, runrecords

    records = runrecords.Records(tmp_path)
    records.append_event("start", attempt=1, epoch=1)
    for epoch in (1, 2):
        records.append_metrics({"epoch": epoch, "train_loss": 0.5, "attempt": 1,
                                "timing": {"time": time.time(), "data_s": 0.01, "val_s": 0.02,
                                           "checkpoint_s": 0.0}})
    telemetry = RunTelemetry("r", 0, 32, epochs=4)
    telemetry.started(tmp_path, 1)
    telemetry.epoch_end({"epoch": 2, "train_loss": 0.5}, 0, 0.0)
    telemetry._export_goodput()
    values = {(name, dict(tags).get("cause")): value for (name, tags), (value, _) in telemetry._last.items()}
    expected = goodput.read(tmp_path, 4)
    by_cause = {cause: values[("raytrain_goodput_seconds", cause)] for cause in goodput.CAUSES}
    assert sum(by_cause.values()) == pytest.approx(sum(expected.seconds.values()), abs=0.5)
    assert values[("raytrain_progress_percent", None)] == 50.0
    assert values[("raytrain_goodput_ratio", None)] == pytest.approx(expected.goodput, abs=0.05)
    assert ("raytrain_time_left_seconds", None) in values

    broken = RunTelemetry("b", 0, 32, epochs=4)
    broken.run_dir = tmp_path / "missing" / "\x00"
    broken._export_goodput()
    assert not any(name.startswith("raytrain_goodput") for name, _ in broken._last)


@pytest.mark.parametrize("since_change_s, expected_wait_s", [(0.0, 3.0), (1.0, 2.0), (5.0, 0.0)])
def test_rank_0_lingers_one_report_after_the_last_change_of_a_value(monkeypatch, since_change_s, expected_wait_s):
    """The last epoch's values must reach one of Ray's reports (every RAY_metrics_report_interval_ms, 2 s here)
    before the worker exits; time already spent since they changed (the last checkpoint's commit) is not waited
    again, and setting an unchanged value again (the refresh thread's work) does not restart the wait."""
    import raytrain.worker.telemetry as telemetry_module

    monkeypatch.setenv("RAY_metrics_report_interval_ms", "2000")
    now = [1000.0]
    slept: list[float] = []
    monkeypatch.setattr(telemetry_module.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(telemetry_module.time, "sleep", slept.append)
    telemetry = RunTelemetry("r", 0, 32)
    telemetry._set("raytrain_epoch", 3)
    now[0] += since_change_s
    telemetry._set("raytrain_epoch", 3)  # the same value again
    telemetry.linger()
    assert slept and slept[-1] == pytest.approx(expected_wait_s)

    not_rank_0 = RunTelemetry("r", 1, 32)
    slept.clear()
    not_rank_0.linger()
    assert slept == []
