"""The chart's opt-in Grafana dashboard ConfigMap (templates/grafana-dashboard.yaml), rendered with real Helm."""

import json

import pytest

from raytrain.validator.render import ChartError, lint_chart, render_chart
from pathlib import Path

CHART = Path(__file__).resolve().parents[2] / "helm" / "raytrain-cluster"
DASHBOARD = CHART / "dashboards" / "raytrain.json"
CHOSEN = Path(__file__).resolve().parents[1] / "support" / "chosen-values.yaml"  # the image and storage the installer chooses


def config_maps(**set_values):
    return [o for o in render_chart(CHART, [CHOSEN], set_values or None) if o["kind"] == "ConfigMap"]


def test_off_by_default():
    assert config_maps() == []


def test_enabled_it_ships_the_dashboard_where_grafanas_sidecar_looks():
    [cm] = config_maps(**{"grafanaDashboard.enabled": True})
    meta = cm["metadata"]
    assert meta["name"] == "raytrain-grafana-dashboard" and meta["namespace"] == "default"
    assert meta["labels"]["grafana_dashboard"] == "1"  # kube-prometheus-stack's sidecar label
    assert meta["labels"]["app.kubernetes.io/instance"] == "raytrain"
    assert "annotations" not in meta
    [(key, text)] = cm["data"].items()
    assert key.endswith(".json") and json.loads(text) == json.loads(DASHBOARD.read_text())


def test_namespace_labels_and_folder_annotation_are_settable():
    [cm] = config_maps(**{"grafanaDashboard.enabled": True, "grafanaDashboard.namespace": "monitoring",
                          "grafanaDashboard.labels.team": "ml", "grafanaDashboard.annotations.grafana_folder": "Ray"})
    assert cm["metadata"]["namespace"] == "monitoring"
    assert cm["metadata"]["labels"]["team"] == "ml" and cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "Ray"}


def test_strict_lint_is_clean_with_the_dashboard_on(tmp_path):
    values = tmp_path / "values-dashboard.yaml"
    values.write_text("grafanaDashboard:\n  enabled: true\n")
    assert lint_chart(CHART, [values], strict=True) == []


@pytest.mark.parametrize("key, value", [
    ("grafanaDashboard.enabled", "yes"),
    ("grafanaDashboard.labels.grafana_dashboard", 1),
    ("grafanaDashboard.folder", "Ray"),
])
def test_schema_rejects_bad_values(key, value):
    with pytest.raises(ChartError, match="grafanaDashboard"):
        render_chart(CHART, [CHOSEN], {key: value})


def test_dashboard_is_a_grafana_dashboard_with_a_run_selector():
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] == "raytrain-runs" and dashboard["panels"]
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["query"] == "prometheus"
    assert variables["run"]["includeAll"] and variables["run"]["multi"]
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}" and panel["targets"], panel["title"]
