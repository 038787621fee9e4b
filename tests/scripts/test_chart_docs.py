"""scripts/chart-docs: the chart's README tables and values.schema.json are what Bitnami's readme-generator-for-helm
makes of values.yaml's `## @param` comments (plus values.schema.rules.json), never hand-edited."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "chart-docs"
CHART = REPO / "helm" / "raytrain-cluster"


def chart_docs(*args: str, chart: Path = CHART) -> subprocess.CompletedProcess:
    if not (shutil.which("npx") and shutil.which("node")):
        pytest.skip("node/npx not installed: scripts/chart-docs runs Bitnami's readme-generator-for-helm through npx")
    return subprocess.run([str(SCRIPT), *args], cwd=REPO, env={**os.environ, "CHART": str(chart)}, capture_output=True,
                          text=True, timeout=600)


def test_regenerating_the_readme_and_schema_gives_no_diff():
    result = chart_docs("--check")
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_value_without_a_param_comment_is_refused_and_a_stale_table_is_shown(tmp_path):
    chart = tmp_path / "chart"
    shutil.copytree(CHART, chart)
    values = chart / "values.yaml"
    values.write_text(values.read_text().replace("  ## @param image.pullPolicy Image pull policy\n", ""))
    undocumented = chart_docs("--check", chart=chart)
    assert undocumented.returncode == 1 and "Missing metadata for key: image.pullPolicy" in undocumented.stderr
    shutil.copy(CHART / "values.yaml", values)
    values.write_text(values.read_text().replace("Image pull policy", "How the kubelet pulls the image"))
    stale = chart_docs("--check", chart=chart)
    assert stale.returncode == 1 and "+| `image.pullPolicy`" in stale.stdout and "run scripts/chart-docs" in stale.stderr
    written = chart_docs(chart=chart)
    assert written.returncode == 0, written.stderr
    assert "How the kubelet pulls the image" in (chart / "README.md").read_text()
    schema = json.loads((chart / "values.schema.json").read_text())
    assert schema["properties"]["image"]["properties"]["pullPolicy"]["description"] == "How the kubelet pulls the image"
    assert chart_docs("--check", chart=chart).returncode == 0
