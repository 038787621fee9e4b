"""The cluster shape read from a RayCluster spec, as KubeRay v1.7.0 reads it (common/pod.go)."""

from __future__ import annotations

import re

import pytest

from tests.support.raycluster import group

from raytrain.validator.quantity import QuantityError
from raytrain.validator.shape import (
    ShapeError, groups, max_replicas, node_resources, node_spec, parse_resources_param, shared_mounts, start_replicas,
)

GiB = 2**30


def test_node_spec_follows_kuberay():
    spec = node_spec(group(cpu="500m", memory="1Gi", params={"resources": '"{\\"CUSTOM\\": 2}"',
                                                             "object-store-memory": "100000000"}), "w-0", "w", False, "g")
    assert spec.num_cpus == 1  # 500m rounds up, as KubeRay's quantity.Value() does
    assert spec.memory == GiB and spec.resources == {"CUSTOM": 2.0}
    assert spec.params == {"object-store-memory": "100000000"}  # passed through; resources handled
    assert node_spec(group(cpu="1500m", params={"num-cpus": "0"}), "h", "h", True, "g").num_cpus == 0  # params win


def test_cpu_falls_back_to_the_request_and_gpus_to_any_gpu_key():
    g = group()
    g["template"]["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "2", "memory": "1Gi"},
                                                          "limits": {"amd.com/gpu": "1"}}
    spec = node_spec(g, "w", "w", False, "g")
    assert (spec.num_cpus, spec.num_gpus) == (2, 1)
    assert spec.memory is None  # KubeRay reads memory from the limit only


def test_group_resources_override_the_container():
    spec = node_spec(group(cpu="4", resources={"CPU": "2", "memory": "1Gi", "nvidia.com/gpu": "1", "TPU": "4"}),
                     "w", "w", False, "g")
    assert (spec.num_cpus, spec.memory, spec.num_gpus, spec.resources) == (2, GiB, 1, {"TPU": 4.0})


@pytest.mark.parametrize("where, bad", [
    ("rayStartParams.num-cpus", lambda g: g["rayStartParams"].update({"num-cpus": "2 cores"})),
    ("resources.CPU", lambda g: g.update(resources={"CPU": "2 cores"})),
    ("template.spec.containers[0].resources.limits.cpu",
     lambda g: g["template"]["spec"]["containers"][0]["resources"]["limits"].update(cpu="2 cores")),
])
def test_a_bad_quantity_names_its_field(where, bad):
    g = group()
    bad(g)
    with pytest.raises(QuantityError, match="^" + re.escape(f"spec.workerGroupSpecs[0].{where}: '2 cores'")):
        node_resources({"headGroupSpec": group(), "workerGroupSpecs": [g | {"replicas": 1}]})


def test_a_group_without_a_container_is_a_shape_error():
    with pytest.raises(ShapeError, match=r"headGroupSpec\.template\.spec\.containers"):
        node_spec({"rayStartParams": {}}, "head", "head", True, "spec.headGroupSpec")


@pytest.mark.parametrize("text, value", [
    ('"{\\"TPU\\": 4}"', {"TPU": 4.0}), ('{"a": 1, "b": 0.5}', {"a": 1.0, "b": 0.5}), ("'{\"x\": 2}'", {"x": 2.0}),
])
def test_parse_resources_param(text, value):
    assert parse_resources_param(text, "w") == value


@pytest.mark.parametrize("text", ["{TPU: 4}", '["TPU"]', '{"TPU": "four"}'])
def test_parse_resources_param_rejects(text):
    with pytest.raises(ShapeError, match="rayStartParams.resources"):
        parse_resources_param(text, "g.rayStartParams.resources")


def test_replica_counts():
    assert start_replicas({"replicas": 5, "maxReplicas": 3, "numOfHosts": 2}) == 6
    assert start_replicas({"minReplicas": 1}) == 1
    assert max_replicas({"replicas": 1, "maxReplicas": 4}, autoscaling=True) == 4
    assert max_replicas({"replicas": 1, "maxReplicas": 4}, autoscaling=False) == 1


def test_node_resources_counts_each_group_at_its_largest():
    spec = {"enableInTreeAutoscaling": True, "headGroupSpec": group(params={"num-cpus": "0"}),
            "workerGroupSpecs": [group(cpu="2", replicas=1, maxReplicas=3),
                                 group(cpu="1", replicas=0, maxReplicas=2147483647)]}  # the CRD's default
    nodes = node_resources(spec)
    assert nodes[:4] == [{"CPU": 0, "GPU": 0}] + [{"CPU": 2, "GPU": 0}] * 3
    assert len(nodes) == 4 + 4096  # a defaulted maxReplicas is counted up to a bound, not 2^31 times


def test_groups_and_shared_mounts():
    pvc = {"name": "shared", "persistentVolumeClaim": {"claimName": "c"}}
    mount = {"name": "shared", "mountPath": "/mnt/shared"}
    head, worker = group(), group(replicas=1)
    for g in (head, worker):
        g["template"]["spec"]["volumes"] = [pvc, {"name": "tmp", "emptyDir": {}}]
        g["template"]["spec"]["containers"][0]["volumeMounts"] = [mount, {"name": "tmp", "mountPath": "/tmp"}]
    spec = {"headGroupSpec": head, "workerGroupSpecs": [worker]}
    assert [(path, name) for path, name, _ in groups(spec)] == [
        ("spec.headGroupSpec", "Head"), ("spec.workerGroupSpecs[0]", "worker")]
    assert shared_mounts(spec) == ["/mnt/shared"]
    worker["template"]["spec"]["containers"][0]["volumeMounts"] = [mount | {"mountPath": "/data"}]
    assert shared_mounts(spec) == []


@pytest.mark.parametrize("grace, seconds", [(None, 30), (0, 0), (60, 60), (-5, 1)])
def test_the_grace_period_is_the_one_the_api_server_stores(grace, seconds):
    """`raytrain emulate` kills a deleted node after it: a negative one is stored as 1 s (issue 40)."""
    g = group()
    if grace is not None:
        g["template"]["spec"]["terminationGracePeriodSeconds"] = grace
    assert node_spec(g, "w-0", "w", False, "g").grace_seconds == seconds
