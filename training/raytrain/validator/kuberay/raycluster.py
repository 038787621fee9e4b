"""KubeRay v1.7.0's rules for a RayCluster spec (utils/validation.go ValidateRayClusterSpec and
ValidateRayClusterUpgradeOptions), also applied to the rayClusterSpec a RayJob embeds."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from raytrain.errors import shown
from raytrain.validator.apimachinery import LABEL_FIX, is_dns1123_label, is_label_value, is_qualified_name
from raytrain.validator.kuberay.common import (
    autoscaler_v2,
    containers_of,
    env_by_name,
    env_true,
    head_container,
    head_env_path,
    v2_or_env,
    version_floor,
    worker_groups,
)
from raytrain.validator.kuberay.gates import FeatureGates, gate_off
from raytrain.validator.kuberay.faulttolerance import (
    check_ft_annotation_with_options, check_redis_address_without_ft, check_ft_options_conflicts,
    check_rocksdb_gate, check_rocksdb_no_redis_fields, check_rocksdb_claim_alone, check_rocksdb_managed_head,
    check_redis_backend_no_storage, check_redis_username,
)
from raytrain.validator.quantity import QuantityError, parse_quantity
from raytrain.validator.shape import autoscaling_enabled, groups
from raytrain.validator.shape import get as dig

if TYPE_CHECKING:
    from raytrain.validator.problems import Doc, Problem


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
    if not containers_of(spec.get("headGroupSpec") or {}):
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
            for path, name, group in worker_groups(spec, prefix) if not containers_of(group)]


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
            if not is_qualified_name(str(key)):
                out.append(doc.problem(f"{path}.labels", f"key '{key}' of group {name} is not a valid label key.",
                                       "use [prefix/]name: a name of at most 63 letters, digits, '-', '_' or '.', "
                                       "starting and ending with a letter or digit"))
            if not is_label_value(str(value)):
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
            for path, name, group in worker_groups(spec, prefix)
            if group.get("minReplicas") is None or group.get("maxReplicas") is None]


def check_worker_replicas_not_negative(doc: Doc, spec: dict, prefix: str, annotations: Mapping[str, Any],
                                       gates: FeatureGates) -> list[Problem]:
    # ValidateRayClusterSpec: negative minReplicas / maxReplicas
    return [doc.problem(f"{path}.{key}", f"is {group[key]} (negative) in worker group {name}.", "use 0 or more")
            for path, name, group in worker_groups(spec, prefix) for key in ("minReplicas", "maxReplicas")
            if isinstance(group.get(key), int) and group[key] < 0]


def check_worker_min_not_above_max(doc: Doc, spec: dict, prefix: str, annotations: Mapping[str, Any],
                                   gates: FeatureGates) -> list[Problem]:
    # ValidateRayClusterSpec: minReplicas greater than maxReplicas
    out = []
    for path, name, group in worker_groups(spec, prefix):
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
    for path, name, group in worker_groups(spec, prefix):
        timeout = group.get("idleTimeoutSeconds")
        if timeout is None:
            continue
        if timeout < 0:
            out.append(doc.problem(f"{path}.idleTimeoutSeconds", f"is {timeout} in worker group {name}; it must not "
                                   "be negative.", "use 0 or more seconds"))
        elif not v2_or_env(spec):
            out.append(_needs_autoscaler_v2(doc, f"{path}.idleTimeoutSeconds", name, prefix))
    return out


def check_worker_priority(doc: Doc, spec: dict, prefix: str, annotations: Mapping[str, Any],
                          gates: FeatureGates) -> list[Problem]:
    # validateWorkerGroupPriority: Ray 2.56.0 or later, and autoscaler v2
    out = []
    for path, name, group in worker_groups(spec, prefix):
        priority = group.get("priority")
        if not priority:
            continue
        floor = version_floor(doc, spec, prefix, f"{path}.priority", "2.56.0")
        out += floor
        if not floor and not v2_or_env(spec):
            out.append(_needs_autoscaler_v2(doc, f"{path}.priority", name, prefix))
    return out


# ----------------------------------------------------------------------------------------------------------
# ValidateRayClusterSpec: suspend and the autoscaler


def check_worker_suspend_gate(doc: Doc, spec: dict, prefix: str, annotations: Mapping[str, Any],
                              gates: FeatureGates) -> list[Problem]:
    # ValidateRayClusterSpec: a worker group can be suspended only with the RayJobDeletionPolicy gate
    if gates.enabled("RayJobDeletionPolicy"):
        return []
    return [gate_off(doc, f"{path}.suspend", "RayJobDeletionPolicy", f"suspending worker group {name}")
            for path, name, group in worker_groups(spec, prefix) if group.get("suspend")]


def check_v2_env_without_autoscaling(doc: Doc, spec: dict, prefix: str, annotations: Mapping[str, Any],
                                     gates: FeatureGates) -> list[Problem]:
    # ValidateRayClusterSpec: RAY_enable_autoscaler_v2 "1"/"true" with enableInTreeAutoscaling false
    if not autoscaling_enabled(spec) and env_true(head_container(spec).get("env"), "RAY_enable_autoscaler_v2"):
        return [doc.problem(head_env_path(prefix), "RAY_enable_autoscaler_v2 is on but enableInTreeAutoscaling is "
                            "not true.", "set enableInTreeAutoscaling: true, or remove the variable")]
    return []


def check_worker_suspend_with_autoscaling(doc: Doc, spec: dict, prefix: str, annotations: Mapping[str, Any],
                                          gates: FeatureGates) -> list[Problem]:
    # ValidateRayClusterSpec: a worker group cannot be suspended with the autoscaler on
    if not autoscaling_enabled(spec):
        return []
    return [doc.problem(f"{path}.suspend", f"worker group {name} cannot be suspended with the autoscaler on.",
                        "remove suspend or set enableInTreeAutoscaling: false")
            for path, name, group in worker_groups(spec, prefix) if group.get("suspend")]


def check_autoscaler_version_and_env(doc: Doc, spec: dict, prefix: str, annotations: Mapping[str, Any],
                                     gates: FeatureGates) -> list[Problem]:
    # ValidateRayClusterSpec: both autoscalerOptions.version and RAY_enable_autoscaler_v2
    if (autoscaling_enabled(spec) and dig(spec, "autoscalerOptions", "version") is not None
            and "RAY_enable_autoscaler_v2" in env_by_name(head_container(spec).get("env"))):
        return [doc.problem(head_env_path(prefix), "RAY_enable_autoscaler_v2 is set together with "
                            "autoscalerOptions.version.", "remove the variable and keep autoscalerOptions.version")]
    return []


def check_autoscaler_v2_restart_policy(doc: Doc, spec: dict, prefix: str, annotations: Mapping[str, Any],
                                       gates: FeatureGates) -> list[Problem]:
    # ValidateRayClusterSpec: restartPolicy Never or unset for every pod with autoscaler v2
    if not (autoscaling_enabled(spec) and autoscaler_v2(spec)):
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
    if "KUBERAY_GEN_AUTOSCALER_START_CMD" in env_by_name(dig(spec, "autoscalerOptions", "env")):
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
    return [gate_off(doc, f"{prefix}.{field}", gate, field) for field, gate in FIELD_GATES.items()
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
            for path, name, group in groups(spec, prefix) for i, container in enumerate(containers_of(group))
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
    env = env_by_name(options.get("env"))
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
    return version_floor(doc, spec, prefix, "authOptions.mode: token", "2.52.0")


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
    if version_floor(doc, spec, prefix, "authOptions.mode: token", "2.52.0"):
        return []  # check_auth_token_ray_version says it
    return version_floor(doc, spec, prefix, "authOptions.enableK8sTokenAuth", "2.55.0")


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
    for path, name, group in worker_groups(spec, prefix):
        names.add(group.get("groupName"))
        if not is_dns1123_label(str(group.get("groupName", ""))):
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
    places = [(f"{path}.template.spec.containers[0]", containers_of(group)[0], f"group {name}")
              for path, name, group in groups(spec, prefix) if containers_of(group)]
    places.append((f"{prefix}.autoscalerOptions", spec.get("autoscalerOptions") or {}, "the autoscaler"))
    for path, holder, who in places:
        env = env_by_name(holder.get("env"))
        for var in TLS_MANAGED_ENV:
            if var in env:
                out.append(doc.problem(f"{path}.env", f"{var} is managed by KubeRay when tlsOptions is enabled "
                                       f"({who}).", f"remove {var}"))
        for i, mount in enumerate(holder.get("volumeMounts") or []):
            if mount.get("name") == TLS_VOLUME or mount.get("mountPath") == TLS_MOUNT_PATH:
                out.append(doc.problem(f"{path}.volumeMounts[{i}]", f"the mount named {TLS_VOLUME} at {TLS_MOUNT_PATH} "
                                       f"is managed by KubeRay when tlsOptions is enabled ({who}).", "remove this mount"))
    return out


# ----------------------------------------------------------------------------------------------------------
# raytrain is stricter: specs KubeRay admits whose pods or Ray nodes then fail


def check_group_name_is_label_value(doc: Doc, spec: dict, prefix: str, annotations: Mapping[str, Any],
                                    gates: FeatureGates) -> list[Problem]:
    # raytrain: KubeRay labels each pod ray.io/group=<groupName>; the API server refuses the pods (IsValidLabelValue)
    return [doc.problem(f"{path}.groupName", f"{shown(group.get('groupName'))} is not a valid label value: KubeRay "
                        "would admit it, but it labels the group's pods ray.io/group=<groupName> and the API server "
                        "refuses those pods.", LABEL_FIX)
            for path, _, group in worker_groups(spec, prefix)
            if not (isinstance(group.get("groupName"), str) and is_label_value(group["groupName"]))]


def check_ray_start_numbers(doc: Doc, spec: dict, prefix: str, annotations: Mapping[str, Any],
                            gates: FeatureGates) -> list[Problem]:
    # raytrain: KubeRay passes rayStartParams to `ray start` as given; ray start refuses a count that is no number
    out = []
    for path, name, group in groups(spec, prefix):
        params = group.get("rayStartParams") or {}
        for key in ("num-cpus", "num-gpus", "memory"):
            if key in params:
                try:
                    parse_quantity(params[key], f"{path}.rayStartParams.{key}")
                except QuantityError:
                    out.append(doc.problem(f"{path}.rayStartParams.{key}", f"{shown(params[key])} is not a number: "
                                           f"KubeRay would admit it, but `ray start --{key}` on the group {name}'s "
                                           "pods refuses it and the pods never join.", "write a number, e.g. '4'"))
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
    check_tls_managed, check_group_name_is_label_value, check_ray_start_numbers,
]


