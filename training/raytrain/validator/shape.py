"""The cluster shape a RayCluster spec asks for, read the way KubeRay v1.7.0 reads it: its groups, the Ray
resources of each group's nodes, their replica counts and the mounts every group shares.

`raytrain validate` sizes a run against it (node_resources) and checks the storage path (shared_mounts);
the local clusters of `raytrain emulate` start one Ray node per NodeSpec.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from raytrain.validator.quantity import parse_quantity, whole_units

# Volumes that live and die with the pod: never the shared storage.
POD_LOCAL_VOLUMES = {"emptyDir", "configMap", "secret", "downwardAPI", "projected"}
# rayStartParams that say how much of a node Ray may use: NodeSpec holds them as numbers.
RESOURCE_PARAMS = ("num-cpus", "num-gpus", "memory", "resources")
MAX_NODES_SIZED = 4096


class ShapeError(ValueError):
    """The spec cannot be read as a cluster; the message names the field and the fix."""


def get(obj: Any, *keys: Any, default: Any = None) -> Any:
    """obj[k1][k2]... where every step exists and is not null, else default."""
    for key in keys:
        if isinstance(obj, dict):
            obj = obj.get(key)
        elif isinstance(obj, list) and isinstance(key, int) and -len(obj) <= key < len(obj):
            obj = obj[key]
        else:
            return default
        if obj is None:
            return default
    return obj


def groups(spec: dict, prefix: str = "spec") -> list[tuple[str, str, dict]]:
    """(field path, group name, group spec) for the head and every worker group."""
    out = [(f"{prefix}.headGroupSpec", "Head", spec.get("headGroupSpec") or {})]
    for i, group in enumerate(spec.get("workerGroupSpecs") or []):
        out.append((f"{prefix}.workerGroupSpecs[{i}]", str(group.get("groupName", i)), group))
    return out


def autoscaling_enabled(spec: dict | None) -> bool:
    # KubeRay's utils.IsAutoscalingEnabled
    return bool((spec or {}).get("enableInTreeAutoscaling"))


def is_gpu_resource(key: str) -> bool:
    """KubeRay's utils.IsGPUResourceKey: 'nvidia.com/gpu' and the like, or an NVIDIA MIG slice."""
    return key.endswith("gpu") or re.search(r"nvidia\.com/mig-\d+g\.\d+gb$", key) is not None


@dataclass
class NodeSpec:
    """One Ray node (one pod of a RayCluster group) and what Ray on it may use."""

    name: str
    group: str
    head: bool
    num_cpus: float | None = None
    num_gpus: float | None = None
    memory: int | None = None
    resources: dict[str, float] = field(default_factory=dict)
    params: dict[str, str] = field(default_factory=dict)  # the other rayStartParams, passed through as --key=value
    env: dict[str, str] = field(default_factory=dict)  # literal container env (valueFrom is not resolvable offline)
    # What kubelet does when the pod is deleted: the Ray container's preStop exec, then SIGTERM, then SIGKILL after
    # the pod's terminationGracePeriodSeconds (Kubernetes' default 30).
    pre_stop: list[str] = field(default_factory=list)
    grace_seconds: int = 30


def parse_resources_param(value: str, where: str) -> dict[str, float]:
    """rayStartParams.resources, written as in KubeRay samples: '"{\\"TPU\\": 4}"' or '{"TPU": 4}'."""

    text = str(value).strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        text = text[1:-1].replace('\\"', '"')
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as err:
        raise ShapeError(f"{where}: {value!r} is not a JSON object of resource amounts ({err.msg}). "
                         'Fix: write it like \'"{\\"CUSTOM\\": 1}"\'') from None
    if not isinstance(parsed, dict) or not all(isinstance(v, (int, float)) for v in parsed.values()):
        raise ShapeError(f"{where}: {value!r} must map resource names to numbers. Fix: e.g. '{{\"CUSTOM\": 1}}'")
    return {str(k): float(v) for k, v in parsed.items()}


def node_spec(group_spec: dict, name: str, group: str, head: bool, where: str) -> NodeSpec:
    """A group's node as KubeRay v1.7.0 starts it (common/pod.go generateRayStartCommand and
    updateRayStartParamsResources): rayStartParams win, else the Ray container's limits (CPU falls back to its
    request; CPUs and GPUs rounded up to whole units); the group's `resources` override both."""
    params = {str(k): str(v) for k, v in (group_spec.get("rayStartParams") or {}).items()}
    container = get(group_spec, "template", "spec", "containers", 0)
    if not isinstance(container, dict):
        raise ShapeError(f"{where}.template.spec.containers: a RayCluster group needs its Ray container first "
                         "in template.spec.containers. Fix: add the Ray container as the first container")
    limits = get(container, "resources", "limits", default={})
    requests = get(container, "resources", "requests", default={})
    res_where = f"{where}.template.spec.containers[0].resources"
    spec = NodeSpec(name=name, group=group, head=head)

    if "num-cpus" in params:
        spec.num_cpus = parse_quantity(params["num-cpus"], f"{where}.rayStartParams.num-cpus")
    elif parse_quantity(limits.get("cpu", 0), f"{res_where}.limits.cpu"):
        spec.num_cpus = float(whole_units(limits["cpu"], f"{res_where}.limits.cpu"))
    elif parse_quantity(requests.get("cpu", 0), f"{res_where}.requests.cpu"):
        spec.num_cpus = float(whole_units(requests["cpu"], f"{res_where}.requests.cpu"))
    if "memory" in params:
        spec.memory = int(parse_quantity(params["memory"], f"{where}.rayStartParams.memory"))
    elif parse_quantity(limits.get("memory", 0), f"{res_where}.limits.memory"):
        spec.memory = whole_units(limits["memory"], f"{res_where}.limits.memory")
    if "num-gpus" in params:
        spec.num_gpus = parse_quantity(params["num-gpus"], f"{where}.rayStartParams.num-gpus")
    else:
        for key in sorted(limits):  # KubeRay: the first GPU key in sorted order that is not zero
            if is_gpu_resource(key) and parse_quantity(limits[key], f"{res_where}.limits.{key}"):
                spec.num_gpus = float(whole_units(limits[key], f"{res_where}.limits.{key}"))
                break
    if "resources" in params:
        spec.resources = parse_resources_param(params["resources"], f"{where}.rayStartParams.resources")
    for key, value in (group_spec.get("resources") or {}).items():  # KubeRay >= 1.4: group-level Ray resources
        field_name = f"{where}.resources.{key}"
        if key.lower() == "cpu":
            spec.num_cpus = float(whole_units(value, field_name))
        elif key.lower() == "memory":
            spec.memory = whole_units(value, field_name)
        elif is_gpu_resource(key.lower()):
            spec.num_gpus = float(whole_units(value, field_name))
        else:
            spec.resources[key] = parse_quantity(value, field_name)
    spec.params = {k: v for k, v in params.items() if k not in RESOURCE_PARAMS}
    spec.env = {e["name"]: str(e["value"]) for e in container.get("env") or []
                if isinstance(e, dict) and "value" in e and "name" in e}
    spec.pre_stop = [str(part) for part in get(container, "lifecycle", "preStop", "exec", "command", default=[])]
    grace = get(group_spec, "template", "spec", "terminationGracePeriodSeconds")
    if grace is not None:  # the API server stores a negative grace period as 1 s (raytrain_rules.check_grace_periods)
        spec.grace_seconds = int(grace) if int(grace) >= 0 else 1
    return spec


def max_replicas(group: dict, autoscaling: bool) -> int:
    """The most pods a worker group can ever have: maxReplicas with the autoscaler, else replicas; times
    numOfHosts (multi-host groups)."""
    count = int(group.get("maxReplicas" if autoscaling else "replicas") or 0)
    return count * int(group.get("numOfHosts") or 1)


def start_replicas(group: dict) -> int:
    """The pods a worker group starts with: replicas (else minReplicas), at most maxReplicas, times numOfHosts."""
    replicas = int(group.get("replicas", group.get("minReplicas", 0)) or 0)
    if group.get("maxReplicas") is not None:
        replicas = min(replicas, int(group["maxReplicas"]))
    return replicas * int(group.get("numOfHosts") or 1)


def node_resources(cluster_spec: dict, prefix: str = "spec") -> list[dict[str, float]]:
    """The Ray nodes a RayCluster spec can ever have, as {CPU, GPU} like ray.nodes(): the head and each worker
    group at its largest (max_replicas). A bad quantity raises QuantityError naming its field."""
    autoscaling = autoscaling_enabled(cluster_spec)
    nodes = []
    for path, name, group in groups(cluster_spec, prefix):
        head = path.endswith("headGroupSpec")
        node = node_spec(group, name, name, head, path)
        # A group without maxReplicas defaults to 2^31-1 (the CRD's default); no run needs more nodes per group
        # than this to be sized, and a list that long would not fit in memory.
        count = 1 if head else min(max_replicas(group, autoscaling), MAX_NODES_SIZED)
        nodes += [{"CPU": node.num_cpus or 0.0, "GPU": node.num_gpus or 0.0} for _ in range(count)]
    return nodes


def shared_mounts(cluster_spec: dict) -> list[str]:
    """Mount paths that the Ray container of every group (head and workers) has from a persistent volume."""
    per_group = []
    for _, _, group in groups(cluster_spec):
        pod = get(group, "template", "spec", default={})
        persistent = {v.get("name") for v in pod.get("volumes") or [] if not (set(v) & POD_LOCAL_VOLUMES)}
        container = get(pod, "containers", 0, default={})
        per_group.append({m.get("mountPath") for m in container.get("volumeMounts") or [] if m.get("name") in persistent})
    common = set.intersection(*per_group) if per_group else set()
    return sorted(str(p) for p in common if p)
