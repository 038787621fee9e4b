"""`raytrain cluster` on this machine, as on two VMs: a head and a worker (each its own temp dir, free ports, token
auth), status through the dashboard, a refused second head, and stop removing exactly what each started."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from raytrain.platform import processes

pytestmark = pytest.mark.integration

RAYTRAIN = [sys.executable, "-m", "raytrain.cli", "cluster"]
REPO = Path(__file__).resolve().parents[2]


def cluster(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([*RAYTRAIN, *args], capture_output=True, text=True, timeout=timeout, cwd=REPO)


@pytest.fixture
def short_tmp():
    """A short directory: Ray's socket paths under a node's temp dir must stay within 107 bytes."""
    path = Path(tempfile.mkdtemp(prefix="rtc", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_a_temp_dir_too_long_for_rays_sockets_is_refused_at_once(tmp_path):
    done = cluster("head", "--temp-dir", str(tmp_path / ("x" * 60)), "--node-ip", "127.0.0.1", "--free-ports",
                   timeout=60)
    assert done.returncode == 1 and "is too long" in done.stderr and "Fix: use a shorter directory" in done.stderr


def test_head_join_status_stop(short_tmp):
    tmp_path = short_tmp
    head_dir, worker_dir = tmp_path / "head", tmp_path / "worker"
    common = ["--node-ip", "127.0.0.1", "--free-ports", "--num-cpus", "1"]
    try:
        head = cluster("head", "--temp-dir", str(head_dir), *common)
        assert head.returncode == 0, head.stdout + head.stderr
        record = json.loads((head_dir / "node.json").read_text())
        assert f"raytrain cluster join {record['gcs_address']} --token-file {head_dir / 'auth_token'}" in head.stdout
        again = cluster("head", "--temp-dir", str(head_dir), *common)
        assert again.returncode == 1 and "is running" in again.stderr and "raytrain cluster stop" in again.stderr
        join = cluster("join", record["gcs_address"], "--temp-dir", str(worker_dir), "--token-file",
                       str(head_dir / "auth_token"), *common)
        assert join.returncode == 0, join.stdout + join.stderr
        for _ in range(30):  # the worker registers with the GCS shortly after its `ray start` returns
            status = cluster("status", "--address", record["dashboard_url"], "--token-file", str(head_dir / "auth_token"))
            assert status.returncode == 0, status.stderr
            roles = [line.split()[1] for line in status.stdout.splitlines()]
            if roles.count("worker") == 1:
                break
            time.sleep(1)
        assert sorted(roles) == ["head", "worker"], status.stdout
    finally:
        for directory in (worker_dir, head_dir):
            cluster("stop", str(directory))
    assert not processes.pids_mentioning(str(tmp_path)), "processes of the stopped nodes are left"
    assert cluster("stop", str(head_dir)).returncode == 1  # nothing left to stop
