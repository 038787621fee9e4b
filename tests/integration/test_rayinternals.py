"""rayinternals against a real two-node Ray cluster: the GCS reports the busy worker node DRAINING (asked about that
node alone) once it is drained, and never the head; Ray's AutoscalingCoordinator, which Ray
Train's elastic policy asks which workers fit, still allocates the drained node until refresh_autoscaling_coordinator
has it leave DRAINING nodes out."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap

import pytest

from raytrain.cluster.raynode import bare_environ, free_port
from raytrain.platform.processes import kill_pids, pids_mentioning

pytestmark = pytest.mark.integration

PROBE = textwrap.dedent("""
    import sys, time, ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    from ray.data._internal.cluster_autoscaler.default_autoscaling_coordinator import (
        get_or_create_autoscaling_coordinator)
    from raytrain.platform import rayinternals
    from ray._private import worker as w
    ray.init(address=sys.argv[1])
    # The head by Ray's own marker: Ray may register it under the host's address, whatever --node-ip-address said
    head = [n["NodeID"] for n in ray.nodes() if n["Alive"] and "node:__internal_head__" in n["Resources"]][0]
    node = [n["NodeID"] for n in ray.nodes() if n["Alive"] and n["NodeID"] != head][0]

    @ray.remote(num_cpus=1)
    class Busy:  # a drained idle node exits at once: keep this one busy
        def ping(self):
            return 1

    busy = Busy.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote()
    ray.get(busy.ping.remote())
    # Ray Train's elastic policy asks the AutoscalingCoordinator which workers fit: one 1-CPU worker, on the node
    coordinator = get_or_create_autoscaling_coordinator()
    ray.get(coordinator.request_resources.remote("raytrain-test", [{"CPU": 1}], 600))
    print("allocated", sorted(ray.get(coordinator.get_reserved_resources.remote("raytrain-test")).values(), key=str), flush=True)
    print("before", rayinternals.node_is_draining(node), flush=True)
    w.global_worker.gcs_client.drain_node(node, 2, "test", int((time.time() + 60) * 1000))
    deadline = time.time() + 10
    while not rayinternals.node_is_draining(node) and time.time() < deadline:
        time.sleep(0.2)
    print("after", rayinternals.node_is_draining(node), rayinternals.node_is_draining(head), flush=True)
    # Until its 20 s tick, the coordinator still counts the drained node; refreshed, it leaves it out
    print("stale", sorted(ray.get(coordinator.get_reserved_resources.remote("raytrain-test")).values(), key=str), flush=True)
    print("counted", rayinternals.refresh_autoscaling_coordinator(), flush=True)
    print("refreshed", sorted(ray.get(coordinator.get_reserved_resources.remote("raytrain-test")).values(), key=str), flush=True)
""")


def _start(command: list[str], env: dict[str, str]) -> None:
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{command}: {done.stdout[-2000:]}{done.stderr[-2000:]}"


def test_the_gcs_says_draining_for_the_drained_node_only_and_the_refreshed_coordinator_leaves_it_out():
    ray = os.path.join(os.path.dirname(sys.executable), "ray")
    # Without RAY_ADDRESS: ray.init() and `ray start` would follow it to another cluster, not the one given.
    env = {**bare_environ(os.environ), "RAY_USAGE_STATS_ENABLED": "0"}
    port = str(free_port("127.0.0.1"))  # never a fixed port: another cluster on the machine may hold it
    # A short temp dir: Ray's socket paths under it must stay within AF_UNIX's 107 bytes, which pytest's
    # tmp_path (pytest-of-<user>/pytest-<n>/<test name>) can exceed.
    temp = tempfile.mkdtemp(prefix="rt-drain-", dir="/tmp")
    try:
        _start([ray, "start", "--head", f"--port={port}", "--num-cpus=0", f"--temp-dir={temp}",
                "--node-ip-address=127.0.0.1", "--include-dashboard=false"], env)
        _start([ray, "start", f"--address=127.0.0.1:{port}", "--num-cpus=1", "--node-ip-address=127.0.0.2",
                f"--temp-dir={temp}"], env)
        probe = subprocess.run([sys.executable, "-c", PROBE, f"127.0.0.1:{port}"], capture_output=True, text=True,
                               env=env, timeout=180)
        lines = [line for line in probe.stdout.splitlines()
                 if line.startswith(("allocated", "before", "after", "stale", "counted", "refreshed"))]
        assert lines == ["allocated [{'CPU': 1}]", "before False", "after True False",
                         "stale [{'CPU': 1}]", "counted 0", "refreshed []"], probe.stdout + probe.stderr
    finally:  # only this test's Ray processes (they all name its temp dir): never another cluster on the machine
        kill_pids(pids_mentioning(temp), grace=3.0)
        shutil.rmtree(temp, ignore_errors=True)
