"""What the integration tier shares: one real Ray head node per test session for the tests that only join a cluster
and leave it as they found it (each pytest-xdist worker is its own session, so each has its own head). A test that
kills, drains, suspends or resizes nodes starts its own cluster (an embedded Ray, `raytrain emulate`, a
LocalCluster) and stops only that one.

Isolation for running in parallel (scripts/test runs this tier on two xdist workers): every cluster here and in the
tests takes free ports, its own short temp dir under /tmp (Ray's socket paths) and its own run names under the
test's tmp_path; tests that must not share the machine's cores with another test are marked `serial` and run in
scripts/test's second pass, alone.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from raytrain.cluster import dashboard, raynode
from raytrain.platform import processes
from raytrain.validator import shape

RAY = str(Path(sys.executable).parent / "ray")
# Ray's floor is ~75 MB; test_workloads' streaming run moves 4x this through it.
HEAD_OBJECT_STORE_BYTES = 100 * 10**6
# test_prometheus scrapes every second: the head's processes report their metrics that often (Ray's default: 10 s).
HEAD_METRICS_REPORT_MS = 1000
# The same for every cluster the tier starts (embedded, local, emulated: each inherits this environment). A run on a
# cluster waits out one metrics report before it ends, so that Prometheus gets its last epoch (worker/telemetry.py,
# Telemetry.linger): 2 s at this interval instead of 11 s, for each of the tier's cluster runs.
os.environ.setdefault("RAY_metrics_report_interval_ms", str(HEAD_METRICS_REPORT_MS))


@dataclass(frozen=True)
class RayHead:
    address: str  # GCS address, what `raytrain run --address` takes
    temp_dir: Path  # Ray writes prom_metrics_service_discovery.json here
    dashboard_url: str
    object_store_bytes: int


@pytest.fixture(scope="session")
def ray_head(tmp_path_factory) -> Iterator[RayHead]:
    """A real single-node Ray cluster (2 CPUs, a deliberately small object store, metrics reported every second)
    that `raytrain run|tune --address` joins: each joining run saves Ray's start-up. Only its own processes are
    stopped afterwards (those under its temp dir), never another Ray on the machine."""
    temp_dir = f"/tmp/rth{secrets.token_hex(3)}"  # short: Ray's socket paths under it must stay within 107 bytes
    ports = raynode.Ports.pick()
    # Its workers' ports (and a joining driver's) from a window of its own: in Ray's default range (10002-19999),
    # which every other Ray on the machine also uses, a driver died binding a port another process held.
    low = 20000 + 1000 * secrets.randbelow(10)
    head = shape.NodeSpec(name="head", group="head", head=True, num_cpus=2,
                          params={"object-store-memory": str(HEAD_OBJECT_STORE_BYTES), "min-worker-port": str(low),
                                  "max-worker-port": str(low + 999)})
    cmd = raynode.ray_start_command(head, ray_bin=RAY, node_ip="127.0.0.1", temp_dir=temp_dir, ports=ports,
                                    head_address=None, dashboard_host="127.0.0.1")
    env = {**raynode.bare_environ(os.environ), "RAY_metrics_report_interval_ms": str(HEAD_METRICS_REPORT_MS)}
    log_path = tmp_path_factory.mktemp("ray-head") / "ray.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    try:
        url = f"http://127.0.0.1:{ports.dashboard}"
        try:
            dashboard.wait_dashboard(url, None, timeout=120)
        except BaseException:
            print(log_path.read_text()[-3000:])
            raise
        yield RayHead(address=f"127.0.0.1:{ports.gcs}", temp_dir=Path(temp_dir), dashboard_url=url,
                      object_store_bytes=HEAD_OBJECT_STORE_BYTES)
    finally:
        processes.kill_pids(processes.tree_pids(proc.pid) + processes.pids_mentioning(temp_dir))
        shutil.rmtree(temp_dir, ignore_errors=True)
