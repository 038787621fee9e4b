"""A run on an autoscaling cluster scaled to zero (issue #28 item 4): a real Ray head with a real autoscaler (Ray's
own monitor, with its fake multi-node provider starting each worker node as a local raylet, as Ray's autoscaler
tests do) and no worker node up. `raytrain run` asks the autoscaler for its workers, waits, and trains; a job the
autoscaler cannot hold ends with the message that says so.

Only this test's processes are stopped (those naming its temp dir): never `ray stop`, which would end every Ray on
the machine.

    .venv/bin/python -m pytest -m integration tests/integration/test_scaleup.py -v
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from ray.autoscaler._private.fake_multi_node.node_provider import FAKE_HEAD_NODE_ID

from raytrain.cluster.raynode import free_port
from raytrain.platform import processes

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def autoscaling_config(gcs_address: str) -> dict:
    """A cluster of a 0-CPU head and one worker type of 3 CPUs, 0 to 1 nodes: KubeRay's head (num-cpus 0) and a
    worker group with minReplicas 0, scaled to zero."""
    return {
        "cluster_name": "raytrain-scaleup", "max_workers": 1, "upscaling_speed": 1.0, "idle_timeout_minutes": 1,
        # As the provider's own example config: a fake node's address is its node id (the head's: FAKE_HEAD_NODE_ID,
        # set below), and no node updater (as KubeRay's autoscaler config): the pods bring their own `ray start`.
        "provider": {"type": "fake_multinode", "gcs_address": gcs_address, "use_node_id_as_ip": True,
                     "disable_node_updaters": True, "disable_launch_config_check": True},
        "head_node_type": "ray.head.default",
        "available_node_types": {
            "ray.head.default": {"resources": {"CPU": 0}, "node_config": {}, "max_workers": 0},
            "worker": {"resources": {"CPU": 3}, "node_config": {}, "min_workers": 0, "max_workers": 1},
        },
        "auth": {"ssh_user": "ray"}, "docker": {}, "file_mounts": {}, "cluster_synced_files": [],
        "file_mounts_sync_continuously": False, "rsync_exclude": [], "rsync_filter": [],
        "initialization_commands": [], "setup_commands": [], "head_setup_commands": [], "worker_setup_commands": [],
        "head_start_ray_commands": [], "worker_start_ray_commands": [],
    }


@pytest.fixture
def scaled_to_zero():
    """(GCS address, temp dir) of a head whose autoscaler has started no worker yet."""
    temp_dir = tempfile.mkdtemp(prefix="rtsu")  # short: Ray's socket paths live under it
    port = free_port()
    import ray._private.services as services

    address = f"{services.get_node_ip_address()}:{port}"
    config = Path(temp_dir) / "autoscaling.json"
    config.write_text(json.dumps(autoscaling_config(address)))
    ray_bin = str(Path(sys.executable).parent / "ray")
    # RAY_AUTH_MODE=disabled: a head pod without a token (`ray start` turns auth on when it finds ~/.ray/auth_token,
    # which an embedded run elsewhere on this machine writes; a client given an address never sends it unasked).
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_FAKE_CLUSTER": "1", "AUTOSCALER_UPDATE_INTERVAL_S": "1",
           "RAY_CLOUD_INSTANCE_ID": FAKE_HEAD_NODE_ID, "RAY_OVERRIDE_NODE_ID_FOR_TESTING": FAKE_HEAD_NODE_ID}
    try:
        subprocess.run([ray_bin, "start", "--head", f"--port={port}", "--num-cpus=0", f"--temp-dir={temp_dir}",
                        f"--autoscaling-config={config}", "--include-dashboard=false", "--disable-usage-stats"],
                       env=env, check=True, capture_output=True, text=True, timeout=120)
        yield address, temp_dir
    finally:
        processes.kill_pids(processes.pids_mentioning(temp_dir))
        shutil.rmtree(temp_dir, ignore_errors=True)


def monitor_log(temp_dir: str) -> str:
    logs = sorted(Path(temp_dir).glob("session_*/logs/monitor.*"))
    return "\n".join(f"{log}:\n{log.read_text(errors='replace')[-2000:]}" for log in logs) or f"no monitor log in {temp_dir}"


def test_a_run_on_a_cluster_scaled_to_zero_asks_the_autoscaler_waits_and_trains(scaled_to_zero, tmp_path):
    import ray

    from raytrain.driver.raytrainer import alive_node_resources
    from raytrain.driver.scaleup import autoscaler_running, size_on_cluster
    from raytrain.errors import LaunchError
    from raytrain.spec.config import load_config

    address, temp_dir = scaled_to_zero
    ray.init(address=address, logging_level="WARNING", log_to_driver=False)
    try:
        # A loaded machine starts the monitor late; if it never reports, its own log says why.
        assert autoscaler_running(first_report_s=120), monitor_log(temp_dir)
        assert [n.get("CPU", 0.0) for n in alive_node_resources()] == [0.0]  # the head alone
    finally:
        ray.shutdown()

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "training"), str(REPO)])}
    done = subprocess.run([sys.executable, "-m", "raytrain.cli", "run", "linear", "--set", "train.epochs=2",
                           "--name", "grown", "--storage", str(tmp_path), "--address", address],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "hold fewer than 3 workers of {CPU 1}: asked the autoscaler for them" in done.stdout, done.stdout
    assert re.search(r"2 node\(s\) up after \d+ s", done.stdout), done.stdout
    assert "training grown: 3 workers x {CPU 1}" in done.stdout, done.stdout
    result = json.loads((tmp_path / "grown" / "result.json").read_text())
    assert result["status"] == "succeeded" and result["epochs_completed"] == 2

    # More than the autoscaler can ever add (one 3-CPU node): a bounded wait and the message that says so.
    ray.init(address=address, logging_level="WARNING", log_to_driver=False)
    try:
        too_big = load_config("linear", ["scaling.num_workers=4", "train.batch_size=24"])
        with pytest.raises(LaunchError, match=r"the autoscaler did not bring up room for 4 workers .* maxReplicas"):
            size_on_cluster(too_big, alive_node_resources, timeout_s=3)
    finally:
        ray.shutdown()


def test_a_cluster_without_an_autoscaler_is_not_waited_on():
    """Ray starts a monitor on every head, also without autoscaling (an embedded Ray, a KubeRay cluster without
    enableInTreeAutoscaling): it only mirrors the nodes and can add none, so a job that can never fit still fails
    at once, as before."""
    import time

    import ray
    from ray._private import ray_constants
    from ray.experimental import internal_kv

    from raytrain.driver.raytrainer import alive_node_resources
    from raytrain.driver.scaleup import autoscaler_running, size_on_cluster
    from raytrain.errors import LaunchError
    from raytrain.spec.config import load_config

    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="WARNING", log_to_driver=False)
    try:
        deadline = time.monotonic() + 60
        while not internal_kv._internal_kv_get(ray_constants.DEBUG_AUTOSCALING_STATUS):  # the monitor has reported
            assert time.monotonic() < deadline, "Ray's monitor never wrote its status"
            time.sleep(0.5)
        assert not autoscaler_running()
        started = time.monotonic()
        with pytest.raises(LaunchError, match="can never be scheduled"):
            size_on_cluster(load_config("linear", ["scaling.cpus_per_worker=4"]), alive_node_resources)
        assert time.monotonic() - started < 10
    finally:
        ray.shutdown()
