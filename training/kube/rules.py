"""KubeRay v1.7.0's admission rules beyond the schemas (ray-operator/controllers/ray/utils/validation.go and the
CRDs' CEL rules), and the image/rayVersion check that mirrors what KubeRay acts on.

(Being moved to kuberay_rules.py; raytrain's own cross-checks are in raytrain_rules.py.)
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from raytrain.kube.problems import Doc, Problem

# KubeRay limits: 63 minus "-serve-svc" for clusters; minus 6 more for the suffix a RayJob's cluster gets.
MAX_RAYCLUSTER_NAME = 53
MAX_RAYJOB_NAME = 47
DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
MIN_AUTH_RAY_VERSION = (2, 52, 0)
SUBMISSION_MODES = ("K8sJobMode", "HTTPMode", "InteractiveMode", "SidecarMode")


def _get(obj: Any, *keys: Any, default: Any = None) -> Any:
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


def _version(text: Any) -> tuple[int, ...] | None:
    match = re.match(r"^v?(\d+)\.(\d+)(?:\.(\d+))?", str(text or ""))
    return tuple(int(g or 0) for g in match.groups()) if match else None


# ----------------------------------------------------------------------------------------------------------
# KubeRay admission rules


def check_ray_object(doc: Doc) -> list[Problem]:
    out: list[Problem] = []
    spec = doc.obj.get("spec") or {}
    limit = MAX_RAYCLUSTER_NAME if doc.kind == "RayCluster" else MAX_RAYJOB_NAME
    if len(doc.name) > limit:
        why = "" if doc.kind == "RayCluster" else " (KubeRay appends 6 characters for the RayJob's cluster)"
        out.append(doc.problem("metadata.name", f"'{doc.name}' has {len(doc.name)} characters; KubeRay allows at most "
                               f"{limit} for a {doc.kind}{why}.", f"shorten it to {limit} characters or fewer"))
    if not DNS1035.match(doc.name):
        out.append(doc.problem("metadata.name", f"'{doc.name}' is not a DNS-1035 label.",
                               "use lower-case letters, digits and '-', starting with a letter"))
    if doc.kind == "RayCluster":
        out += check_cluster_spec(doc, spec, "spec", _get(doc.obj, "metadata", "annotations", default={}))
    elif doc.kind == "RayJob":
        out += check_job_spec(doc, spec)
        if isinstance(spec.get("rayClusterSpec"), dict):
            out += check_cluster_spec(doc, spec["rayClusterSpec"], "spec.rayClusterSpec",
                                      _get(doc.obj, "metadata", "annotations", default={}))
    return out


def _groups(spec: dict, prefix: str) -> list[tuple[str, str, dict]]:
    """(field path, group name, group spec) for the head and every worker group."""
    groups = [(f"{prefix}.headGroupSpec", "Head", spec.get("headGroupSpec") or {})]
    for i, group in enumerate(spec.get("workerGroupSpecs") or []):
        groups.append((f"{prefix}.workerGroupSpecs[{i}]", str(group.get("groupName", i)), group))
    return groups


def _env(container: dict) -> dict[str, Any]:
    return {e.get("name"): e.get("value") for e in container.get("env") or [] if isinstance(e, dict)}


def autoscaling_enabled(spec: dict) -> bool:
    return bool(spec.get("enableInTreeAutoscaling"))


def check_cluster_spec(doc: Doc, spec: dict, prefix: str, annotations: dict) -> list[Problem]:
    out: list[Problem] = []
    groups = _groups(spec, prefix)
    for path, name, group in groups:
        containers = _get(group, "template", "spec", "containers", default=[])
        if not containers:
            out.append(doc.problem(f"{path}.template.spec.containers", f"the {name} group has no container.",
                                   "add the Ray container as the first container"))
        params = group.get("rayStartParams") or {}
        if group.get("resources") and any(params.get(k) for k in ("num-cpus", "num-gpus", "memory", "resources")):
            out.append(doc.problem(f"{path}.resources", f"group {name} sets resources both here and in rayStartParams.",
                                   "use only one of them"))
        if "labels" in params:
            out.append(doc.problem(f"{path}.rayStartParams.labels", "is not supported by KubeRay.",
                                   f"move the labels to {path}.labels"))
    head_container = _get(spec, "headGroupSpec", "template", "spec", "containers", 0, default={})
    head_env = _env(head_container)
    ft_options = spec.get("gcsFaultToleranceOptions")
    if (annotations or {}).get("ray.io/ft-enabled") and ft_options is not None:
        out.append(doc.problem(f"{prefix}.gcsFaultToleranceOptions", "is set together with the ray.io/ft-enabled "
                               "annotation.", "remove the annotation and keep gcsFaultToleranceOptions"))
    ft_enabled = ft_options is not None or str((annotations or {}).get("ray.io/ft-enabled", "")).lower() == "true"
    if not ft_enabled and "RAY_REDIS_ADDRESS" in head_env:
        out.append(doc.problem(f"{prefix}.headGroupSpec.template.spec.containers[0].env", "RAY_REDIS_ADDRESS enables "
                               "GCS fault tolerance implicitly.", "set gcsFaultToleranceOptions instead"))
    head_params = _get(spec, "headGroupSpec", "rayStartParams", default={})
    if ft_options is not None:
        if head_params.get("redis-password"):
            out.append(doc.problem(f"{prefix}.headGroupSpec.rayStartParams.redis-password", "cannot be set with "
                                   "gcsFaultToleranceOptions.", "use gcsFaultToleranceOptions.redisPassword"))
        for var in ("REDIS_PASSWORD", "RAY_REDIS_ADDRESS"):
            if var in head_env:
                out.append(doc.problem(f"{prefix}.headGroupSpec.template.spec.containers[0].env", f"{var} cannot be set "
                                       "with gcsFaultToleranceOptions.", "use the gcsFaultToleranceOptions fields"))
    if head_params.get("redis-username") or "REDIS_USERNAME" in head_env:
        out.append(doc.problem(f"{prefix}.headGroupSpec", "sets a redis username.",
                               "use gcsFaultToleranceOptions.redisUsername"))
    v2_env = str(head_env.get("RAY_enable_autoscaler_v2", "")).lower()
    if not autoscaling_enabled(spec):
        if v2_env in ("1", "true"):
            out.append(doc.problem(f"{prefix}.enableInTreeAutoscaling", "is false but the head sets "
                                   "RAY_enable_autoscaler_v2.", "set enableInTreeAutoscaling: true or drop the variable"))
    else:
        for path, name, group in groups[1:]:
            if group.get("suspend"):
                out.append(doc.problem(f"{path}.suspend", f"worker group {name} cannot be suspended with the "
                                       "autoscaler on.", "remove suspend or set enableInTreeAutoscaling: false"))
        if _get(spec, "autoscalerOptions", "version") and "RAY_enable_autoscaler_v2" in head_env:
            out.append(doc.problem(f"{prefix}.autoscalerOptions.version", "is set together with the head's "
                                   "RAY_enable_autoscaler_v2.", "keep only autoscalerOptions.version"))
    ray_version = spec.get("rayVersion")
    if _get(spec, "authOptions", "mode") == "token":
        parsed = _version(ray_version)
        if parsed is None or parsed < MIN_AUTH_RAY_VERSION:
            got = f"'{ray_version}'" if ray_version else "not set"
            out.append(doc.problem(f"{prefix}.rayVersion", f"is {got}, but authOptions.mode token needs Ray 2.52.0 or "
                                   "later.", "set rayVersion to the image's Ray version (>= 2.52.0)"))
    # raytrain: the image must carry the Ray that rayVersion announces (KubeRay acts on rayVersion).
    for path, _, group in groups:
        for i, container in enumerate(_get(group, "template", "spec", "containers", default=[])):
            out += check_image_version(doc, f"{path}.template.spec.containers[{i}].image", container.get("image"),
                                       ray_version)
    return out


def image_ray_version(image: Any) -> str | None:
    """The Ray version an image tag names: raytrain's '<version>-ray2.55.1[-gpu]' or rayproject/ray:2.55.1[-...]."""
    image = str(image or "")
    name, _, tag = image.rpartition(":") if ":" in image.rsplit("/", 1)[-1] else (image, "", "")
    match = re.search(r"(?:^|-)ray(\d+\.\d+\.\d+)", tag)
    if match:
        return match.group(1)
    if re.search(r"(^|/)ray(-ml|-llm)?$", name):
        match = re.match(r"^(\d+\.\d+\.\d+)", tag)
        return match.group(1) if match else None
    return None


def check_image_version(doc: Doc, field: str, image: Any, ray_version: Any) -> list[Problem]:
    in_image = image_ray_version(image)
    if in_image and ray_version and in_image != str(ray_version):
        return [doc.problem(field, f"image {image} runs Ray {in_image} but rayVersion is {ray_version}.",
                            f"use the image built for Ray {ray_version}, or set rayVersion: \"{in_image}\"")]
    return []


def check_job_spec(doc: Doc, spec: dict) -> list[Problem]:
    out: list[Problem] = []
    shutdown = bool(spec.get("shutdownAfterJobFinishes"))
    selector = spec.get("clusterSelector") or {}
    mode = spec.get("submissionMode", "K8sJobMode")
    backoff = spec.get("backoffLimit")
    if mode not in SUBMISSION_MODES:
        out.append(doc.problem("spec.submissionMode", f"is {mode!r}, not one of {', '.join(SUBMISSION_MODES)}.",
                               "use K8sJobMode (the default)"))
    if spec.get("suspend") and not shutdown:
        out.append(doc.problem("spec.suspend", "a RayJob with shutdownAfterJobFinishes false cannot be suspended.",
                               "set shutdownAfterJobFinishes: true or remove suspend"))
    ttl = spec.get("ttlSecondsAfterFinished") or 0
    if ttl < 0:
        out.append(doc.problem("spec.ttlSecondsAfterFinished", "must not be negative.", "use 0 or more"))
    if not shutdown and ttl > 0:
        out.append(doc.problem("spec.ttlSecondsAfterFinished", "has no effect without shutdownAfterJobFinishes "
                               "(KubeRay rejects it).", "set shutdownAfterJobFinishes: true or remove the TTL"))
    out += _check_deletion_strategy(doc, spec, shutdown, bool(selector))
    if selector:
        if spec.get("suspend"):
            out.append(doc.problem("spec.suspend", "clusterSelector mode does not support suspend.",
                                   "remove suspend, or embed a rayClusterSpec"))
        if not selector.get("ray.io/cluster"):
            out.append(doc.problem("spec.clusterSelector", "has no 'ray.io/cluster' key naming the RayCluster.",
                                   "set clusterSelector: {ray.io/cluster: <RayCluster name>}"))
        if mode == "SidecarMode":
            out.append(doc.problem("spec.submissionMode", "SidecarMode does not support clusterSelector.",
                                   "use K8sJobMode or HTTPMode"))
        if backoff and backoff > 0:
            out.append(doc.problem("spec.backoffLimit", f"is {backoff}: a retry deletes and recreates the cluster, "
                                   "which clusterSelector mode must not do (KubeRay rejects it).",
                                   "remove backoffLimit, or use a RayJob with an embedded rayClusterSpec "
                                   "(manifests/rayjob-standalone.yaml) for retries"))
    elif not spec.get("rayClusterSpec"):
        out.append(doc.problem("spec", "has neither rayClusterSpec nor clusterSelector.",
                               "embed a rayClusterSpec or select an existing cluster with clusterSelector"))
    if mode == "InteractiveMode" and backoff and backoff > 0:
        out.append(doc.problem("spec.backoffLimit", "is incompatible with InteractiveMode.", "remove backoffLimit"))
    if mode == "SidecarMode":
        for key in ("submitterPodTemplate", "submitterConfig"):
            if spec.get(key) is not None:
                out.append(doc.problem(f"spec.{key}", "is not supported in SidecarMode.", f"remove {key} or use K8sJobMode"))
        policy = _get(spec, "rayClusterSpec", "headGroupSpec", "template", "spec", "restartPolicy")
        if policy not in (None, "", "Never"):
            out.append(doc.problem("spec.rayClusterSpec.headGroupSpec.template.spec.restartPolicy",
                                   "must be Never or unset in SidecarMode.", "set restartPolicy: Never"))
    runtime_env = spec.get("runtimeEnvYAML")
    if runtime_env:
        try:
            parsed = yaml.safe_load(runtime_env)
            if not isinstance(parsed, dict):
                raise yaml.YAMLError("not a mapping")
        except yaml.YAMLError as exc:
            out.append(doc.problem("spec.runtimeEnvYAML", f"is not a YAML mapping ({str(exc).splitlines()[0]}).",
                                   "write it as a block string of key: value lines, e.g. 'working_dir: /etc/raytrain-job'"))
    deadline = spec.get("activeDeadlineSeconds")
    if deadline is not None and deadline <= 0:
        out.append(doc.problem("spec.activeDeadlineSeconds", "must be a positive integer.", "use seconds > 0"))
    if backoff is not None and backoff < 0:
        out.append(doc.problem("spec.backoffLimit", "must not be negative.", "use 0 or more"))
    submitter = spec.get("submitterPodTemplate")
    if isinstance(submitter, dict) and mode == "K8sJobMode":
        policy = _get(submitter, "spec", "restartPolicy")
        if policy not in (None, "Never", "OnFailure"):
            out.append(doc.problem("spec.submitterPodTemplate.spec.restartPolicy", f"is {policy}, but the submitter "
                                   "runs as a Kubernetes Job.", "use Never (KubeRay retries the submitter itself)"))
        for i, container in enumerate(_get(submitter, "spec", "containers", default=[])):
            if not container.get("image"):
                out.append(doc.problem(f"spec.submitterPodTemplate.spec.containers[{i}].image", "is missing; KubeRay "
                                       "uses a submitterPodTemplate as given.", "use the cluster's image"))
    return out


def _check_deletion_strategy(doc: Doc, spec: dict, shutdown: bool, selector: bool) -> list[Problem]:
    strategy = spec.get("deletionStrategy")
    if strategy is None:
        return []
    out: list[Problem] = []
    field = "spec.deletionStrategy"
    legacy = strategy.get("onSuccess") is not None or strategy.get("onFailure") is not None
    rules = strategy.get("deletionRules") or []
    if rules and shutdown:
        out.append(doc.problem(f"{field}.deletionRules", "cannot be combined with shutdownAfterJobFinishes: true.",
                               "set shutdownAfterJobFinishes: false (the rules decide what is deleted, and when)"))
    if rules and legacy:
        out.append(doc.problem(field, "mixes onSuccess/onFailure with deletionRules.", "keep only deletionRules"))
    elif legacy:
        for key in ("onSuccess", "onFailure"):
            policy = _get(strategy, key, "policy")
            if policy is None:
                out.append(doc.problem(f"{field}.{key}.policy", "is required when the legacy policies are used.",
                                       "set both onSuccess.policy and onFailure.policy, or use deletionRules"))
            elif selector and policy in ("DeleteCluster", "DeleteWorkers"):
                out.append(doc.problem(f"{field}.{key}.policy", f"{policy} is not allowed with clusterSelector (the "
                                       "cluster is not the RayJob's).", "use DeleteSelf or DeleteNone"))
            elif shutdown and policy == "DeleteNone":
                out.append(doc.problem(f"{field}.{key}.policy", "DeleteNone contradicts shutdownAfterJobFinishes: true.",
                                       "choose another policy or set shutdownAfterJobFinishes: false"))
    elif not rules:
        out.append(doc.problem(field, "needs both onSuccess and onFailure, or deletionRules.", "add deletionRules"))
    seen: dict[tuple[Any, Any], int] = {}
    for i, rule in enumerate(rules):
        condition = rule.get("condition") or {}
        path = f"{field}.deletionRules[{i}]"
        if ("jobStatus" in condition) == ("jobDeploymentStatus" in condition):
            out.append(doc.problem(f"{path}.condition", "needs exactly one of jobStatus and jobDeploymentStatus.",
                                   "keep one of the two"))
        if selector and rule.get("policy") in ("DeleteCluster", "DeleteWorkers"):
            out.append(doc.problem(f"{path}.policy", f"{rule.get('policy')} is not allowed with clusterSelector.",
                                   "use DeleteSelf or DeleteNone"))
        if rule.get("policy") == "DeleteWorkers" and autoscaling_enabled(spec.get("rayClusterSpec") or {}):
            out.append(doc.problem(f"{path}.policy", "DeleteWorkers does not work with autoscaling.",
                                   "use DeleteCluster, or turn autoscaling off"))
        key = (condition.get("jobStatus"), rule.get("policy"))
        if key in seen:
            out.append(doc.problem(path, f"duplicates deletionRules[{seen[key]}].", "remove one of them"))
        seen[key] = i
    return out
