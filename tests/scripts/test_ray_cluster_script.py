"""scripts/ray-cluster is a thin entry point: its usage, and `raytrain cluster` behind it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.support.tools import require_tool

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "ray-cluster"


def test_usage_and_the_cli_behind_it(tmp_path):
    usage = subprocess.run([str(SCRIPT), "--help"], capture_output=True, text=True, timeout=60)
    assert usage.returncode == 0 and usage.stdout.startswith("Ray on plain machines") and "Usage:" in usage.stdout
    env = {"PATH": "/usr/bin:/bin", "RAYTRAIN_PYTHON": sys.executable}
    stop = subprocess.run([str(SCRIPT), "stop", str(tmp_path / "no-node")], capture_output=True, text=True,
                          timeout=60, env=env)
    assert stop.returncode == 1 and f"nothing to stop at {tmp_path / 'no-node'}" in stop.stdout, stop.stderr


def test_shellcheck_passes():
    lint = subprocess.run([require_tool("shellcheck"), str(SCRIPT)], capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout + lint.stderr
