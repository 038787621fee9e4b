"""Local clusters without starting one: the shape a RayCluster spec gets on this machine, and stale-run cleanup.
The real clusters are in tests/integration/test_emulate.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.support.raycluster import group

from raytrain.cluster import localcluster
from raytrain.cluster.localcluster import ClusterError, cluster_shape
from raytrain.cluster.rayjobfile import cluster_spec, load_rayjob

REPO = Path(__file__).resolve().parents[2]
GiB = 2**30


def test_shape_of_the_chart_with_kind_values():
    """The RayCluster the chart renders for kind: head 1 CPU, two 1-CPU workers, token auth on."""
    job = load_rayjob(REPO / "manifests" / "rayjob.yaml")
    spec, name, owned = cluster_spec(job, REPO / "helm" / "raytrain-cluster" / "values-kind.yaml")
    assert (name, owned) == ("raytrain", False)
    shape = cluster_shape(spec, max_worker_nodes=4, memory_budget=64 * GiB)
    assert shape.auth_token
    assert [(n.name, n.num_cpus, n.memory) for n in shape.nodes] == [
        ("head", 1, 2 * GiB), ("worker-0", 1, 2 * GiB), ("worker-1", 1, 2 * GiB)]
    assert shape.notes == []


def test_shape_carries_what_kubelet_does_on_deletion():
    """Each node keeps its Ray container's preStop exec and its pod's grace period (Kubernetes' default 30 s)."""
    job = load_rayjob(REPO / "manifests" / "rayjob-standalone.yaml")
    spec, _, _ = cluster_spec(job, None)
    shape = cluster_shape(spec, max_worker_nodes=4, memory_budget=64 * GiB)
    assert {(tuple(n.pre_stop), n.grace_seconds) for n in shape.nodes} == {(("raytrain", "drain", "--wait", "50"), 60)}
    bare = cluster_shape({"headGroupSpec": group(cpu="1")}, max_worker_nodes=0, memory_budget=64 * GiB)
    assert (bare.head.pre_stop, bare.head.grace_seconds) == ([], 30)


def test_shape_rules_follow_kuberay():
    spec = {"headGroupSpec": group(cpu="1500m", params={"num-cpus": "0"}),
            "workerGroupSpecs": [group(cpu="500m", memory="1Gi", replicas=2,
                                       params={"resources": '"{\\"CUSTOM\\": 2}"', "object-store-memory": "100000000"}),
                                 group(name="off", replicas=3, suspend=True),
                                 group(name="minonly", minReplicas=1)]}
    shape = cluster_shape(spec, max_worker_nodes=8, memory_budget=64 * GiB)
    assert shape.head.num_cpus == 0  # rayStartParams win over limits
    worker = shape.workers[0]
    assert worker.num_cpus == 1  # 500m rounds up, as KubeRay's quantity.Value() does
    assert worker.memory == GiB and worker.resources == {"CUSTOM": 2.0}
    assert worker.params == {"object-store-memory": "100000000"}  # passed through; resources handled
    assert [n.name for n in shape.workers] == ["worker-0", "worker-1", "minonly-0"]
    assert any("off: suspended" in note for note in shape.notes)
    assert not shape.auth_token


def test_shape_is_capped_with_a_note():
    spec = {"headGroupSpec": group(), "workerGroupSpecs": [group(replicas=5, memory="4Gi")]}
    shape = cluster_shape(spec, max_worker_nodes=2, memory_budget=64 * GiB)
    assert len(shape.workers) == 2
    assert any("5 replica(s) asked, 2 started" in note for note in shape.notes)
    tight = cluster_shape(spec, max_worker_nodes=8, memory_budget=10 * GiB)
    assert len(tight.workers) == 1  # head 2Gi + one 4Gi worker (+ overheads) fit 10 GiB, two do not


def test_a_bad_quantity_is_a_cluster_error_naming_the_field():
    with pytest.raises(ClusterError, match=r"workerGroupSpecs\[0\]\.rayStartParams\.num-cpus: '2 cores' is not"):
        cluster_shape({"headGroupSpec": group(), "workerGroupSpecs": [group(replicas=1, params={"num-cpus": "2 cores"})]})


def test_shape_without_head_group_names_the_field():
    with pytest.raises(ClusterError, match=r"rayClusterSpec\.headGroupSpec: missing"):
        cluster_shape({"workerGroupSpecs": []})
    with pytest.raises(ClusterError, match=r"headGroupSpec\.template\.spec\.containers"):
        cluster_shape({"headGroupSpec": {"rayStartParams": {}}})


def test_clean_stale_removes_dead_runs_and_keeps_live_and_kept_ones(tmp_path):
    me = {"owner_pid": os.getpid(), "owner_started": localcluster.process_start(os.getpid()), "nodes": []}
    dead = {"owner_pid": os.getpid(), "owner_started": -1.0, "nodes": []}  # same PID, other start: a reused PID
    for name, state in [("rte000001", me), ("rte000002", dead), ("rte000003", {**dead, "keep": True})]:
        (tmp_path / name).mkdir()
        (tmp_path / name / "state.json").write_text(json.dumps(state))
    (tmp_path / "rte000002-shared").mkdir()  # the shared storage outlives its cluster
    (tmp_path / "rtx000004").mkdir()  # not ours
    assert localcluster.clean_stale(root=tmp_path) == ["rte000002"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rte000001", "rte000002-shared", "rte000003", "rtx000004"]


@pytest.mark.parametrize("content, pending", [
    (None, False), ('{"until": 1e12}', True), ('{"until": 1}', False), ("{", False), ('{"until": "soon"}', False),
    ("[]", False), ('{"until": null}', False),
])
def test_a_deleted_nodes_pending_marker_holds_its_restart_until_it_expires(tmp_path, content, pending):
    from types import SimpleNamespace

    node = SimpleNamespace(spec=SimpleNamespace(name="worker-0"))
    marker = localcluster.pending_path(tmp_path, "worker-0")
    if content is not None:
        marker.write_text(content)
    left = localcluster.LocalCluster.pending_for(SimpleNamespace(run_dir=tmp_path), node)
    assert (left > 0) == pending
    if content == '{"until": 1}':
        assert not marker.exists()  # an expired marker is removed once the pod may start
