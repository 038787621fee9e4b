"""Does what scripts/kind-e2e is about to apply fit on the kind node? Pods that do not fit stay Pending until a
long wait times out, so the script asks first and says what is short.

    python -m tests.e2e.kind_capacity --node node.json --pods pods.json chart.yaml manifests/rayjob.yaml

node.json: `kubectl get node NODE -o json` (its allocatable CPU and memory); pods.json: `kubectl get pods -A -o json`
(what the pods already on the node request); the files: every manifest still to be applied. Their pods are counted
as the scheduler counts them: requests (a container with limits only requests its limits), a pod's init
containers by their largest request, a RayCluster's head plus `replicas` pods per worker group, a RayJob's
submitter pod. Exit 1 with what is short, 0 with the budget.
"""

from __future__ import annotations

import argparse
import json
import sys
from decimal import Decimal
from pathlib import Path

import yaml
from kubernetes.utils import parse_quantity

GiB = Decimal(2**30)


def container_requests(container: dict) -> tuple[Decimal, Decimal]:
    resources = container.get("resources") or {}
    wanted = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
    return parse_quantity(wanted.get("cpu", 0)), parse_quantity(wanted.get("memory", 0))


def pod_requests(spec: dict) -> tuple[Decimal, Decimal]:
    """What the scheduler reserves for a pod spec: the containers' sum, or the largest init container if larger."""
    regular = [container_requests(c) for c in spec.get("containers") or []]
    init = [container_requests(c) for c in spec.get("initContainers") or []]
    cpu = max([sum((c for c, _ in regular), Decimal(0))] + [c for c, _ in init])
    memory = max([sum((m for _, m in regular), Decimal(0))] + [m for _, m in init])
    return cpu, memory


def workload_pods(obj: dict) -> list[tuple[str, dict]]:
    """(what, pod spec) for every pod an object will start."""
    kind, name, spec = obj.get("kind"), obj.get("metadata", {}).get("name"), obj.get("spec") or {}
    if kind == "Pod":
        return [(f"Pod {name}", spec)]
    if kind in ("Deployment", "StatefulSet", "ReplicaSet", "Job"):
        replicas = spec.get("replicas", 1) if kind != "Job" else spec.get("parallelism", 1)
        return [(f"{kind} {name}", spec["template"]["spec"])] * int(replicas)
    if kind == "RayCluster":
        return cluster_pods(f"RayCluster {name}", spec)
    if kind == "RayJob":
        pods = []
        if spec.get("submitterPodTemplate"):
            pods.append((f"RayJob {name} submitter", spec["submitterPodTemplate"]["spec"]))
        if spec.get("rayClusterSpec"):
            pods += cluster_pods(f"RayJob {name}'s cluster", spec["rayClusterSpec"])
        return pods
    return []


def cluster_pods(what: str, spec: dict) -> list[tuple[str, dict]]:
    pods = [(f"{what} head", spec["headGroupSpec"]["template"]["spec"])]
    for group in spec.get("workerGroupSpecs") or []:
        pods += [(f"{what} {group['groupName']}", group["template"]["spec"])] * int(group.get("replicas", 1))
    return pods


def on_node(pods: dict, node: str) -> tuple[Decimal, Decimal]:
    cpu = memory = Decimal(0)
    for pod in pods.get("items") or []:
        if pod.get("spec", {}).get("nodeName") != node or pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
            continue
        c, m = pod_requests(pod["spec"])
        cpu, memory = cpu + c, memory + m
    return cpu, memory


def gib(value: Decimal) -> str:
    return f"{value / GiB:.1f}Gi"


def check(node: dict, pods: dict, manifests: list[Path]) -> tuple[bool, str]:
    name = node["metadata"]["name"]
    allocatable = node["status"]["allocatable"]
    cpu_total, memory_total = parse_quantity(allocatable["cpu"]), parse_quantity(allocatable["memory"])
    cpu_used, memory_used = on_node(pods, name)
    lines, cpu_new, memory_new = [], Decimal(0), Decimal(0)
    for path in manifests:
        for obj in yaml.safe_load_all(path.read_text()):
            for what, spec in workload_pods(obj or {}):
                c, m = pod_requests(spec)
                cpu_new, memory_new = cpu_new + c, memory_new + m
                lines.append(f"  {what}: {c.normalize()} CPU, {gib(m)}")
    cpu_free, memory_free = cpu_total - cpu_used, memory_total - memory_used
    budget = (f"node {name}: allocatable {cpu_total.normalize()} CPU, {gib(memory_total)}; pods on it request "
              f"{cpu_used.normalize()} CPU, {gib(memory_used)}; to apply {cpu_new.normalize()} CPU, {gib(memory_new)}:\n"
              + "\n".join(lines))
    short = []
    if cpu_new > cpu_free:
        short.append(f"{(cpu_new - cpu_free).normalize()} CPU")
    if memory_new > memory_free:
        short.append(gib(memory_new - memory_free) + " of memory")
    if not short:
        return True, budget
    return False, (f"{budget}\nshort by {' and '.join(short)}: pods would stay Pending. Give Docker more CPUs/memory "
                   "(Docker Desktop: Settings > Resources; the kind node gets what the Docker VM has), or lower the "
                   "requests in helm/raytrain-cluster/values-kind.yaml")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--node", type=Path, required=True, help="kubectl get node NODE -o json")
    parser.add_argument("--pods", type=Path, required=True, help="kubectl get pods -A -o json")
    parser.add_argument("manifests", type=Path, nargs="+", help="manifests about to be applied")
    args = parser.parse_args(argv)
    fits, report = check(json.loads(args.node.read_text()), json.loads(args.pods.read_text()), args.manifests)
    print(report, file=sys.stdout if fits else sys.stderr)
    return 0 if fits else 1


if __name__ == "__main__":
    sys.exit(main())
