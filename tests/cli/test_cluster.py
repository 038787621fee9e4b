"""`raytrain cluster`'s arguments, without starting Ray (tests/integration/test_cluster.py starts real nodes)."""

from __future__ import annotations

import pytest

from raytrain.cli import build_parser
from raytrain.cli.cluster import node_ports
from raytrain.cluster.raynode import Ports


@pytest.mark.parametrize(("argv", "gcs", "dashboard"), [
    (["cluster", "head"], 6379, 8265),  # Ray's defaults, as `ray start --head`
    (["cluster", "head", "--port", "7000", "--dashboard-port", "7001"], 7000, 7001),
    (["cluster", "head", "--free-ports", "--port", "7000"], 7000, None),  # asked for wins; the rest free
])
def test_a_heads_ports_are_rays_defaults_what_was_asked_or_free(argv, gcs, dashboard):
    ports = node_ports(build_parser().parse_args(argv))
    assert ports.gcs == gcs
    if dashboard is not None:
        assert ports.dashboard == dashboard
    else:
        assert ports.dashboard != Ports().dashboard


def test_free_ports_frees_the_gcs_and_dashboard_ports_too():
    """Ray's defaults may belong to another head on this machine (a second head with --free-ports joined it)."""
    ports = node_ports(build_parser().parse_args(["cluster", "head", "--free-ports"]))
    assert ports.gcs != 6379 and ports.dashboard != 8265
    assert len({getattr(ports, name) for name in Ports.__dataclass_fields__}) == len(Ports.__dataclass_fields__)


def test_a_joining_node_takes_free_ports_with_free_ports():
    ports = node_ports(build_parser().parse_args(["cluster", "join", "10.0.0.1:6379", "--free-ports"]))
    assert ports.node_manager != Ports().node_manager
