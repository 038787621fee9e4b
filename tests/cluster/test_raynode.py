"""One node's `ray start` command and its ports."""

from __future__ import annotations

import pytest

from raytrain.cluster.raynode import ClusterError, Ports, ray_start_command
from raytrain.validator.shape import NodeSpec

GiB = 2**30


def test_ray_start_command_for_head_and_worker():
    ports = Ports()
    head = ray_start_command(NodeSpec("head", "head", True, num_cpus=0, memory=2 * GiB, params={"disable-usage-stats": "true"}),
                             ray_bin="ray", node_ip="10.0.0.2", temp_dir="/tmp/x", ports=ports, head_address=None,
                             dashboard_host="0.0.0.0")
    assert head[:2] == ["ray", "start"] and "--head" in head and "--block" in head
    assert "--num-cpus=0" in head and f"--memory={2 * GiB}" in head and "--dashboard-host=0.0.0.0" in head
    assert any(a.startswith("--object-store-memory=") for a in head)  # kept inside the pod's memory
    worker = ray_start_command(NodeSpec("w", "w", False, resources={"A": 1}), ray_bin="ray", node_ip="10.0.0.3",
                               temp_dir="/tmp/y", ports=ports, head_address="10.0.0.2:6379", dashboard_host="x")
    assert "--address=10.0.0.2:6379" in worker and '--resources={"A":1}' in worker and "--head" not in worker
    with pytest.raises(ClusterError, match="head's address"):
        ray_start_command(NodeSpec("w", "w", False), ray_bin="ray", node_ip="1", temp_dir="/t", ports=ports,
                          head_address=None, dashboard_host="x")


def test_ports_pick_distinct():
    ports = list(vars(Ports.pick()).values())
    assert len(set(ports)) == len(ports)
