"""Kueue's rules for a RayJob or RayCluster it manages, and whether a queued one can ever fit its ClusterQueue.

Kueue manages an object that carries the label kueue.x-k8s.io/queue-name (or every object, when Kueue runs with
manageJobsWithoutQueueName: a manifest cannot say so, so raytrain checks the labelled ones). Its admission webhooks
refuse what the rules below refuse. Read in kubernetes-sigs/kueue at main ff69552e (2026-08-22, v0.20.0-devel):
- pkg/controller/jobs/rayjob/rayjob_webhook.go, validateCreate (lines 109-160);
- pkg/controller/jobs/raycluster/raycluster_webhook.go, validateCreate (lines 135-182);
- pkg/controller/jobs/raycluster/common.go, ValidateCreate (lines 298-329), BuildPodSets (lines 76-128);
- pkg/controller/jobframework/validation.go, ValidateJobOnCreate (lines 82-93), ValidateQueueName (lines 174-178),
  validateCreateForMaxExecTime (lines 235-247);
- pkg/controller/jobframework/defaults.go ApplyDefaultForSuspend (lines 36-46) and utils.go
  WorkloadShouldBeSuspended (lines 131-157): the mutating webhook suspends every labelled RayJob, a clusterSelector
  one too, which KubeRay v1.7.0 then fails (utils/validation.go ValidateRayJobSpec, lines 561-563).
Kueue's latest release, v0.19.2, has the same rules and counts (its MaxPodSets is 18 too; v0.18 allowed 10 pod
sets, v0.17 and earlier 8). Each check's comment names the function and lines it mirrors. Not covered: the rules
behind Kueue feature gates that are off by default or need the cluster's state (TopologyAwareScheduling's
annotations, prebuilt workloads, AdmissionGatedBy, the update rules: `raytrain validate` checks what a create would
do).

The quota check (`raytrain validate --kueue-queues FILE`): a job whose requests, counted as Kueue counts them, exceed
what its ClusterQueue could ever lend it is never admitted and waits in the queue forever without an error.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

from raytrain.errors import shown
from raytrain.spec import yamlfile
from raytrain.validator.apimachinery import is_dns1123_subdomain
from raytrain.validator.problems import Doc, Problem
from raytrain.validator.quantity import QuantityError, parse_quantity
from raytrain.validator.shape import get as dig

# pkg/controller/constants/constants.go: QueueLabel (line 23), WorkloadPriorityClassLabel (line 48)
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_CLASS_LABEL = "kueue.x-k8s.io/priority-class"
# pkg/controller/constants/constants.go MaxExecTimeSecondsLabel (line 59)
MAX_EXEC_TIME_LABEL = "kueue.x-k8s.io/max-exec-time-seconds"
# pkg/constants/constants.go ElasticJobAnnotation (line 88); pkg/workloadslicing/workloadslicing.go
# EnabledAnnotationValue (line 57)
ELASTIC_JOB_ANNOTATION = "kueue.x-k8s.io/elastic-job"
# pkg/controller/jobframework/constants.go MaxPodSets (line 21)
MAX_POD_SETS = 18
# pkg/controller/jobs/raycluster: headGroupPodSetName, the pod set of the head
HEAD_POD_SET = "head"
KUEUE_GROUP = "kueue.x-k8s.io"


def queue_name(doc: Doc) -> str:
    """jobframework.QueueName: the queue-name label (an empty one is no queue)."""
    labels = dig(doc.obj, "metadata", "labels", default={})
    value = labels.get(QUEUE_LABEL) if isinstance(labels, dict) else None
    return value if isinstance(value, str) else ""


def _elastic(doc: Doc) -> bool:
    # pkg/workloadslicing/workloadslicing.go Enabled: the annotation kueue.x-k8s.io/elastic-job: "true"
    return dig(doc.obj, "metadata", "annotations", ELASTIC_JOB_ANNOTATION) == "true"


def managed_cluster_spec(doc: Doc) -> tuple[dict, str] | None:
    """The cluster spec Kueue queues, and its path: a labelled RayCluster's spec, a labelled RayJob's rayClusterSpec
    (a clusterSelector RayJob is skipped: rayjob_controller.go Skip, lines 115-119)."""
    if not queue_name(doc):
        return None
    spec = doc.obj.get("spec") or {}
    if doc.kind == "RayCluster":
        return spec, "spec"
    if doc.kind == "RayJob" and not spec.get("clusterSelector") and isinstance(spec.get("rayClusterSpec"), dict):
        return spec["rayClusterSpec"], "spec.rayClusterSpec"
    return None


# ----------------------------------------------------------------------------------------------------------
# the webhooks' rules


def check_kueue(doc: Doc) -> list[Problem]:
    """Kueue's admission rules for a RayJob or RayCluster carrying the queue-name label (shape already valid)."""
    if doc.kind not in ("RayJob", "RayCluster") or not queue_name(doc):
        return []
    spec = doc.obj.get("spec") or {}
    if doc.kind == "RayJob":
        selector, embedded = bool(spec.get("clusterSelector")), isinstance(spec.get("rayClusterSpec"), dict)
        # rayjob_webhook.go validateCreate returns on the clusterSelector cases (lines 120-130) before
        # ValidateJobOnCreate (line 150): the queue name is not checked there
        if selector and embedded:
            # rayjob_webhook.go validateCreate, lines 120-124: clusterSelector with a rayClusterSpec
            return [doc.problem("spec.clusterSelector", "a Kueue-managed RayJob (label "
                                f"{QUEUE_LABEL}) should not use an existing cluster: Kueue refuses "
                                "clusterSelector together with rayClusterSpec.",
                                "remove clusterSelector to queue the job with a cluster of its own, or remove "
                                "rayClusterSpec and the label to run on the selected cluster")]
        if selector:
            # Kueue's validating webhook admits it (rayjob_webhook.go validateCreate, lines 126-130) and its
            # controller skips it (rayjob_controller.go Skip, lines 115-119), but its mutating webhook suspends every
            # labelled RayJob on creation (rayjob_webhook.go Default, line 87 -> jobframework/defaults.go
            # ApplyDefaultForSuspend, lines 36-46 -> utils.go WorkloadShouldBeSuspended, lines 147-150, no Skip
            # there), and KubeRay v1.7.0 refuses suspend in clusterSelector mode (utils/validation.go
            # ValidateRayJobSpec, lines 561-563; rayjob_controller.go lines 144-161): the job fails at once
            return [doc.problem(f"metadata.labels.{QUEUE_LABEL}", "on a clusterSelector RayJob: Kueue's mutating "
                                "webhook sets suspend: true on every RayJob with this label, and then leaves a "
                                "clusterSelector RayJob alone (it never unsuspends it); KubeRay refuses suspend in "
                                "clusterSelector mode, so the RayJob ends ValidationFailed (\"the ClusterSelector "
                                "mode doesn't support the suspend operation\") without running.",
                                "remove the label: the job then runs on the selected cluster, which is what Kueue "
                                "queues (the chart's kueue.queueName labels its RayCluster); or embed a "
                                "rayClusterSpec instead of clusterSelector to queue the job with its own cluster")]
    out = _check_queue_name(doc) + _check_max_exec_time(doc)
    if doc.kind == "RayJob":
        # no clusterSelector and no rayClusterSpec (lines 132-136): KubeRay's ValidateRayJobSpec refuses it first
        if not embedded:
            return out
        if not spec.get("shutdownAfterJobFinishes"):
            # rayjob_webhook.go validateCreate, lines 139-142
            out.append(doc.problem("spec.shutdownAfterJobFinishes", "is not true: Kueue refuses a managed RayJob "
                                   "that keeps its cluster after it finishes (the cluster would hold the queue's "
                                   "quota).", "set shutdownAfterJobFinishes: true"))
        elif not spec.get("suspend"):  # (KubeRay refuses suspend without shutdownAfterJobFinishes: fix that first)
            # jobframework/defaults.go ApplyDefaultForSuspend (lines 36-46), called by rayjob_webhook.go Default
            # (line 87): Kueue's mutating webhook suspends it on creation; writing it keeps the manifest true
            out.append(doc.problem("spec.suspend", "is not true: Kueue's mutating webhook suspends the job on "
                                   "creation until its workload is admitted, so the manifest does not say what runs.",
                                   "set suspend: true (Kueue unsuspends the job when the queue admits it)",
                                   severity="note"))
    managed = managed_cluster_spec(doc)
    if managed:
        out += _check_cluster_spec(doc, *managed)
    return out


def _check_queue_name(doc: Doc) -> list[Problem]:
    # jobframework/validation.go ValidateJobOnCreate -> ValidateQueueName (lines 174-178) -> ValidateLabelAsCRDName
    # (lines 146-154): the label names a LocalQueue, so it must be a DNS-1123 subdomain
    name = queue_name(doc)
    if is_dns1123_subdomain(name):
        return []
    return [doc.problem(f"metadata.labels.{QUEUE_LABEL}", f"{shown(name)} is not a LocalQueue name (a DNS-1123 "
                        "subdomain: lower-case letters, digits, '-' and '.'); Kueue refuses the object.",
                        "use the name of a LocalQueue in the job's namespace, e.g. team-a")]


def _check_max_exec_time(doc: Doc) -> list[Problem]:
    # jobframework/validation.go ValidateJobOnCreate -> validateCreateForMaxExecTime (lines 235-247): Go's
    # strconv.Atoi of the label (an optional sign and decimal digits, within int64), greater than 0
    labels = dig(doc.obj, "metadata", "labels", default={})
    if not isinstance(labels, dict) or MAX_EXEC_TIME_LABEL not in labels:
        return []
    value = str(labels[MAX_EXEC_TIME_LABEL])
    if re.fullmatch(r"[+-]?[0-9]+", value) and 0 < int(value) < 2**63:
        return []
    return [doc.problem(f"metadata.labels.{MAX_EXEC_TIME_LABEL}", f"{shown(value)} is not a whole number of "
                        "seconds above 0; Kueue refuses the object.",
                        "write the most seconds the job may run once admitted, e.g. \"7200\"")]


def _check_cluster_spec(doc: Doc, spec: dict, path: str) -> list[Problem]:
    out: list[Problem] = []
    if spec.get("enableInTreeAutoscaling") and not _elastic(doc):
        # RayCluster: raycluster_webhook.go validateCreate, lines 143-157; RayJob: common.go ValidateCreate,
        # lines 301-311 (both allow it only on an elastic job: ElasticJobsViaWorkloadSlices)
        out.append(doc.problem(f"{path}.enableInTreeAutoscaling", "is true: Kueue refuses autoscaling on a "
                               "managed RayCluster (the queue reserves a fixed size, which the cluster should use), "
                               f"unless it is an elastic job (annotation {ELASTIC_JOB_ANNOTATION}: \"true\" with "
                               "Kueue's ElasticJobsViaWorkloadSlices feature gate).",
                               "set enableInTreeAutoscaling: false and size the groups with replicas (the chart: "
                               "autoscaling.enabled=false)"))
    workers = spec.get("workerGroupSpecs") or []
    submitter = doc.kind == "RayJob" and ((doc.obj.get("spec") or {}).get("submissionMode") or "K8sJobMode") == \
        "K8sJobMode"
    if len(workers) + 1 > MAX_POD_SETS:
        # raycluster_webhook.go validateCreate, lines 159-162; common.go ValidateCreate, lines 313-316
        # (ExpectedPodSetsCount: the head and one pod set per worker group)
        out.append(doc.problem(f"{path}.workerGroupSpecs", f"has {len(workers)} worker groups: with the head that "
                               f"is {len(workers) + 1} pod sets, and a Kueue workload holds at most {MAX_POD_SETS}.",
                               f"use at most {MAX_POD_SETS - 1 - submitter} worker groups"))
    elif submitter and len(workers) + 2 > MAX_POD_SETS:
        # The webhook counts the cluster's pod sets only, but a K8sJobMode RayJob's workload also holds the
        # submitter's (rayjob_controller.go PodSets and expectedPodSetsCount, lines 132-163), and the Workload API
        # takes at most MaxPodSets (apis/kueue/v1beta2/workload_types.go, +kubebuilder:validation:MaxItems=18):
        # the API server refuses the Workload, and the job stays suspended
        out.append(doc.problem(f"{path}.workerGroupSpecs", f"has {len(workers)} worker groups: with the head and "
                               f"the submitter (submissionMode K8sJobMode) that is {len(workers) + 2} pod sets, and a "
                               f"Kueue workload holds at most {MAX_POD_SETS}. Kueue's webhook accepts the RayJob, but "
                               "its Workload cannot be created, so the job stays suspended.",
                               f"use at most {MAX_POD_SETS - 2} worker groups (or submissionMode: SidecarMode, "
                               "whose submitter runs in the head pod)"))
    for i, group in enumerate(workers):
        if isinstance(group, dict) and group.get("groupName") == HEAD_POD_SET:
            # raycluster_webhook.go validateCreate, lines 164-169; common.go ValidateCreate, lines 318-326
            out.append(doc.problem(f"{path}.workerGroupSpecs[{i}].groupName", "'head' is reserved for the head "
                                   "group's pod set in a Kueue workload.", "rename the worker group"))
    return out


# ----------------------------------------------------------------------------------------------------------
# what the job asks of its queue (common.go BuildPodSets, rayjob_controller.go PodSets)

# rayjob_controller.go defaultSubmitterResources (lines 251-262), KubeRay's default submitter container
SUBMITTER_REQUESTS = {"cpu": 0.5, "memory": 200 * 2**20}
# common.go redisCleanupResourceRequests (lines 140-147)
REDIS_CLEANUP_REQUESTS = {"cpu": 0.2, "memory": 256 * 2**20}
# common.go defaultAutoscalerResources (lines 159-170)
AUTOSCALER_REQUESTS = {"cpu": 0.5, "memory": 512 * 2**20}


@dataclasses.dataclass
class PodSet:
    name: str
    count: int
    requests: dict[str, float]  # one pod's


def _container_requests(container: Any, field: str) -> dict[str, float]:
    # workload/resources.go UseLimitsAsMissingRequestsInPod (lines 124-139): a limit stands in for a missing request
    resources = (container.get("resources") or {}) if isinstance(container, dict) else {}
    merged = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
    return {str(k): parse_quantity(v, f"{field}.resources.{k}") for k, v in merged.items()}


def pod_requests(pod_spec: Any, field: str, extra: list[dict[str, float]] = (),
                 first_floor: dict[str, float] | None = None) -> dict[str, float]:
    """One pod's requests as Kubernetes' resourcehelpers.PodRequests sums them (workload.go
    totalRequestsFromPodSets, lines 684-720): the containers (and sidecar init containers) added, the largest plain
    init container if it is larger. `extra`: containers KubeRay adds that the template does not hold;
    `first_floor`: the least the first (Ray) container is counted at."""
    spec = pod_spec if isinstance(pod_spec, dict) else {}
    containers = [_container_requests(c, f"{field}.containers[{i}]")
                  for i, c in enumerate(spec.get("containers") or [])]
    if containers and first_floor:
        containers[0] = {k: max(containers[0].get(k, 0.0), first_floor.get(k, 0.0))
                         for k in set(containers[0]) | set(first_floor)}
    total: dict[str, float] = {}
    for amounts in containers + list(extra):
        for key, amount in amounts.items():
            total[key] = total.get(key, 0.0) + amount
    # k8s.io/component-helpers resource.PodRequests: the containers plus every sidecar (an init container with
    # restartPolicy Always), or a plain init container plus the sidecars started before it, whichever is larger
    sidecars: dict[str, float] = {}
    init_peak: dict[str, float] = {}
    for i, init in enumerate(spec.get("initContainers") or []):
        amounts = _container_requests(init, f"{field}.initContainers[{i}]")
        if isinstance(init, dict) and init.get("restartPolicy") == "Always":
            for key, amount in amounts.items():
                sidecars[key] = sidecars.get(key, 0.0) + amount
                init_peak[key] = max(init_peak.get(key, 0.0), sidecars[key])
        else:
            for key, amount in amounts.items():
                init_peak[key] = max(init_peak.get(key, 0.0), amount + sidecars.get(key, 0.0))
    for key, amount in sidecars.items():
        total[key] = total.get(key, 0.0) + amount
    for key, amount in init_peak.items():
        total[key] = max(total.get(key, 0.0), amount)
    return total


def pod_sets(doc: Doc) -> list[PodSet]:
    """The Kueue workload's pod sets of a managed object: the head (1 pod), each worker group (replicas, 1 when
    unset, times numOfHosts: common.go effectiveWorkerCount, lines 64-73; not minReplicas), and for a RayJob in
    K8sJobMode the submitter (rayjob_controller.go addSubmitterPodSet, lines 288-310) or in SidecarMode the
    submitter container on the head (addSidecarSubmitterToHeadPodSet, lines 318-331). QuantityError when a
    request is not a quantity."""
    managed = managed_cluster_spec(doc)
    if not managed:
        return []
    spec, path = managed
    job = (doc.obj.get("spec") or {}) if doc.kind == "RayJob" else {}
    mode = job.get("submissionMode") or "K8sJobMode"
    head_extra = []
    if spec.get("enableInTreeAutoscaling"):  # common.go BuildPodSets, lines 98-106
        options = dig(spec, "autoscalerOptions", "resources")
        head_extra.append(_container_requests({"resources": options}, f"{path}.autoscalerOptions")
                          if options else dict(AUTOSCALER_REQUESTS))
    if doc.kind == "RayJob" and mode == "SidecarMode":
        head_extra.append(dict(SUBMITTER_REQUESTS))
    # common.go BuildPodSets, lines 93-97 (accountForRedisCleanupInHeadPodSet): with GCS fault tolerance
    # (KubeRay's utils.IsGCSFaultToleranceEnabled, on the job's own annotations) the head's Ray container is counted
    # at least at the Redis cleanup Job's requests
    ft = str(dig(doc.obj, "metadata", "annotations", "ray.io/ft-enabled", default="")).lower() == "true"
    floor = REDIS_CLEANUP_REQUESTS if ft or spec.get("gcsFaultToleranceOptions") is not None else None
    out = [PodSet(HEAD_POD_SET, 1, pod_requests(dig(spec, "headGroupSpec", "template", "spec"),
                                                f"{path}.headGroupSpec.template.spec", head_extra, floor))]
    for i, group in enumerate(spec.get("workerGroupSpecs") or []):
        replicas = group.get("replicas")
        count = 1 if replicas is None else int(replicas)
        hosts = int(group.get("numOfHosts") or 1)
        out.append(PodSet(str(group.get("groupName", i)), count * (hosts if hosts > 1 else 1),
                          pod_requests(dig(group, "template", "spec"),
                                       f"{path}.workerGroupSpecs[{i}].template.spec")))
    if doc.kind == "RayJob" and mode == "K8sJobMode":
        template = job.get("submitterPodTemplate")
        out.append(PodSet("submitter", 1, pod_requests(dig(template, "spec"), "spec.submitterPodTemplate.spec")
                          if template else dict(SUBMITTER_REQUESTS)))
    return out


# ----------------------------------------------------------------------------------------------------------
# the queues file: ClusterQueues and LocalQueues (kueue.x-k8s.io v1beta1 or v1beta2)


class QueuesFileError(ValueError):
    """The queues file cannot be read; the message names the file and the field."""


@dataclasses.dataclass
class FlavorQuota:
    flavor: str
    nominal: float
    # nominal + borrowingLimit when the ClusterQueue is in a cohort; None: it may borrow without a limit
    most: float | None


@dataclasses.dataclass
class ClusterQueue:
    name: str
    cohort: str
    quotas: dict[str, list[FlavorQuota]]  # resource -> its quota in each flavor


@dataclasses.dataclass
class Queues:
    source: str
    cluster_queues: dict[str, ClusterQueue]
    local_queues: dict[tuple[str, str], str]  # (namespace, name) -> ClusterQueue name


def _fail(source: str, where: str, message: str) -> QueuesFileError:
    return QueuesFileError(f"{source}: {where}: {message}" if where else f"{source}: {message}")


def load_queues(path: Path) -> Queues:
    """ClusterQueues and LocalQueues from one YAML file (other kinds, e.g. ResourceFlavor, are skipped);
    QueuesFileError naming the file, the document and the field when it is not one."""

    source = str(path)
    try:
        documents = yamlfile.read_all(path)
    except yamlfile.YAMLFileError as exc:
        raise _fail(source, "", f"{exc.message} Fix: {exc.fix}") from None
    except (OSError, ValueError) as exc:
        raise _fail(source, "", f"cannot be read ({getattr(exc, 'strerror', None) or exc}).") from None
    cluster_queues: dict[str, ClusterQueue] = {}
    local_queues: dict[tuple[str, str], str] = {}
    for index, obj in enumerate(documents):
        if obj is None:
            continue
        where = f"document {index + 1}"
        if not isinstance(obj, dict):
            raise _fail(source, where, f"is {type(obj).__name__}, not a Kubernetes object.")
        api_version, kind = obj.get("apiVersion"), obj.get("kind")
        if not isinstance(api_version, str) or not api_version.startswith(f"{KUEUE_GROUP}/"):
            continue
        meta = obj.get("metadata")
        name = meta.get("name") if isinstance(meta, dict) else None
        if kind in ("ClusterQueue", "LocalQueue") and (not isinstance(name, str) or not name):
            raise _fail(source, f"{where} ({kind}): metadata.name", "is missing. Fix: give the queue its name")
        spec = obj.get("spec")
        if kind in ("ClusterQueue", "LocalQueue") and not isinstance(spec, dict):
            raise _fail(source, f"{kind}/{name}: spec", f"is {shown(spec)}, not a mapping. Fix: write the "
                        "queue's spec as Kueue's documentation shows")
        if kind == "LocalQueue":
            target = spec.get("clusterQueue")  # type: ignore[union-attr]
            if not isinstance(target, str) or not target:
                raise _fail(source, f"LocalQueue/{name}: spec.clusterQueue", f"is {shown(target)}, not a "
                            "ClusterQueue name. Fix: name the ClusterQueue it submits to")
            namespace = meta.get("namespace") if isinstance(meta, dict) else None
            local_queues[(str(namespace or ""), name)] = target  # type: ignore[index]
        elif kind == "ClusterQueue":
            cluster_queues[name] = _cluster_queue(source, name, spec)  # type: ignore[arg-type]
    if not cluster_queues:
        raise _fail(source, "", "holds no ClusterQueue (apiVersion kueue.x-k8s.io/v1beta2 or v1beta1). Fix: give "
                    "the file the ClusterQueue your jobs' LocalQueue submits to, and that LocalQueue")
    return Queues(source, cluster_queues, local_queues)


def _cluster_queue(source: str, name: str, spec: dict) -> ClusterQueue:
    cohort = spec.get("cohortName", spec.get("cohort")) or ""  # v1beta2 cohortName, v1beta1 cohort
    if not isinstance(cohort, str):
        raise _fail(source, f"ClusterQueue/{name}: spec.cohortName", f"is {shown(cohort)}, not a name.")
    groups = spec.get("resourceGroups") or []
    if not isinstance(groups, list):
        raise _fail(source, f"ClusterQueue/{name}: spec.resourceGroups", f"is {shown(groups)}, not a list.")
    quotas: dict[str, list[FlavorQuota]] = {}
    for g, group in enumerate(groups):
        gpath = f"ClusterQueue/{name}: spec.resourceGroups[{g}]"
        flavors = group.get("flavors") if isinstance(group, dict) else None
        if not isinstance(flavors, list):
            raise _fail(source, f"{gpath}.flavors", f"is {shown(flavors)}, not a list of flavors.")
        for f, flavor in enumerate(flavors):
            fpath = f"{gpath}.flavors[{f}]"
            resources = flavor.get("resources") if isinstance(flavor, dict) else None
            if not isinstance(resources, list):
                raise _fail(source, f"{fpath}.resources", f"is {shown(resources)}, not a list of resources.")
            for r, quota in enumerate(resources):
                rpath = f"{fpath}.resources[{r}]"
                if not isinstance(quota, dict) or not isinstance(quota.get("name"), str):
                    raise _fail(source, f"{rpath}.name", "is missing. Fix: name the resource, e.g. cpu")
                try:
                    nominal = parse_quantity(quota.get("nominalQuota", 0), f"{rpath}.nominalQuota")
                    limit = quota.get("borrowingLimit")
                    borrow = None if limit is None else parse_quantity(limit, f"{rpath}.borrowingLimit")
                except QuantityError as exc:
                    raise _fail(source, "", str(exc)) from None
                most = nominal if not cohort else (None if borrow is None else nominal + borrow)
                quotas.setdefault(quota["name"], []).append(FlavorQuota(str(flavor.get("name", f)), nominal, most))
    return ClusterQueue(name, cohort, quotas)


def _amount(resource: str, value: float) -> str:
    if resource == "memory" or resource.endswith("storage"):
        return f"{value / 2**30:g}Gi"
    return f"{value:g}"


def check_fits(doc: Doc, queues: Queues) -> list[Problem]:
    """A managed RayJob or RayCluster against the ClusterQueue behind its LocalQueue: a resource the ClusterQueue
    does not cover, a pod set larger than any one flavor's quota (Kueue gives each pod set one flavor per resource
    group), or a job larger than all flavors together: Kueue can never admit it (the workload stays pending with
    'couldn't assign flavors'). Counted: nominalQuota, plus borrowingLimit when the ClusterQueue is in a cohort (a
    cohort without borrowingLimit may lend it anything: not checked); lendingLimit and what other workloads use are
    not (they change, the job may fit later)."""
    local = queue_name(doc)
    if not local or not managed_cluster_spec(doc):
        return []
    field = f"metadata.labels.{QUEUE_LABEL}"
    namespace = str(dig(doc.obj, "metadata", "namespace", default="") or "")
    target = queues.local_queues.get((namespace, local))
    if target is None:
        # a job or a LocalQueue without a namespace is applied with `kubectl -n`: either may be the other's
        candidates = {cq for (ns, name), cq in queues.local_queues.items() if name == local and
                      (not namespace or not ns)}
        if len(candidates) == 1:
            target = candidates.pop()
    if target is None:
        where = f" in namespace {namespace}" if namespace else ""
        return [doc.problem(field, f"names LocalQueue {local!r}, which {queues.source} does not hold{where}.",
                            f"add LocalQueue {local} (spec.clusterQueue: <its ClusterQueue>) to {queues.source}, or "
                            "label the job with one of its LocalQueues", severity="note")]
    cluster_queue = queues.cluster_queues.get(target)
    if cluster_queue is None:
        return [doc.problem(field, f"LocalQueue {local!r} submits to ClusterQueue {target!r}, which "
                            f"{queues.source} does not hold.", f"add ClusterQueue {target} to {queues.source}",
                            severity="note")]
    try:
        sets = pod_sets(doc)
    except QuantityError:  # the pod rules name the field already; nothing to add
        return []
    totals: dict[str, float] = {}
    for pod_set in sets:
        for key, amount in pod_set.requests.items():
            totals[key] = totals.get(key, 0.0) + amount * pod_set.count
    out: list[Problem] = []
    what = f"ClusterQueue {target} (LocalQueue {local})"
    for resource, total in sorted(totals.items()):
        if total <= 0:
            continue
        quotas = cluster_queue.quotas.get(resource)
        if not quotas:
            out.append(doc.problem(field, f"the job requests {_amount(resource, total)} {resource}, which {what} "
                                   "has no quota for: Kueue can never admit it (unless Kueue's configuration leaves "
                                   "the resource out: resources.excludeResourcePrefixes, or quotaCheckStrategy "
                                   "IgnoreUndeclared).",
                                   f"add {resource} to a resourceGroup of ClusterQueue {target} (coveredResources "
                                   "and each flavor's resources), or ask your admin for a queue that has it"))
            continue
        if any(q.most is None for q in quotas):
            continue  # may borrow without a limit from its cohort
        most = sum(q.most or 0.0 for q in quotas)
        if total > most:
            counted = "nominalQuota" + (" + borrowingLimit" if cluster_queue.cohort else "")
            out.append(doc.problem(field, f"the job requests {_amount(resource, total)} {resource} in all "
                                   f"({_breakdown(sets, resource)}), more than {what} can ever give it: "
                                   f"{_amount(resource, most)} ({counted} over its flavors). Kueue never admits "
                                   "it; it stays pending.", f"make the job smaller (fewer replicas or smaller pods) "
                                   f"to fit {_amount(resource, most)} {resource}, or ask your admin to raise "
                                   f"the ClusterQueue's quota"))
            continue
        largest = max(q.most or 0.0 for q in quotas)
        for pod_set in sets:
            need = pod_set.requests.get(resource, 0.0) * pod_set.count
            if need > largest:
                out.append(doc.problem(field, f"pod set {pod_set.name} requests {_amount(resource, need)} "
                                       f"{resource} ({pod_set.count} x {_amount(resource, pod_set.requests[resource])}"
                                       f"), more than any one flavor of {what} holds ({_amount(resource, largest)}); "
                                       "Kueue gives a pod set one flavor, so it never admits the job.",
                                       "make that group smaller, or ask your admin for a flavor that holds it"))
    return out


def _breakdown(sets: list[PodSet], resource: str) -> str:
    parts = [f"{s.name} {s.count} x {_amount(resource, s.requests[resource])}" for s in sets
             if s.requests.get(resource)]
    return ", ".join(parts)
