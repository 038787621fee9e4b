"""KubeRay v1.7.0's admission rules for a RayCluster and a RayJob, one small check per rule.

What KubeRay refuses, in the order the API server and the operator refuse it:
1. the CRDs' CEL rules (x-kubernetes-validations), which the API server evaluates: check_cel;
2. the validating webhook (ray-operator/pkg/webhooks/v1/): name rules and unique worker group names;
3. the operator's ray-operator/controllers/ray/utils/validation.go: ValidateRayClusterMetadata/Spec/UpgradeOptions,
   ValidateRayJobMetadata/Spec (the embedded rayClusterSpec under the RayJob's annotations), with the feature
   gates of ray-operator/pkg/features/features.go (FeatureGates): check_kuberay.
KubeRay stops at its first error; raytrain reports every rule that fails, so each check stands alone.
Each check's comment names the KubeRay function it mirrors, so a later KubeRay can be followed rule by rule.

Not covered: RayService and RayCronJob (raytrain ships neither), ValidateRayClusterStatus/ValidateRayJobStatus (the
operator writes status, a manifest has none) and the CEL transition rules (`self == oldSelf`: they compare an update
with the stored object; `raytrain validate` checks what a create would do).

Where raytrain is stricter than KubeRay on purpose (a manifest KubeRay admits that cannot work), the message says
that KubeRay admits it and why it would still fail (see "raytrain is stricter").
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from raytrain.kube.crds import openapi_schema
from raytrain.kube.shape import autoscaling_enabled, groups
from raytrain.kube.shape import get as dig

if TYPE_CHECKING:
    from raytrain.kube.problems import Doc, Problem

# ----------------------------------------------------------------------------------------------------------
# feature gates (ray-operator/pkg/features/features.go)

# v1.7.0's gates and their defaults (defaultFeatureGates); Beta gates are on, Alpha gates off.
DEFAULT_FEATURE_GATES: dict[str, bool] = {
    "RayClusterStatusConditions": True,
    "RayJobDeletionPolicy": True,
    "RayMultiHostIndexing": True,
    "RayServiceIncrementalUpgrade": True,
    "RayCronJob": False,
    "SidecarSubmitterRestart": False,
    "RayClusterNetworkPolicy": False,
    "GCSFaultToleranceEmbeddedStorage": False,
    "RayClusterMTLS": False,
    "RayClusterHistoryServer": False,
    "KubernetesWAS": False,
}
# The Beta ones (AllBeta sets them); the rest are Alpha (AllAlpha).
_BETA_GATES = {"RayClusterStatusConditions", "RayJobDeletionPolicy", "RayMultiHostIndexing",
               "RayServiceIncrementalUpgrade"}
# strconv.ParseBool, which k8s.io/component-base's featureGate.Set uses for each value.
_GO_BOOLS = {"1": True, "t": True, "T": True, "TRUE": True, "true": True, "True": True,
             "0": False, "f": False, "F": False, "FALSE": False, "false": False, "False": False}


class FeatureGateError(ValueError):
    """A --feature-gates value the operator would refuse to start with; the message says what is wrong."""


@dataclasses.dataclass(frozen=True)
class FeatureGates:
    """The operator's feature gates: v1.7.0's defaults with the --feature-gates flag applied."""

    overrides: tuple[tuple[str, bool], ...] = ()

    @classmethod
    def parse(cls, flag: str | None) -> FeatureGates:
        """`Gate=true,Other=false` as k8s.io/component-base featureGate.Set reads it (also AllAlpha/AllBeta)."""
        overrides: dict[str, bool] = {}
        for item in str(flag or "").split(","):
            if not item:
                continue
            key, sep, value = item.partition("=")
            key, value = key.strip(), value.strip()
            if not sep:
                raise FeatureGateError(f"missing bool value for {key}")
            if value not in _GO_BOOLS:
                raise FeatureGateError(f"invalid value of {key}={value}: use true or false")
            if key not in DEFAULT_FEATURE_GATES and key not in ("AllAlpha", "AllBeta"):
                raise FeatureGateError(f"unrecognized feature gate: {key} (KubeRay v1.7.0's gates: "
                                       f"{', '.join(DEFAULT_FEATURE_GATES)})")
            overrides[key] = _GO_BOOLS[value]
        return cls(tuple(overrides.items()))

    def enabled(self, gate: str) -> bool:
        explicit = dict(self.overrides)
        if gate in explicit:
            return explicit[gate]
        group = "AllBeta" if gate in _BETA_GATES else "AllAlpha"
        return explicit.get(group, DEFAULT_FEATURE_GATES[gate])


def _gate_off(doc: Doc, field: str, gate: str, what: str) -> Problem:
    return doc.problem(field, f"{what} needs the KubeRay operator's {gate} feature gate, which is off "
                       f"(v1.7.0 default: {str(DEFAULT_FEATURE_GATES[gate]).lower()}).",
                       f"start the operator with --feature-gates={gate}=true and validate with "
                       f"`raytrain validate --feature-gates {gate}=true`, or remove {field.rsplit('.', 1)[-1]}")


# ----------------------------------------------------------------------------------------------------------
# reading KubeRay objects


def _workers(spec: dict, prefix: str) -> list[tuple[str, str, dict]]:
    return groups(spec, prefix)[1:]


def _containers(group: dict) -> list[dict]:
    return dig(group, "template", "spec", "containers", default=[])


def _head(spec: dict) -> dict:
    """The head's Ray container (RayContainerIndex 0)."""
    return dig(spec, "headGroupSpec", "template", "spec", "containers", 0, default={})


def _head_env_path(prefix: str) -> str:
    return f"{prefix}.headGroupSpec.template.spec.containers[0].env"


def _env(env_list: Any) -> dict[str, dict]:
    """name -> the env entry (EnvVarByName: the first of a name wins)."""
    out: dict[str, dict] = {}
    for entry in env_list or []:
        if isinstance(entry, dict) and entry.get("name") not in out:
            out[entry.get("name")] = entry
    return out


def _env_true(env_list: Any, name: str) -> bool:
    return str(_env(env_list).get(name, {}).get("value", "")) in ("1", "true")


def _autoscaler_v2(spec: dict) -> bool:
    # utils.IsAutoscalingV2Enabled
    return dig(spec, "autoscalerOptions", "version") == "v2"


def _v2_or_env(spec: dict) -> bool:
    """Autoscaler v2 by autoscalerOptions.version, or the head's RAY_enable_autoscaler_v2 (KubeRay < 1.4 style)."""
    return _autoscaler_v2(spec) or _env_true(_head(spec).get("env"), "RAY_enable_autoscaler_v2")


_GO_VERSION = re.compile(r"^\s*v?([0-9]+(?:\.[0-9]+)*)(.*)$", re.S)


def parse_generic_version(text: Any) -> tuple[int, ...] | None:
    """k8s.io/apimachinery util/version.ParseGeneric: two or more numeric fields, the first without a leading
    zero, then anything; None where KubeRay's parse fails."""
    match = _GO_VERSION.match(str(text))
    if not match:
        return None
    parts = match.group(1).split(".")
    if len(parts) < 2 or (parts[0].startswith("0") and parts[0] != "0"):
        return None
    return tuple(int(p) for p in parts)


def _at_least(version: tuple[int, ...], floor: tuple[int, ...]) -> bool:
    width = max(len(version), len(floor))  # Version.LessThan pads the shorter one with zeros
    return version + (0,) * (width - len(version)) >= floor + (0,) * (width - len(floor))


def _version_floor(doc: Doc, spec: dict, prefix: str, what: str, floor: str) -> list[Problem]:
    """A field that needs Ray `floor` or later, read from the manifest's rayVersion as KubeRay does."""
    ray_version = spec.get("rayVersion")
    field = f"{prefix}.rayVersion"
    fix = f"set rayVersion to the image's Ray version ({floor} or later), or remove {what}"
    if not ray_version:
        return [doc.problem(field, f"is not set, but {what} needs Ray {floor} or later.", fix)]
    parsed = parse_generic_version(ray_version)
    if parsed is None:
        return [doc.problem(field, f"'{ray_version}' is not a version KubeRay can read, and {what} needs Ray "
                            f"{floor} or later.", fix)]
    if not _at_least(parsed, tuple(int(p) for p in floor.split("."))):
        return [doc.problem(field, f"is {ray_version}, but {what} needs Ray {floor} or later.", fix)]
    return []


# k8s.io/apimachinery/pkg/util/validation
_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def _is_dns1123_label(name: str) -> bool:
    return len(name) <= 63 and bool(_DNS1123_LABEL.match(name))


def _is_qualified_name(key: str) -> bool:
    # validation.IsQualifiedName: [prefix/]name, prefix a DNS-1123 subdomain
    prefix, sep, name = key.rpartition("/")
    if sep and not (prefix and len(prefix) <= 253 and _DNS1123_SUBDOMAIN.match(prefix)):
        return False
    return 0 < len(name) <= 63 and bool(_QUALIFIED_NAME.match(name))


def _is_label_value(value: str) -> bool:
    # validation.IsValidLabelValue
    return len(value) <= 63 and bool(_LABEL_VALUE.match(value))


# ----------------------------------------------------------------------------------------------------------
# entry point

# KubeRay limits (utils/constant.go): 63 minus "-serve-svc" for a RayCluster; minus 6 more for the suffix a RayJob's
# cluster gets.
MAX_RAYCLUSTER_NAME = 53
MAX_RAYJOB_NAME = MAX_RAYCLUSTER_NAME - 6
DELETE_POLICIES_NEEDING_CLUSTER = ("DeleteCluster", "DeleteWorkers")
SUBMISSION_MODES = ("K8sJobMode", "HTTPMode", "InteractiveMode", "SidecarMode")


def check_kuberay(doc: Doc, gates: FeatureGates) -> list[Problem]:
    """KubeRay's webhook and operator rules for a RayCluster or RayJob whose shape the CRD schema accepted."""
    annotations = dig(doc.obj, "metadata", "annotations", default={})
    spec = doc.obj.get("spec") or {}
    out = check_name(doc)
    if doc.kind == "RayCluster":
        labels = dig(doc.obj, "metadata", "labels", default={})
        out += check_upgrade_strategy(doc, spec, "spec", str(labels.get("ray.io/originated-from-crd", "")))
        out += check_cluster_spec(doc, spec, "spec", annotations, gates)
    elif doc.kind == "RayJob":
        out += check_job_spec(doc, spec, gates)
        cluster_spec = spec.get("rayClusterSpec")
        if isinstance(cluster_spec, dict):
            # The RayCluster the RayJob creates carries ray.io/originated-from-crd: RayJob.
            out += check_upgrade_strategy(doc, cluster_spec, "spec.rayClusterSpec", "RayJob")
            out += check_cluster_spec(doc, cluster_spec, "spec.rayClusterSpec", annotations, gates)
    return out


def check_name(doc: Doc) -> list[Problem]:
    # ValidateRayClusterMetadata / ValidateRayJobMetadata (also the webhooks' validateRayCluster/validateRayJob)
    out: list[Problem] = []
    limit = MAX_RAYCLUSTER_NAME if doc.kind == "RayCluster" else MAX_RAYJOB_NAME
    if len(doc.name) > limit:
        why = "" if doc.kind == "RayCluster" else " (KubeRay appends 6 characters for the RayJob's cluster)"
        out.append(doc.problem("metadata.name", f"'{doc.name}' has {len(doc.name)} characters; KubeRay allows at most "
                               f"{limit} for a {doc.kind}{why}.", f"shorten it to {limit} characters or fewer"))
    if not _DNS1035.match(doc.name):
        out.append(doc.problem("metadata.name", f"'{doc.name}' is not a DNS-1035 label.",
                               "use lower-case letters, digits and '-', starting with a letter"))
    return out


def check_upgrade_strategy(doc: Doc, spec: dict, prefix: str, creator: str) -> list[Problem]:
    # ValidateRayClusterUpgradeOptions
    kind = dig(spec, "upgradeStrategy", "type")
    field = f"{prefix}.upgradeStrategy.type"
    if kind is None:
        return []
    if kind not in ("Recreate", "None"):  # the CRD's enum says so first
        return [doc.problem(field, f"is {kind!r}, not Recreate or None.", "use Recreate or None")]
    if creator in ("RayJob", "RayService"):  # utils.GetCRDType: any other value means RayCluster
        whose = "the RayJob's RayCluster" if prefix != "spec" else "a RayCluster labelled ray.io/originated-from-crd"
        return [doc.problem(field, f"cannot be set on {whose}: KubeRay allows upgradeStrategy only on a RayCluster "
                            f"created directly (this one is created by a {creator}).", "remove upgradeStrategy")]
    return []


def check_cluster_spec(doc: Doc, spec: dict, prefix: str, annotations: Mapping[str, Any],
                       gates: FeatureGates) -> list[Problem]:
    """ValidateRayClusterSpec (+ the webhook's unique worker group names), every rule on its own."""
    out = check_unique_group_names(doc, spec, prefix)
    if not _containers(spec.get("headGroupSpec") or {}):
        # headGroupSpec should have at least one container: the rules below read the head's Ray container.
        return out + [doc.problem(f"{prefix}.headGroupSpec.template.spec.containers", "the head group has no "
                                  "container.", "add the Ray container as the first container")]
    for check in CLUSTER_CHECKS:
        out += check(doc, spec, prefix, annotations, gates)
    return out


def check_unique_group_names(doc: Doc, spec: dict, prefix: str) -> list[Problem]:
    # webhooks/v1 RayClusterWebhook.validateWorkerGroups (for a RayJob: the webhook refuses the RayCluster it creates)
    out: list[Problem] = []
    seen: dict[Any, int] = {}
    for i, group in enumerate(spec.get("workerGroupSpecs") or []):
        name = group.get("groupName")
        if name in seen:
            out.append(doc.problem(f"{prefix}.workerGroupSpecs[{i}].groupName", f"'{name}' is already the name of "
                                   f"workerGroupSpecs[{seen[name]}]; KubeRay's webhook refuses duplicate worker group "
                                   "names (the operator finds a group's pods by its name).",
                                   "give each worker group its own groupName"))
        seen.setdefault(name, i)
    return out


# ----------------------------------------------------------------------------------------------------------
# ValidateRayClusterSpec: groups


def check_worker_containers(doc: Doc, spec: dict, prefix: str, annotations: Mapping[str, Any],
                            gates: FeatureGates) -> list[Problem]:
    # ValidateRayClusterSpec: workerGroupSpec should have at least one container
    return [doc.problem(f"{path}.template.spec.containers", f"worker group {name} has no container.",
                        "add the Ray container as the first container")
            for path, name, group in _workers(spec, prefix) if not _containers(group)]


def check_group_resources(doc: Doc, spec: dict, prefix: str, annotations: Mapping[str, Any],
                          gates: FeatureGates) -> list[Problem]:
    # validateRayGroupResources
    out = []
    for path, name, group in groups(spec, prefix):
        params = group.get("rayStartParams") or {}
        if group.get("resources") and any(params.get(k) for k in ("num-cpus", "num-gpus", "memory", "resources")):
            out.append(doc.problem(f"{path}.resources", f"group {name} sets resources both here and in "
                                   "rayStartParams (num-cpus, num-gpus, memory or resources).", "use only one of them"))
    return out


def check_group_labels_not_in_ray_start_params(doc: Doc, spec: dict, prefix: str, annotations: Mapping[str, Any],
                                               gates: FeatureGates) -> list[Problem]:
    # validateRayGroupLabels: rayStartParams['labels'] is not supported
    return [doc.problem(f"{path}.rayStartParams.labels", f"is not supported by KubeRay (group {name}).",
                        f"move the labels to {path}.labels")
            for path, name, group in groups(spec, prefix) if "labels" in (group.get("rayStartParams") or {})]


def check_group_label_syntax(doc: Doc, spec: dict, prefix: str, annotations: Mapping[str, Any],
                             gates: FeatureGates) -> list[Problem]:
    # validateRayGroupLabels: keys are qualified names, values label values (Kubernetes label syntax)
    out = []
    for path, name, group in groups(spec, prefix):
        for key, value in (group.get("labels") or {}).items():
            if not _is_qualified_name(str(key)):
                out.append(doc.problem(f"{path}.labels", f"key '{key}' of group {name} is not a valid label key.",
                                       "use [prefix/]name: a name of at most 63 letters, digits, '-', '_' or '.', "
                                       "starting and ending with a letter or digit"))
            if not _is_label_value(str(value)):
                out.append(doc.problem(f"{path}.labels.{key}", f"'{value}' of group {name} is not a valid label "
                                       "value.", "use at most 63 letters, digits, '-', '_' or '.', starting and "
                                       "ending with a letter or digit (or an empty string)"))
    return out


def check_worker_replica_bounds_set(doc: Doc, spec: dict, prefix: str, annotations: Mapping[str, Any],
                                    gates: FeatureGates) -> list[Problem]:
    # ValidateRayClusterSpec: both minReplicas and maxReplicas when autoscaling is disabled
    if autoscaling_enabled(spec):
        return []
    return [doc.problem(path, f"worker group {name} must set both minReplicas and maxReplicas when autoscaling is "
                        "disabled.", "set minReplicas and maxReplicas")
            for path, name, group in _workers(spec, prefix)
            if group.get("minReplicas") is None or group.get("maxReplicas") is None]


def check_worker_replicas_not_negative(doc: Doc, spec: dict, prefix: str, annotations: Mapping[str, Any],
                                       gates: FeatureGates) -> list[Problem]:
    # ValidateRayClusterSpec: negative minReplicas / maxReplicas
    return [doc.problem(f"{path}.{key}", f"is {group[key]} (negative) in worker group {name}.", "use 0 or more")
            for path, name, group in _workers(spec, prefix) for key in ("minReplicas", "maxReplicas")
            if isinstance(group.get(key), int) and group[key] < 0]


def check_worker_min_not_above_max(doc: Doc, spec: dict, prefix: str, annotations: Mapping[str, Any],
                                   gates: FeatureGates) -> list[Problem]:
    # ValidateRayClusterSpec: minReplicas greater than maxReplicas
    out = []
    for path, name, group in _workers(spec, prefix):
        low, high = group.get("minReplicas"), group.get("maxReplicas")
        if isinstance(low, int) and isinstance(high, int) and 0 <= high < low:  # a negative one: said above
            out.append(doc.problem(f"{path}.minReplicas", f"is {low}, above maxReplicas {high} in worker group "
                                   f"{name}.", f"lower minReplicas to {high} or raise maxReplicas to {low}"))
    return out


def _needs_autoscaler_v2(doc: Doc, field: str, group: str, prefix: str) -> Problem:
    return doc.problem(field, f"is set in worker group {group}, but only autoscaler v2 reads it.",
                       f"set {prefix}.autoscalerOptions.version: v2, or remove it")


def check_worker_idle_timeout(doc: Doc, spec: dict, prefix: str, annotations: Mapping[str, Any],
                              gates: FeatureGates) -> list[Problem]:
    # validateWorkerGroupIdleTimeout
    out = []
    for path, name, group in _workers(spec, prefix):
        timeout = group.get("idleTimeoutSeconds")
        if timeout is None:
            continue
        if timeout < 0:
            out.append(doc.problem(f"{path}.idleTimeoutSeconds", f"is {timeout} in worker group {name}; it must not "
                                   "be negative.", "use 0 or more seconds"))
        elif not _v2_or_env(spec):
            out.append(_needs_autoscaler_v2(doc, f"{path}.idleTimeoutSeconds", name, prefix))
    return out


def check_worker_priority(doc: Doc, spec: dict, prefix: str, annotations: Mapping[str, Any],
                          gates: FeatureGates) -> list[Problem]:
    # validateWorkerGroupPriority: Ray 2.56.0 or later, and autoscaler v2
    out = []
    for path, name, group in _workers(spec, prefix):
        priority = group.get("priority")
        if not priority:
            continue
        floor = _version_floor(doc, spec, prefix, f"{path}.priority", "2.56.0")
        out += floor
        if not floor and not _v2_or_env(spec):
            out.append(_needs_autoscaler_v2(doc, f"{path}.priority", name, prefix))
    return out


# ----------------------------------------------------------------------------------------------------------
# ValidateRayClusterSpec: GCS fault tolerance

FT_ANNOTATION = "ray.io/ft-enabled"
EXTERNAL_STORAGE_NS_ANNOTATION = "ray.io/external-storage-namespace"


def check_ft_annotation_with_options(doc: Doc, spec: dict, prefix: str, annotations: Mapping[str, Any],
                                     gates: FeatureGates) -> list[Problem]:
    # ValidateRayClusterSpec: ray.io/ft-enabled annotation and GcsFaultToleranceOptions both set
    if annotations.get(FT_ANNOTATION) and spec.get("gcsFaultToleranceOptions") is not None:
        return [doc.problem(f"{prefix}.gcsFaultToleranceOptions", f"is set together with the {FT_ANNOTATION} "
                            "annotation.", "remove the annotation and keep gcsFaultToleranceOptions")]
    return []


def check_redis_address_without_ft(doc: Doc, spec: dict, prefix: str, annotations: Mapping[str, Any],
                                   gates: FeatureGates) -> list[Problem]:
    # ValidateRayClusterSpec: RAY_REDIS_ADDRESS implicitly enables GCS FT (utils.IsGCSFaultToleranceEnabled)
    ft_on = (spec.get("gcsFaultToleranceOptions") is not None
             or str(annotations.get(FT_ANNOTATION, "")).lower() == "true")
    if not ft_on and "RAY_REDIS_ADDRESS" in _env(_head(spec).get("env")):
        return [doc.problem(_head_env_path(prefix), "RAY_REDIS_ADDRESS enables GCS fault tolerance implicitly, but "
                            "gcsFaultToleranceOptions is not set.", "set gcsFaultToleranceOptions.redisAddress instead")]
    return []


def check_ft_options_conflicts(doc: Doc, spec: dict, prefix: str, annotations: Mapping[str, Any],
                               gates: FeatureGates) -> list[Problem]:
    # ValidateRayClusterSpec: with GcsFaultToleranceOptions, no redis-password, REDIS_PASSWORD, RAY_REDIS_ADDRESS,
    # or ray.io/external-storage-namespace
    if spec.get("gcsFaultToleranceOptions") is None:
        return []
    out = []
    if dig(spec, "headGroupSpec", "rayStartParams", "redis-password"):
        out.append(doc.problem(f"{prefix}.headGroupSpec.rayStartParams.redis-password", "cannot be set with "
                               "gcsFaultToleranceOptions.", "use gcsFaultToleranceOptions.redisPassword"))
    env = _env(_head(spec).get("env"))
    for var, instead in (("REDIS_PASSWORD", "redisPassword"), ("RAY_REDIS_ADDRESS", "redisAddress")):
        if var in env:
            out.append(doc.problem(_head_env_path(prefix), f"{var} cannot be set with gcsFaultToleranceOptions.",
                                   f"use gcsFaultToleranceOptions.{instead}"))
    if annotations.get(EXTERNAL_STORAGE_NS_ANNOTATION):
        out.append(doc.problem(f"metadata.annotations.{EXTERNAL_STORAGE_NS_ANNOTATION}", "cannot be set with "
                               "gcsFaultToleranceOptions.", "use gcsFaultToleranceOptions.externalStorageNamespace"))
    return out


def _rocksdb(spec: dict) -> dict | None:
    """gcsFaultToleranceOptions when its backend is rocksdb (utils.IsGCSFaultToleranceEmbedded)."""
    options = spec.get("gcsFaultToleranceOptions")
    return options if options is not None and options.get("backend") == "rocksdb" else None


def check_rocksdb_gate(doc: Doc, spec: dict, prefix: str, annotations: Mapping[str, Any],
                       gates: FeatureGates) -> list[Problem]:
    # validateGcsFaultToleranceBackend: rocksdb needs the GCSFaultToleranceEmbeddedStorage gate
    if _rocksdb(spec) is not None and not gates.enabled("GCSFaultToleranceEmbeddedStorage"):
        return [_gate_off(doc, f"{prefix}.gcsFaultToleranceOptions.backend", "GCSFaultToleranceEmbeddedStorage",
                          "backend: rocksdb")]
    return []


def check_rocksdb_no_redis_fields(doc: Doc, spec: dict, prefix: str, annotations: Mapping[str, Any],
                                  gates: FeatureGates) -> list[Problem]:
    # validateGcsFaultToleranceBackend: rocksdb takes no redisAddress, redisUsername, redisPassword or
    # externalStorageNamespace
    options = _rocksdb(spec) or {}
    return [doc.problem(f"{prefix}.gcsFaultToleranceOptions.{key}", "cannot be set when backend is rocksdb.",
                        f"remove {key}")
            for key in ("redisAddress", "redisUsername", "redisPassword", "externalStorageNamespace")
            if options.get(key) not in (None, "")]


def check_rocksdb_claim_alone(doc: Doc, spec: dict, prefix: str, annotations: Mapping[str, Any],
                              gates: FeatureGates) -> list[Problem]:
    # validateGcsFaultToleranceBackend: storage.claimName excludes size, storageClassName and accessModes
    storage = (_rocksdb(spec) or {}).get("storage") or {}
    if storage.get("claimName") and (storage.get("size") is not None or storage.get("accessModes")
                                     or storage.get("storageClassName") is not None):
        return [doc.problem(f"{prefix}.gcsFaultToleranceOptions.storage.claimName", "cannot be combined with size, "
                            "storageClassName or accessModes (an existing claim has them already).",
                            "keep claimName alone, or drop it")]
    return []


def check_rocksdb_managed_head(doc: Doc, spec: dict, prefix: str, annotations: Mapping[str, Any],
                               gates: FeatureGates) -> list[Problem]:
    # validateGcsFaultToleranceBackend: RAY_gcs_storage(_path), the gcs-storage mount and volume are KubeRay's
    if _rocksdb(spec) is None:
        return []
    out = []
    head = _head(spec)
    for var in ("RAY_gcs_storage", "RAY_gcs_storage_path"):
        if var in _env(head.get("env")):
            out.append(doc.problem(_head_env_path(prefix), f"{var} is managed by KubeRay with the rocksdb backend.",
                                   f"remove {var}"))
    for i, mount in enumerate(head.get("volumeMounts") or []):
        if mount.get("mountPath") == "/data/gcs" or mount.get("name") == "gcs-storage":
            out.append(doc.problem(f"{prefix}.headGroupSpec.template.spec.containers[0].volumeMounts[{i}]", "the mount "
                                   "named gcs-storage at /data/gcs is managed by KubeRay with the rocksdb backend.",
                                   "remove this mount"))
    for i, volume in enumerate(dig(spec, "headGroupSpec", "template", "spec", "volumes", default=[])):
        if volume.get("name") == "gcs-storage":
            out.append(doc.problem(f"{prefix}.headGroupSpec.template.spec.volumes[{i}]", "the volume gcs-storage is "
                                   "managed by KubeRay with the rocksdb backend.", "remove this volume"))
    return out


def check_redis_backend_no_storage(doc: Doc, spec: dict, prefix: str, annotations: Mapping[str, Any],
                                   gates: FeatureGates) -> list[Problem]:
    # validateGcsFaultToleranceBackend: storage applies only to rocksdb (utils.GetGcsFaultToleranceBackend: redis
    # when unset)
    options = spec.get("gcsFaultToleranceOptions")
    if options is not None and (options.get("backend") or "redis") == "redis" and options.get("storage") is not None:
        return [doc.problem(f"{prefix}.gcsFaultToleranceOptions.storage", "applies only to the rocksdb backend.",
                            "remove storage, or set backend: rocksdb")]
    return []


def check_redis_username(doc: Doc, spec: dict, prefix: str, annotations: Mapping[str, Any],
                         gates: FeatureGates) -> list[Problem]:
    # ValidateRayClusterSpec: no redis username in rayStartParams or REDIS_USERNAME
    in_env = "REDIS_USERNAME" in _env(_head(spec).get("env"))
    if dig(spec, "headGroupSpec", "rayStartParams", "redis-username") or in_env:
        return [doc.problem(f"{prefix}.headGroupSpec", "sets a redis username (rayStartParams redis-username or "
                            "REDIS_USERNAME).", "use gcsFaultToleranceOptions.redisUsername")]
    return []


# ----------------------------------------------------------------------------------------------------------
# ValidateRayClusterSpec: suspend and the autoscaler


def check_worker_suspend_gate(doc: Doc, spec: dict, prefix: str, annotations: Mapping[str, Any],
                              gates: FeatureGates) -> list[Problem]:
    # ValidateRayClusterSpec: a worker group can be suspended only with the RayJobDeletionPolicy gate
    if gates.enabled("RayJobDeletionPolicy"):
        return []
    return [_gate_off(doc, f"{path}.suspend", "RayJobDeletionPolicy", f"suspending worker group {name}")
            for path, name, group in _workers(spec, prefix) if group.get("suspend")]


def check_v2_env_without_autoscaling(doc: Doc, spec: dict, prefix: str, annotations: Mapping[str, Any],
                                     gates: FeatureGates) -> list[Problem]:
    # ValidateRayClusterSpec: RAY_enable_autoscaler_v2 "1"/"true" with enableInTreeAutoscaling false
    if not autoscaling_enabled(spec) and _env_true(_head(spec).get("env"), "RAY_enable_autoscaler_v2"):
        return [doc.problem(_head_env_path(prefix), "RAY_enable_autoscaler_v2 is on but enableInTreeAutoscaling is "
                            "not true.", "set enableInTreeAutoscaling: true, or remove the variable")]
    return []


def check_worker_suspend_with_autoscaling(doc: Doc, spec: dict, prefix: str, annotations: Mapping[str, Any],
                                          gates: FeatureGates) -> list[Problem]:
    # ValidateRayClusterSpec: a worker group cannot be suspended with the autoscaler on
    if not autoscaling_enabled(spec):
        return []
    return [doc.problem(f"{path}.suspend", f"worker group {name} cannot be suspended with the autoscaler on.",
                        "remove suspend or set enableInTreeAutoscaling: false")
            for path, name, group in _workers(spec, prefix) if group.get("suspend")]


def check_autoscaler_version_and_env(doc: Doc, spec: dict, prefix: str, annotations: Mapping[str, Any],
                                     gates: FeatureGates) -> list[Problem]:
    # ValidateRayClusterSpec: both autoscalerOptions.version and RAY_enable_autoscaler_v2
    if (autoscaling_enabled(spec) and dig(spec, "autoscalerOptions", "version") is not None
            and "RAY_enable_autoscaler_v2" in _env(_head(spec).get("env"))):
        return [doc.problem(_head_env_path(prefix), "RAY_enable_autoscaler_v2 is set together with "
                            "autoscalerOptions.version.", "remove the variable and keep autoscalerOptions.version")]
    return []


def check_autoscaler_v2_restart_policy(doc: Doc, spec: dict, prefix: str, annotations: Mapping[str, Any],
                                       gates: FeatureGates) -> list[Problem]:
    # ValidateRayClusterSpec: restartPolicy Never or unset for every pod with autoscaler v2
    if not (autoscaling_enabled(spec) and _autoscaler_v2(spec)):
        return []
    return [doc.problem(f"{path}.template.spec.restartPolicy", f"is {policy} in group {name}, but autoscaler v2 "
                        "needs Never or unset.", "set restartPolicy: Never or remove it")
            for path, name, group in groups(spec, prefix)
            if (policy := dig(group, "template", "spec", "restartPolicy", default="")) not in ("", "Never")]


def check_autoscaler_idle_timeout(doc: Doc, spec: dict, prefix: str, annotations: Mapping[str, Any],
                                  gates: FeatureGates) -> list[Problem]:
    # ValidateRayClusterSpec: autoscalerOptions.idleTimeoutSeconds must be non-negative
    timeout = dig(spec, "autoscalerOptions", "idleTimeoutSeconds")
    if timeout is not None and timeout < 0:
        return [doc.problem(f"{prefix}.autoscalerOptions.idleTimeoutSeconds", f"is {timeout}; it must not be "
                            "negative.", "use 0 or more seconds")]
    return []


def check_autoscaler_env_start_cmd(doc: Doc, spec: dict, prefix: str, annotations: Mapping[str, Any],
                                   gates: FeatureGates) -> list[Problem]:
    # ValidateRayClusterSpec: autoscalerOptions.env must not contain KUBERAY_GEN_AUTOSCALER_START_CMD
    if "KUBERAY_GEN_AUTOSCALER_START_CMD" in _env(dig(spec, "autoscalerOptions", "env")):
        return [doc.problem(f"{prefix}.autoscalerOptions.env", "KUBERAY_GEN_AUTOSCALER_START_CMD is managed by KubeRay.",
                            "remove it (autoscalerOptions.args can still use $KUBERAY_GEN_AUTOSCALER_START_CMD)")]
    return []


# ----------------------------------------------------------------------------------------------------------
# ValidateRayClusterSpec: fields behind the operator's Alpha feature gates

# "spec.historyServerOptions requires the RayClusterHistoryServer feature gate", and likewise networkPolicy, tlsOptions
FIELD_GATES = {"historyServerOptions": "RayClusterHistoryServer", "networkPolicy": "RayClusterNetworkPolicy",
               "tlsOptions": "RayClusterMTLS"}


def check_field_gates(doc: Doc, spec: dict, prefix: str, annotations: Mapping[str, Any],
                      gates: FeatureGates) -> list[Problem]:
    # ValidateRayClusterSpec: historyServerOptions, networkPolicy and tlsOptions each need their feature gate
    return [_gate_off(doc, f"{prefix}.{field}", gate, field) for field, gate in FIELD_GATES.items()
            if spec.get(field) is not None and not gates.enabled(gate)]


# ----------------------------------------------------------------------------------------------------------
# ValidateRayClusterSpec: history server

COLLECTOR_CONTAINER = "ray-history-collector"
COLLECTOR_MANAGED_ENV = ("POD_IP", "FQ_RAY_IP", "RAY_CLUSTER_NAME", "RAY_CLUSTER_NAMESPACE", "RAY_ROLE",
                         "OWNER_KIND", "OWNER_NAME", "EVENTS_PORT")


def check_history_server_collector_set(doc: Doc, spec: dict, prefix: str, annotations: Mapping[str, Any],
                                       gates: FeatureGates) -> list[Problem]:
    # ValidateRayClusterSpec: historyServerOptions.collectorOptions must be set
    if spec.get("historyServerOptions") is not None and spec["historyServerOptions"].get("collectorOptions") is None:
        return [doc.problem(f"{prefix}.historyServerOptions.collectorOptions", "is required with historyServerOptions.",
                            "set collectorOptions (image and env with STORAGE_BACKEND)")]
    return []


def check_history_server_container_name(doc: Doc, spec: dict, prefix: str, annotations: Mapping[str, Any],
                                        gates: FeatureGates) -> list[Problem]:
    # ValidateRayClusterSpec: no pod container named like the collector KubeRay adds
    if spec.get("historyServerOptions") is None:
        return []
    return [doc.problem(f"{path}.template.spec.containers[{i}].name", f"'{COLLECTOR_CONTAINER}' is the history "
                        "server collector KubeRay adds.", "rename the container")
            for path, name, group in groups(spec, prefix) for i, container in enumerate(_containers(group))
            if container.get("name") == COLLECTOR_CONTAINER]


def check_collector_options(doc: Doc, spec: dict, prefix: str, annotations: Mapping[str, Any],
                            gates: FeatureGates) -> list[Problem]:
    # validateCollectorOptions
    options = dig(spec, "historyServerOptions", "collectorOptions")
    if options is None:
        return []
    field = f"{prefix}.historyServerOptions.collectorOptions"
    out = []
    if not options.get("image"):
        out.append(doc.problem(f"{field}.image", "is required.", "set the collector image"))
    env = _env(options.get("env"))
    for name in COLLECTOR_MANAGED_ENV:
        if name in env:
            out.append(doc.problem(f"{field}.env", f"{name} is managed by KubeRay in the collector.", f"remove {name}"))

    def has(name: str) -> bool:
        return name in env and bool(env[name].get("value") or env[name].get("valueFrom"))

    backend = str(env.get("STORAGE_BACKEND", {}).get("value") or "")
    if not backend:
        return out + [doc.problem(f"{field}.env", "has no STORAGE_BACKEND with a literal value.",
                                  "add STORAGE_BACKEND (GCS, S3, AZUREBLOB or ALIYUNOSS) with value:")]
    backend = backend.upper()
    needs = {"GCS": ["GCS_BUCKET"], "S3": ["S3_REGION"], "ALIYUNOSS": ["OSS_BUCKET", "OSS_ENDPOINT", "OSS_REGION"]}
    if backend == "AZUREBLOB":
        mode = str(env.get("AZURE_STORAGE_AUTH_MODE", {}).get("value") or "").strip().lower()
        if mode == "connection_string":
            needs[backend] = ["AZURE_STORAGE_CONNECTION_STRING"]
        elif mode in ("workload_identity", "default"):
            needs[backend] = ["AZURE_STORAGE_ACCOUNT_URL"]
        elif not has("AZURE_STORAGE_CONNECTION_STRING") and not has("AZURE_STORAGE_ACCOUNT_URL"):
            out.append(doc.problem(f"{field}.env", "STORAGE_BACKEND AZUREBLOB needs AZURE_STORAGE_CONNECTION_STRING or "
                                   "AZURE_STORAGE_ACCOUNT_URL.", "add one of them"))
    for name in needs.get(backend, []):
        if not has(name):
            out.append(doc.problem(f"{field}.env", f"STORAGE_BACKEND {backend} needs {name}.", f"add {name}"))
    return out


# ----------------------------------------------------------------------------------------------------------
# ValidateRayClusterSpec: auth


def check_auth_token_ray_version(doc: Doc, spec: dict, prefix: str, annotations: Mapping[str, Any],
                                 gates: FeatureGates) -> list[Problem]:
    # ValidateRayClusterSpec (utils.IsAuthEnabled): authOptions.mode token needs Ray 2.52.0 or later
    if dig(spec, "authOptions", "mode") != "token":
        return []
    return _version_floor(doc, spec, prefix, "authOptions.mode: token", "2.52.0")


def check_k8s_token_auth_needs_token_mode(doc: Doc, spec: dict, prefix: str, annotations: Mapping[str, Any],
                                          gates: FeatureGates) -> list[Problem]:
    # ValidateRayClusterSpec: enableK8sTokenAuth needs authOptions.mode token
    auth = spec.get("authOptions") or {}
    if auth.get("enableK8sTokenAuth") and auth.get("mode") != "token":
        return [doc.problem(f"{prefix}.authOptions.enableK8sTokenAuth", "is true but authOptions.mode is not token.",
                            "set authOptions.mode: token")]
    return []


def check_k8s_token_auth_ray_version(doc: Doc, spec: dict, prefix: str, annotations: Mapping[str, Any],
                                     gates: FeatureGates) -> list[Problem]:
    # ValidateRayClusterSpec (utils.IsK8sAuthEnabled): enableK8sTokenAuth needs Ray 2.55.0 or later
    auth = spec.get("authOptions") or {}
    if not (auth.get("enableK8sTokenAuth") and auth.get("mode") == "token"):
        return []
    if _version_floor(doc, spec, prefix, "authOptions.mode: token", "2.52.0"):
        return []  # check_auth_token_ray_version says it
    return _version_floor(doc, spec, prefix, "authOptions.enableK8sTokenAuth", "2.55.0")


def check_k8s_token_auth_no_secret(doc: Doc, spec: dict, prefix: str, annotations: Mapping[str, Any],
                                   gates: FeatureGates) -> list[Problem]:
    # ValidateRayClusterSpec: enableK8sTokenAuth and authOptions.secretName exclude each other
    auth = spec.get("authOptions") or {}
    if auth.get("enableK8sTokenAuth") and auth.get("mode") == "token" and auth.get("secretName"):
        return [doc.problem(f"{prefix}.authOptions.secretName", "cannot be set with enableK8sTokenAuth.",
                            "remove secretName, or set enableK8sTokenAuth: false")]
    return []


# ----------------------------------------------------------------------------------------------------------
# ValidateRayClusterSpec: network policy and TLS


def check_network_policy(doc: Doc, spec: dict, prefix: str, annotations: Mapping[str, Any],
                         gates: FeatureGates) -> list[Problem]:
    # validateNetworkPolicy: rules only for the direction the mode restricts; DNS-1123 group names; known groups
    policy = spec.get("networkPolicy")
    if policy is None:
        return []
    field = f"{prefix}.networkPolicy"
    mode = policy.get("mode") or "DenyAll"
    unrestricted = {"DenyAllEgress": "ingressRules", "DenyAllIngress": "egressRules"}.get(mode)
    out = []

    def rules_of(path: str, entry: dict) -> None:
        if unrestricted and entry.get(unrestricted):
            out.append(doc.problem(f"{path}.{unrestricted}", f"cannot be set when mode is {mode} (that direction is "
                                   "not restricted).", f"remove {unrestricted}, or set mode: DenyAll"))

    for key in ("head", "worker"):
        if policy.get(key) is not None:
            rules_of(f"{field}.{key}", policy[key])
    names = set()
    for path, name, group in _workers(spec, prefix):
        names.add(group.get("groupName"))
        if not _is_dns1123_label(str(group.get("groupName", ""))):
            out.append(doc.problem(f"{path}.groupName", f"'{name}' must be a DNS-1123 label with networkPolicy (it is "
                                   "part of the NetworkPolicy's name).", "use lower-case letters, digits and '-'"))
    for i, entry in enumerate(policy.get("workerGroups") or []):
        rules_of(f"{field}.workerGroups[{i}]", entry)
        if entry.get("groupName") not in names:
            out.append(doc.problem(f"{field}.workerGroups[{i}].groupName", f"'{entry.get('groupName')}' is not the "
                                   "groupName of any workerGroupSpecs entry.", "use a worker group's groupName"))
    return out


TLS_MANAGED_ENV = ("RAY_USE_TLS", "RAY_TLS_SERVER_CERT", "RAY_TLS_SERVER_KEY", "RAY_TLS_CA_CERT")
TLS_VOLUME, TLS_MOUNT_PATH = "ray-tls", "/etc/ray/tls"


def check_tls_managed(doc: Doc, spec: dict, prefix: str, annotations: Mapping[str, Any],
                      gates: FeatureGates) -> list[Problem]:
    # validateTLSOptions + validateNoConflictingTLSVolumeMount (utils.IsTLSEnabled: gate on and tlsOptions.enabled)
    if not (gates.enabled("RayClusterMTLS") and dig(spec, "tlsOptions", "enabled")):
        return []
    out = []
    places = [(f"{path}.template.spec.containers[0]", _containers(group)[0], f"group {name}")
              for path, name, group in groups(spec, prefix) if _containers(group)]
    places.append((f"{prefix}.autoscalerOptions", spec.get("autoscalerOptions") or {}, "the autoscaler"))
    for path, holder, who in places:
        env = _env(holder.get("env"))
        for var in TLS_MANAGED_ENV:
            if var in env:
                out.append(doc.problem(f"{path}.env", f"{var} is managed by KubeRay when tlsOptions is enabled "
                                       f"({who}).", f"remove {var}"))
        for i, mount in enumerate(holder.get("volumeMounts") or []):
            if mount.get("name") == TLS_VOLUME or mount.get("mountPath") == TLS_MOUNT_PATH:
                out.append(doc.problem(f"{path}.volumeMounts[{i}]", f"the mount named {TLS_VOLUME} at {TLS_MOUNT_PATH} "
                                       f"is managed by KubeRay when tlsOptions is enabled ({who}).", "remove this mount"))
    return out


CLUSTER_CHECKS: list[Callable[..., list[Problem]]] = [
    check_worker_containers, check_group_resources, check_group_labels_not_in_ray_start_params,
    check_group_label_syntax, check_worker_replica_bounds_set, check_worker_replicas_not_negative,
    check_worker_min_not_above_max, check_worker_idle_timeout, check_worker_priority,
    check_ft_annotation_with_options, check_redis_address_without_ft, check_ft_options_conflicts,
    check_rocksdb_gate, check_rocksdb_no_redis_fields, check_rocksdb_claim_alone, check_rocksdb_managed_head,
    check_redis_backend_no_storage, check_redis_username, check_worker_suspend_gate,
    check_v2_env_without_autoscaling, check_worker_suspend_with_autoscaling, check_autoscaler_version_and_env,
    check_autoscaler_v2_restart_policy, check_autoscaler_idle_timeout, check_autoscaler_env_start_cmd,
    check_field_gates, check_history_server_collector_set, check_history_server_container_name,
    check_collector_options, check_auth_token_ray_version, check_k8s_token_auth_needs_token_mode,
    check_k8s_token_auth_ray_version, check_k8s_token_auth_no_secret, check_network_policy,
    check_tls_managed,
]


# ----------------------------------------------------------------------------------------------------------
# ValidateRayJobSpec


def check_job_spec(doc: Doc, spec: dict, gates: FeatureGates) -> list[Problem]:
    out: list[Problem] = []
    for check in JOB_CHECKS:
        out += check(doc, spec, gates)
    return out


def _shutdown(spec: dict) -> bool:
    return bool(spec.get("shutdownAfterJobFinishes"))


def _selector_mode(spec: dict) -> bool:
    return bool(spec.get("clusterSelector"))


def check_job_suspend_needs_shutdown(doc: Doc, spec: dict, gates: FeatureGates) -> list[Problem]:
    # ValidateRayJobSpec: suspend needs shutdownAfterJobFinishes
    if spec.get("suspend") and not _shutdown(spec):
        return [doc.problem("spec.suspend", "a RayJob with shutdownAfterJobFinishes false cannot be suspended.",
                            "set shutdownAfterJobFinishes: true or remove suspend")]
    return []


def check_job_ttl_not_negative(doc: Doc, spec: dict, gates: FeatureGates) -> list[Problem]:
    # ValidateRayJobSpec: TTLSecondsAfterFinished must be a non-negative integer
    if (spec.get("ttlSecondsAfterFinished") or 0) < 0:
        return [doc.problem("spec.ttlSecondsAfterFinished", "must not be negative.", "use 0 or more")]
    return []


def check_job_ttl_needs_shutdown(doc: Doc, spec: dict, gates: FeatureGates) -> list[Problem]:
    # validateDeletionConfiguration: TTLSecondsAfterFinished only with shutdownAfterJobFinishes
    if (spec.get("ttlSecondsAfterFinished") or 0) > 0 and not _shutdown(spec):
        return [doc.problem("spec.ttlSecondsAfterFinished", "has no effect without shutdownAfterJobFinishes "
                            "(KubeRay rejects it).", "set shutdownAfterJobFinishes: true or remove the TTL")]
    return []


def check_deletion_strategy_gate(doc: Doc, spec: dict, gates: FeatureGates) -> list[Problem]:
    # validateDeletionConfiguration: deletionStrategy needs the RayJobDeletionPolicy gate
    if spec.get("deletionStrategy") is not None and not gates.enabled("RayJobDeletionPolicy"):
        return [_gate_off(doc, "spec.deletionStrategy", "RayJobDeletionPolicy", "deletionStrategy")]
    return []


def check_deletion_rules_without_shutdown(doc: Doc, spec: dict, gates: FeatureGates) -> list[Problem]:
    # validateDeletionConfiguration: deletionRules and shutdownAfterJobFinishes exclude each other
    if dig(spec, "deletionStrategy", "deletionRules") and _shutdown(spec):
        return [doc.problem("spec.deletionStrategy.deletionRules", "cannot be combined with shutdownAfterJobFinishes: "
                            "true.", "set shutdownAfterJobFinishes: false (the rules decide what is deleted, and when)")]
    return []


def check_deletion_strategy_one_kind(doc: Doc, spec: dict, gates: FeatureGates) -> list[Problem]:
    # validateDeletionConfiguration: legacy policies or deletionRules, not both, not neither (the CRD's CEL rules say
    # so first)
    strategy = spec.get("deletionStrategy")
    if strategy is None:
        return []
    legacy = strategy.get("onSuccess") is not None or strategy.get("onFailure") is not None
    rules = bool(strategy.get("deletionRules"))
    if rules and legacy:
        return [doc.problem("spec.deletionStrategy", "mixes onSuccess/onFailure with deletionRules.",
                            "keep only deletionRules")]
    if not rules and not legacy:
        return [doc.problem("spec.deletionStrategy", "needs both onSuccess and onFailure, or deletionRules.",
                            "add deletionRules")]
    return []


def _legacy(spec: dict) -> dict | None:
    strategy = spec.get("deletionStrategy") or {}
    if strategy.get("deletionRules") or (strategy.get("onSuccess") is None and strategy.get("onFailure") is None):
        return None
    return strategy


def check_legacy_policies_set(doc: Doc, spec: dict, gates: FeatureGates) -> list[Problem]:
    # validateLegacyDeletionPolicies: both onSuccess and onFailure, each with a policy
    strategy = _legacy(spec)
    if strategy is None:
        return []
    out = []
    for key in ("onSuccess", "onFailure"):
        if strategy.get(key) is None:  # the CRD's CEL rule says so first
            out.append(doc.problem(f"spec.deletionStrategy.{key}", "is required with the legacy policies.",
                                   "set both onSuccess and onFailure, or use deletionRules"))
        elif strategy[key].get("policy") is None:
            out.append(doc.problem(f"spec.deletionStrategy.{key}.policy", "is required when the legacy policies are "
                                   "used.", "set both onSuccess.policy and onFailure.policy, or use deletionRules"))
    return out


def _legacy_policies(spec: dict) -> list[tuple[str, str]]:
    strategy = _legacy(spec) or {}
    return [(f"spec.deletionStrategy.{key}.policy", policy) for key in ("onSuccess", "onFailure")
            if (policy := dig(strategy, key, "policy")) is not None]


def check_legacy_policy_cluster_selector(doc: Doc, spec: dict, gates: FeatureGates) -> list[Problem]:
    # validateLegacyDeletionPolicies: DeleteCluster/DeleteWorkers not with clusterSelector
    if not _selector_mode(spec):
        return []
    return [doc.problem(path, f"{policy} is not allowed with clusterSelector (the cluster is not the RayJob's).",
                        "use DeleteSelf or DeleteNone")
            for path, policy in _legacy_policies(spec) if policy in DELETE_POLICIES_NEEDING_CLUSTER]


def check_legacy_delete_workers_autoscaling(doc: Doc, spec: dict, gates: FeatureGates) -> list[Problem]:
    # validateLegacyDeletionPolicies: DeleteWorkers not with autoscaling
    if not autoscaling_enabled(spec.get("rayClusterSpec")):
        return []
    return [doc.problem(path, "DeleteWorkers does not work with autoscaling.", "use DeleteCluster, or turn "
                        "autoscaling off") for path, policy in _legacy_policies(spec) if policy == "DeleteWorkers"]


def check_legacy_delete_none_with_shutdown(doc: Doc, spec: dict, gates: FeatureGates) -> list[Problem]:
    # validateLegacyDeletionPolicies: DeleteNone contradicts shutdownAfterJobFinishes
    if not _shutdown(spec):
        return []
    return [doc.problem(path, "DeleteNone contradicts shutdownAfterJobFinishes: true.", "choose another policy or "
                        "set shutdownAfterJobFinishes: false") for path, policy in _legacy_policies(spec)
            if policy == "DeleteNone"]


def _deletion_rules(spec: dict) -> Iterator[tuple[str, dict, dict]]:
    if _legacy(spec) is None:
        for i, rule in enumerate(dig(spec, "deletionStrategy", "deletionRules", default=[])):
            yield f"spec.deletionStrategy.deletionRules[{i}]", rule, rule.get("condition") or {}


def check_deletion_condition(doc: Doc, spec: dict, gates: FeatureGates) -> list[Problem]:
    # validateDeletionCondition: exactly one of jobStatus/jobDeploymentStatus, TTL non-negative (the CRD says so first)
    out = []
    for path, rule, condition in _deletion_rules(spec):
        if ("jobStatus" in condition) == ("jobDeploymentStatus" in condition):
            out.append(doc.problem(f"{path}.condition", "needs exactly one of jobStatus and jobDeploymentStatus.",
                                   "keep one of the two"))
        if (condition.get("ttlSeconds") or 0) < 0:
            out.append(doc.problem(f"{path}.condition.ttlSeconds", "must not be negative.", "use 0 or more"))
    return out


def check_deletion_rule_policy(doc: Doc, spec: dict, gates: FeatureGates) -> list[Problem]:
    # validateDeletionRules: DeleteCluster/DeleteWorkers not with clusterSelector; DeleteWorkers not with autoscaling
    out = []
    for path, rule, condition in _deletion_rules(spec):
        policy = rule.get("policy")
        if _selector_mode(spec) and policy in DELETE_POLICIES_NEEDING_CLUSTER:
            out.append(doc.problem(f"{path}.policy", f"{policy} is not allowed with clusterSelector.",
                                   "use DeleteSelf or DeleteNone"))
        elif policy == "DeleteWorkers" and autoscaling_enabled(spec.get("rayClusterSpec")):
            out.append(doc.problem(f"{path}.policy", "DeleteWorkers does not work with autoscaling.",
                                   "use DeleteCluster, or turn autoscaling off"))
    return out


def _policy_refused(spec: dict, policy: Any) -> bool:
    """check_deletion_rule_policy refuses it; validateDeletionRules leaves such a rule out of the checks below."""
    return ((_selector_mode(spec) and policy in DELETE_POLICIES_NEEDING_CLUSTER)
            or (policy == "DeleteWorkers" and autoscaling_enabled(spec.get("rayClusterSpec"))))


def _grouped_rules(spec: dict) -> Iterator[tuple[int, tuple[str, Any], Any, int]]:
    """(index, (condition field, value), policy, ttlSeconds) for each rule validateDeletionRules groups."""
    for i, (_, rule, condition) in enumerate(_deletion_rules(spec)):
        one_status = ("jobStatus" in condition) != ("jobDeploymentStatus" in condition)
        if not one_status or _policy_refused(spec, rule.get("policy")):
            continue
        key = "jobStatus" if "jobStatus" in condition else "jobDeploymentStatus"
        yield i, (key, condition[key]), rule.get("policy"), condition.get("ttlSeconds") or 0


def check_deletion_rules_unique(doc: Doc, spec: dict, gates: FeatureGates) -> list[Problem]:
    # validateDeletionRules: one rule per (policy, jobStatus) and per (policy, jobDeploymentStatus)
    out = []
    seen: dict[tuple, int] = {}
    for i, (key, value), policy, _ in _grouped_rules(spec):
        first = seen.setdefault((key, value, policy), i)
        if first != i:
            out.append(doc.problem(f"spec.deletionStrategy.deletionRules[{i}]", f"duplicates deletionRules[{first}] "
                                   f"({policy} on {key} {value}).", "remove one of them"))
    return out


def check_deletion_rules_ttl_order(doc: Doc, spec: dict, gates: FeatureGates) -> list[Problem]:
    # validateTTLConsistency: for one condition, TTL of DeleteWorkers <= DeleteCluster <= DeleteSelf
    by_condition: dict[tuple[str, Any], dict[Any, tuple[int, int]]] = {}
    for i, condition, policy, ttl in _grouped_rules(spec):
        by_condition.setdefault(condition, {}).setdefault(policy, (i, ttl))
    out = []
    for (key, value), policies in by_condition.items():
        previous = None
        for policy in ("DeleteWorkers", "DeleteCluster", "DeleteSelf"):
            if policy not in policies:
                continue
            index, ttl = policies[policy]
            if previous and ttl < previous[1]:
                out.append(doc.problem(f"spec.deletionStrategy.deletionRules[{index}].condition.ttlSeconds",
                                       f"is {ttl} for {policy} on {key} {value}, below the {previous[1]} of "
                                       f"{previous[0]}: KubeRay deletes workers, then the cluster, then the RayJob.",
                                       f"give {policy} a ttlSeconds of {previous[1]} or more"))
            previous = (policy, ttl)
    return out


def check_job_has_cluster(doc: Doc, spec: dict, gates: FeatureGates) -> list[Problem]:
    # ValidateRayJobSpec: one of rayClusterSpec or clusterSelector must be set
    if not _selector_mode(spec) and spec.get("rayClusterSpec") is None:
        return [doc.problem("spec", "has neither rayClusterSpec nor clusterSelector.",
                            "embed a rayClusterSpec or select an existing cluster with clusterSelector")]
    return []


def check_job_selector_names_cluster(doc: Doc, spec: dict, gates: FeatureGates) -> list[Problem]:
    # ValidateRayJobSpec: cluster name in ClusterSelector should not be empty
    if _selector_mode(spec) and not spec["clusterSelector"].get("ray.io/cluster"):
        return [doc.problem("spec.clusterSelector", "has no 'ray.io/cluster' key naming the RayCluster.",
                            "set clusterSelector: {ray.io/cluster: <RayCluster name>}")]
    return []


def check_job_selector_no_suspend(doc: Doc, spec: dict, gates: FeatureGates) -> list[Problem]:
    # ValidateRayJobSpec: the ClusterSelector mode doesn't support the suspend operation
    if _selector_mode(spec) and spec.get("suspend"):
        return [doc.problem("spec.suspend", "clusterSelector mode does not support suspend.",
                            "remove suspend, or embed a rayClusterSpec")]
    return []


def check_job_selector_not_sidecar(doc: Doc, spec: dict, gates: FeatureGates) -> list[Problem]:
    # ValidateRayJobSpec: ClusterSelector is not supported in SidecarMode
    if _selector_mode(spec) and spec.get("submissionMode") == "SidecarMode":
        return [doc.problem("spec.submissionMode", "SidecarMode does not support clusterSelector.",
                            "use K8sJobMode or HTTPMode")]
    return []


def check_job_selector_no_backoff(doc: Doc, spec: dict, gates: FeatureGates) -> list[Problem]:
    # ValidateRayJobSpec: BackoffLimit is incompatible with ClusterSelector mode
    if _selector_mode(spec) and (spec.get("backoffLimit") or 0) > 0:
        return [doc.problem("spec.backoffLimit", f"is {spec['backoffLimit']}: a retry deletes and recreates the "
                            "cluster, which clusterSelector mode must not do (KubeRay rejects it).",
                            "remove backoffLimit, or use a RayJob with an embedded rayClusterSpec "
                            "(manifests/rayjob-standalone.yaml) for retries")]
    return []


def check_job_interactive_backoff(doc: Doc, spec: dict, gates: FeatureGates) -> list[Problem]:
    # ValidateRayJobSpec: InteractiveMode does not support backoffLimit > 0
    if spec.get("submissionMode") == "InteractiveMode" and (spec.get("backoffLimit") or 0) > 0:
        return [doc.problem("spec.backoffLimit", "is incompatible with InteractiveMode.", "remove backoffLimit")]
    return []


def check_job_sidecar_no_submitter(doc: Doc, spec: dict, gates: FeatureGates) -> list[Problem]:
    # ValidateRayJobSpec: SidecarMode doesn't support SubmitterPodTemplate or SubmitterConfig
    if spec.get("submissionMode") != "SidecarMode":
        return []
    return [doc.problem(f"spec.{key}", "is not supported in SidecarMode.", f"remove {key} or use K8sJobMode")
            for key in ("submitterPodTemplate", "submitterConfig") if spec.get(key) is not None]


def check_job_sidecar_head_restart_policy(doc: Doc, spec: dict, gates: FeatureGates) -> list[Problem]:
    # ValidateRayJobSpec: restartPolicy for the head Pod Never or unset in SidecarMode
    policy = dig(spec, "rayClusterSpec", "headGroupSpec", "template", "spec", "restartPolicy")
    if spec.get("submissionMode") == "SidecarMode" and policy not in (None, "", "Never"):
        return [doc.problem("spec.rayClusterSpec.headGroupSpec.template.spec.restartPolicy",
                            "must be Never or unset in SidecarMode.", "set restartPolicy: Never")]
    return []


def check_job_k8s_token_auth(doc: Doc, spec: dict, gates: FeatureGates) -> list[Problem]:
    # ValidateRayJobSpec: K8s token auth is not supported for a RayJob's cluster
    if dig(spec, "rayClusterSpec", "authOptions", "enableK8sTokenAuth"):
        return [doc.problem("spec.rayClusterSpec.authOptions.enableK8sTokenAuth", "is not supported for a RayJob's "
                            "cluster.", "remove enableK8sTokenAuth (authOptions.mode: token alone works)")]
    return []


def check_job_runtime_env_yaml(doc: Doc, spec: dict, gates: FeatureGates) -> list[Problem]:
    # ValidateRayJobSpec (dashboardclient.UnmarshalRuntimeEnvYAML): a YAML mapping
    runtime_env = spec.get("runtimeEnvYAML")
    if not runtime_env:
        return []
    try:
        parsed = yaml.safe_load(runtime_env)
        if parsed is not None and not isinstance(parsed, dict):
            raise yaml.YAMLError("not a mapping")
    except yaml.YAMLError as exc:
        return [doc.problem("spec.runtimeEnvYAML", f"is not a YAML mapping ({str(exc).splitlines()[0]}).",
                            "write it as a block string of key: value lines, e.g. 'working_dir: /etc/raytrain-job'")]
    return []


def check_job_deadlines_positive(doc: Doc, spec: dict, gates: FeatureGates) -> list[Problem]:
    # ValidateRayJobSpec: activeDeadlineSeconds and preRunningDeadlineSeconds must be positive integers
    return [doc.problem(f"spec.{key}", "must be a positive integer.", "use seconds > 0")
            for key in ("activeDeadlineSeconds", "preRunningDeadlineSeconds")
            if spec.get(key) is not None and spec[key] <= 0]


def check_job_backoff_not_negative(doc: Doc, spec: dict, gates: FeatureGates) -> list[Problem]:
    # ValidateRayJobSpec: backoffLimit must not be negative
    if spec.get("backoffLimit") is not None and spec["backoffLimit"] < 0:
        return [doc.problem("spec.backoffLimit", "must not be negative.", "use 0 or more")]
    return []


# raytrain is stricter: manifests KubeRay v1.7.0 admits that cannot work.


def check_job_submission_mode_known(doc: Doc, spec: dict, gates: FeatureGates) -> list[Problem]:
    # raytrain: KubeRay's CRD has no enum for submissionMode and the controller matches none of its paths
    mode = spec.get("submissionMode", "K8sJobMode")
    if mode not in SUBMISSION_MODES:
        return [doc.problem("spec.submissionMode", f"is {mode!r}, not one of {', '.join(SUBMISSION_MODES)}. KubeRay "
                            "would admit it, but no submission path of its controller matches it: the cluster comes "
                            "up and the job is never submitted.", "use K8sJobMode (the default)")]
    return []


def check_job_submitter_template(doc: Doc, spec: dict, gates: FeatureGates) -> list[Problem]:
    # raytrain: KubeRay admits these, but the Kubernetes API refuses the submitter Job KubeRay then creates from them
    submitter = spec.get("submitterPodTemplate")
    if not isinstance(submitter, dict) or spec.get("submissionMode", "K8sJobMode") != "K8sJobMode":
        return []
    out = []
    policy = dig(submitter, "spec", "restartPolicy")
    if policy not in (None, "Never", "OnFailure"):
        out.append(doc.problem("spec.submitterPodTemplate.spec.restartPolicy", f"is {policy}, but the submitter runs "
                               "as a Kubernetes Job, which allows only Never or OnFailure: KubeRay would admit the "
                               "RayJob and then fail to create its submitter.",
                               "use Never (KubeRay retries the submitter itself)"))
    for i, container in enumerate(dig(submitter, "spec", "containers", default=[])):
        if not container.get("image"):
            out.append(doc.problem(f"spec.submitterPodTemplate.spec.containers[{i}].image", "is missing; KubeRay "
                                   "would admit the RayJob, but it uses a submitterPodTemplate as given and the "
                                   "Kubernetes API refuses a Job container without an image.", "use the cluster's image"))
    return out


JOB_CHECKS: list[Callable[..., list[Problem]]] = [
    check_job_suspend_needs_shutdown, check_job_ttl_not_negative, check_job_ttl_needs_shutdown,
    check_deletion_strategy_gate, check_deletion_rules_without_shutdown, check_deletion_strategy_one_kind,
    check_legacy_policies_set, check_legacy_policy_cluster_selector, check_legacy_delete_workers_autoscaling,
    check_legacy_delete_none_with_shutdown, check_deletion_condition, check_deletion_rule_policy,
    check_deletion_rules_unique, check_deletion_rules_ttl_order, check_job_has_cluster,
    check_job_selector_names_cluster, check_job_selector_no_suspend, check_job_selector_not_sidecar,
    check_job_selector_no_backoff, check_job_interactive_backoff, check_job_sidecar_no_submitter,
    check_job_sidecar_head_restart_policy, check_job_k8s_token_auth, check_job_runtime_env_yaml,
    check_job_deadlines_positive, check_job_backoff_not_negative, check_job_submission_mode_known,
    check_job_submitter_template,
]


# ----------------------------------------------------------------------------------------------------------
# the CRDs' CEL rules (x-kubernetes-validations), evaluated with cel-python

# What to do when a rule fails; the CRD gives only the message.
CEL_FIXES = {
    "!((has(self.onSuccess) || has(self.onFailure)) && has(self.deletionRules))": "keep only deletionRules",
    "((has(self.onSuccess) && has(self.onFailure)) || has(self.deletionRules))":
        "add deletionRules (or both onSuccess and onFailure)",
    "!(has(self.jobStatus) && has(self.jobDeploymentStatus))": "keep exactly one of jobStatus and jobDeploymentStatus",
    "has(self.jobStatus) || has(self.jobDeploymentStatus)": "keep exactly one of jobStatus and jobDeploymentStatus",
    "self in ['ray.io/kuberay-operator', 'kueue.x-k8s.io/multikueue']":
        "remove managedBy (KubeRay manages the object), or set it to kueue.x-k8s.io/multikueue",
}


@functools.lru_cache(maxsize=64)
def _cel_program(expression: str) -> Any:
    env = _cel_environment()
    return env.program(env.compile(expression))


@functools.lru_cache(maxsize=1)
def _cel_environment() -> Any:
    import celpy  # only when a manifest has a field with a CEL rule: the parser takes ~0.2 s to build

    return celpy.Environment()


def _without_nulls(value: Any) -> Any:
    """The API server drops a null field before it validates: has(self.x) is false for `x: null`."""
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


def _cel_holds(expression: str, value: Any) -> bool:
    import celpy

    try:
        return bool(_cel_program(expression).evaluate({"self": celpy.json_to_cel(_without_nulls(value))}))
    except celpy.CELEvalError:
        return False  # the API server refuses an object its rule cannot evaluate


def _cel_rules(schema: dict, value: Any, path: str) -> Iterator[tuple[str, dict, Any]]:
    """(field path, rule, value) for each CEL rule on a field present in the object, as the API server applies
    them: a rule on an absent field does not run."""
    for rule in schema.get("x-kubernetes-validations") or []:
        if "oldSelf" not in rule.get("rule", ""):  # transition rules run only on update
            yield path, rule, value
    if isinstance(value, dict):
        properties = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        for key, item in value.items():
            child = properties.get(key) if key in properties else (extra if isinstance(extra, dict) else None)
            if child is not None and item is not None:
                yield from _cel_rules(child, item, f"{path}.{key}" if path else str(key))
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            yield from _cel_rules(schema["items"], item, f"{path}[{i}]")


def check_cel(doc: Doc, crd_dir: Path) -> list[Problem]:
    """The CEL rules of the KubeRay CRD for doc's kind (apiextensions: evaluated by the API server on create)."""
    schema = openapi_schema(str(crd_dir), doc.kind)
    out: list[Problem] = []
    for path, rule, value in _cel_rules(schema, doc.obj, ""):
        if not _cel_holds(rule["rule"], value):
            message = str(rule.get("message") or f"fails `{rule['rule']}`").rstrip(".")
            out.append(doc.problem(path, f"{message} (a CEL rule of the KubeRay CRD).",
                                   CEL_FIXES.get(rule["rule"], f"change it so that `{rule['rule']}` holds")))
    return out
