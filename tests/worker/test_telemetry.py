"""raytrain.worker.telemetry: what it exports is what the chart's dashboard queries (the real Prometheus test is
tests/integration/test_prometheus.py), and the checkpoint time it starts from."""

import json
import re
from pathlib import Path

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
    assert len(exported_names()) == len(GAUGES) + len(COUNTERS)


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
