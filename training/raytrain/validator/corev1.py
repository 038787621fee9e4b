"""The API server's own rules for core objects beyond their OpenAPI schemas (kubernetes/kubernetes
pkg/apis/core/validation/validation.go, pkg/apis/apps/validation, pkg/apis/batch/validation): what
kubernetes-validate's schemas cannot say (ranges, uniqueness, names, requests against limits). The pod rules apply
to every pod template too: a RayCluster's groups and a RayJob's submitter, whose pods KubeRay creates and the API
server then refuses. Each check names the Kubernetes function it mirrors."""

from __future__ import annotations

from typing import Any

from raytrain.errors import shown
from raytrain.validator.apimachinery import (
    check_annotations,
    check_labels,
    check_object_meta,
    is_config_map_key,
    is_dns1123_label,
    is_port_name,
    is_port_number,
    is_qualified_name,
)
from raytrain.validator.problems import Doc, Problem
from raytrain.validator.quantity import QuantityError, parse_quantity

INT32_MAX = 2**31 - 1


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _not_negative(doc: Doc, value: Any, field: str, most: int = INT32_MAX) -> list[Problem]:
    # ValidateNonnegativeField; and the Go int32 the API server decodes these fields into (a larger number is refused
    # as it is read, "cannot unmarshal number ... of type int32")
    if _int(value) and value < 0:
        return [doc.problem(field, f"is {value}; it must be 0 or more.", "use 0 or more")]
    if _int(value) and value > most:
        return [doc.problem(field, f"is {value}, beyond a {most.bit_length() + 1}-bit integer: the API server refuses "
                            "it.", f"use a value from 0 to {most}")]
    return []


# ----------------------------------------------------------------------------------------------------------
# pods


def _dicts(value: Any) -> list[tuple[int, dict]]:
    return [(i, item) for i, item in enumerate(value) if isinstance(item, dict)] if isinstance(value, list) else []


def check_resources(doc: Doc, resources: Any, field: str) -> list[Problem]:
    # ValidateResourceRequirements: names qualified, quantities non-negative, requests <= limits
    if not isinstance(resources, dict):
        return []
    out: list[Problem] = []
    amounts: dict[str, dict[str, float]] = {}
    for part in ("limits", "requests"):
        for name, value in (resources.get(part) or {}).items():
            path = f"{field}.{part}.{name}"
            if not is_qualified_name(str(name)):
                out.append(doc.problem(path, f"{shown(name)} is not a valid resource name.",
                                       "use a name such as cpu, memory or nvidia.com/gpu"))
                continue
            try:
                amounts.setdefault(part, {})[name] = parse_quantity(value, path)
            except QuantityError as err:
                out.append(doc.problem(path, f"{shown(value)} {str(err).split(' ', 1)[1].split('. Fix: ')[0]}.",
                                       "write a quantity such as 500m, 2 or 4Gi, 0 or more"))
    limits, requests = amounts.get("limits", {}), amounts.get("requests", {})
    for name, request in requests.items():
        if name in limits and request > limits[name]:
            out.append(doc.problem(f"{field}.requests.{name}", f"{resources['requests'][name]} is more than the limit "
                                   f"{resources['limits'][name]}; a request must be at most its limit.",
                                   f"lower the request or raise limits.{name}"))
    return out


def check_handler(doc: Doc, handler: Any, field: str) -> list[Problem]:
    # validateHandler / validateLifecycle: exactly one action; exec needs a command
    if not isinstance(handler, dict):
        return []
    actions = [key for key in ("exec", "httpGet", "tcpSocket", "sleep", "grpc") if handler.get(key) is not None]
    if len(actions) != 1:
        return [doc.problem(field, f"has {'no action' if not actions else ' and '.join(actions)}; it needs exactly "
                            "one of exec, httpGet, tcpSocket or sleep.", "keep one action")]
    if actions == ["exec"] and not (handler["exec"] or {}).get("command"):
        return [doc.problem(f"{field}.exec.command", "is empty; an exec action needs a command.",
                            "give the command as a list, e.g. [sh, -c, '...']")]
    port = (handler.get("httpGet") or handler.get("tcpSocket") or {}).get("port")
    if _int(port) and not is_port_number(port):
        return [doc.problem(f"{field}.{actions[0]}.port", f"is {port}, not a port from 1 to 65535.",
                            "use a port from 1 to 65535")]
    return []


def check_security_context(doc: Doc, context: Any, field: str) -> list[Problem]:
    # ValidatePodSecurityContext / ValidateSecurityContext: ids 0..2^31-1; validateSeccompProfileField
    if not isinstance(context, dict):
        return []
    out = []
    for key in ("runAsUser", "runAsGroup", "fsGroup"):
        value = context.get(key)
        if _int(value) and not 0 <= value <= INT32_MAX:
            out.append(doc.problem(f"{field}.{key}", f"is {value}; it must be between 0 and {INT32_MAX}.",
                                   "use a user or group id of 0 or more"))
    profile = context.get("seccompProfile")
    if isinstance(profile, dict):
        kind = profile.get("type")
        if kind not in ("RuntimeDefault", "Unconfined", "Localhost"):
            out.append(doc.problem(f"{field}.seccompProfile.type", f"is {shown(kind)}, not RuntimeDefault, "
                                   "Unconfined or Localhost.", "use RuntimeDefault"))
        elif (kind == "Localhost") != bool(profile.get("localhostProfile")):
            out.append(doc.problem(f"{field}.seccompProfile.localhostProfile", "is set exactly when type is "
                                   "Localhost.", "set both, or neither"))
    return out


def check_container(doc: Doc, container: dict, field: str, volumes: set[str]) -> list[Problem]:
    # validateContainers / validateContainerCommon / validateContainersOnlyForPod
    out: list[Problem] = []
    name = container.get("name")
    if not isinstance(name, str) or not is_dns1123_label(name):
        out.append(doc.problem(f"{field}.name", f"{shown(name)} is not a DNS-1123 label.",
                               "use lower-case letters, digits and '-', at most 63 characters"))
    image = container.get("image")
    if not image:
        out.append(doc.problem(f"{field}.image", "is empty; the API server refuses a pod container without an image.",
                               "give the image, e.g. rayproject/ray:2.60.0"))
    elif isinstance(image, str) and any(ch.isspace() for ch in image):
        # The API server refuses leading or trailing whitespace; one inside is no image reference the kubelet pulls.
        out.append(doc.problem(f"{field}.image", f"{shown(image)} contains whitespace, which no image reference has.",
                               "remove the spaces"))
    port_names: set[str] = set()
    for i, port in _dicts(container.get("ports")):
        path = f"{field}.ports[{i}]"
        # validateContainerPorts
        if "containerPort" in port and not is_port_number(port["containerPort"]):
            out.append(doc.problem(f"{path}.containerPort", f"is {shown(port['containerPort'])}, not a port from 1 to "
                                   "65535.", "use a port from 1 to 65535"))
        if port.get("hostPort") not in (None, 0) and not is_port_number(port.get("hostPort")):
            out.append(doc.problem(f"{path}.hostPort", f"is {shown(port['hostPort'])}, not a port from 1 to 65535.",
                                   "use a port from 1 to 65535, or leave it out"))
        port_name = port.get("name")
        if port_name is not None:
            if not is_port_name(str(port_name)):
                out.append(doc.problem(f"{path}.name", f"{shown(port_name)} is not a port name (at most 15 lower-case "
                                       "letters, digits and '-', with a letter).", "use e.g. dashboard"))
            elif port_name in port_names:
                out.append(doc.problem(f"{path}.name", f"{shown(port_name)} names two ports of the container.",
                                       "give each port its own name"))
            port_names.add(str(port_name))
    out += check_resources(doc, container.get("resources"), f"{field}.resources")
    mount_paths: dict[str, int] = {}
    for i, mount in _dicts(container.get("volumeMounts")):
        # ValidateVolumeMounts: the volume exists; each mountPath once
        if mount.get("name") not in volumes:
            out.append(doc.problem(f"{field}.volumeMounts[{i}].name", f"{shown(mount.get('name'))} is not a volume of "
                                   "the pod.", "add the volume under spec.volumes, or mount one that is there"))
        path = mount.get("mountPath")
        if path in mount_paths:
            out.append(doc.problem(f"{field}.volumeMounts[{i}].mountPath", f"{shown(path)} is already mounted by "
                                   f"volumeMounts[{mount_paths[path]}].", "mount each path once"))
        mount_paths.setdefault(path, i)
    lifecycle = container.get("lifecycle") or {}
    if isinstance(lifecycle, dict):
        for hook in ("postStart", "preStop"):
            out += check_handler(doc, lifecycle.get(hook), f"{field}.lifecycle.{hook}")
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        out += check_handler(doc, container.get(probe), f"{field}.{probe}")
    out += check_security_context(doc, container.get("securityContext"), f"{field}.securityContext")
    return out


def check_tolerations(doc: Doc, tolerations: Any, field: str) -> list[Problem]:
    # validateTolerations
    out = []
    for i, toleration in _dicts(tolerations):
        path = f"{field}[{i}]"
        operator = toleration.get("operator") or "Equal"
        if operator not in ("Equal", "Exists"):
            out.append(doc.problem(f"{path}.operator", f"is {shown(operator)}, not Equal or Exists.",
                                   "use Equal (with a value) or Exists (without one)"))
        elif operator == "Exists" and toleration.get("value"):
            out.append(doc.problem(f"{path}.value", "must be empty when operator is Exists.", "remove the value"))
        if not toleration.get("key") and operator != "Exists":
            out.append(doc.problem(f"{path}.operator", "must be Exists when the key is empty.", "set operator: Exists"))
        effect = toleration.get("effect")
        if effect not in (None, "", "NoSchedule", "PreferNoSchedule", "NoExecute"):
            out.append(doc.problem(f"{path}.effect", f"is {shown(effect)}, not NoSchedule, PreferNoSchedule or "
                                   "NoExecute.", "use one of them, or leave it out"))
        if toleration.get("tolerationSeconds") is not None and effect != "NoExecute":
            out.append(doc.problem(f"{path}.tolerationSeconds", "is allowed only with effect NoExecute.",
                                   "set effect: NoExecute or remove tolerationSeconds"))
    return out


def check_pod_spec(doc: Doc, spec: Any, field: str) -> list[Problem]:
    """ValidatePodSpec: the rules its schema does not hold (validateVolumes, validateContainers, ...)."""
    if not isinstance(spec, dict):
        return []
    out: list[Problem] = []
    volumes: dict[str, int] = {}
    for i, volume in _dicts(spec.get("volumes")):
        # ValidateVolumes: names are DNS-1123 labels, each once
        name = volume.get("name")
        if not isinstance(name, str) or not is_dns1123_label(name):
            out.append(doc.problem(f"{field}.volumes[{i}].name", f"{shown(name)} is not a DNS-1123 label.",
                                   "use lower-case letters, digits and '-'"))
        elif name in volumes:
            out.append(doc.problem(f"{field}.volumes[{i}].name", f"'{name}' already names volumes[{volumes[name]}].",
                                   "give each volume its own name"))
        volumes.setdefault(str(name), i)
    seen: dict[str, str] = {}
    for part in ("initContainers", "containers"):
        for i, container in _dicts(spec.get(part)):
            path = f"{field}.{part}[{i}]"
            out += check_container(doc, container, path, set(volumes))
            name = container.get("name")
            if isinstance(name, str) and name in seen:
                out.append(doc.problem(f"{path}.name", f"'{name}' already names {seen[name]}.",
                                       "give each container of the pod its own name"))
            seen.setdefault(str(name), path.rsplit(".", 1)[1])
    out += check_security_context(doc, spec.get("securityContext"), f"{field}.securityContext")
    out += check_tolerations(doc, spec.get("tolerations"), f"{field}.tolerations")
    if spec.get("nodeSelector") is not None:
        out += check_labels(doc, spec["nodeSelector"], f"{field}.nodeSelector")
    return out


def check_pod_template(doc: Doc, template: Any, field: str) -> list[Problem]:
    # ValidatePodTemplateSpec: its labels and annotations, then its pod spec
    if not isinstance(template, dict):
        return []
    out: list[Problem] = []
    meta = template.get("metadata") or {}
    if isinstance(meta, dict) and meta.get("labels") is not None:
        out += check_labels(doc, meta["labels"], f"{field}.metadata.labels")
    if isinstance(meta, dict) and meta.get("annotations") is not None:
        out += check_annotations(doc, meta["annotations"], f"{field}.metadata.annotations")
    return out + check_pod_spec(doc, template.get("spec"), f"{field}.spec")


# ----------------------------------------------------------------------------------------------------------
# objects

WORKLOADS = ("Deployment", "ReplicaSet", "StatefulSet", "DaemonSet", "Job", "ReplicationController")


def check_workload(doc: Doc) -> list[Problem]:
    # apps ValidateDeploymentSpec / ValidateStatefulSetSpec / ValidateReplicaSetSpec; batch ValidateJobSpec
    spec = doc.obj.get("spec") or {}
    out: list[Problem] = []
    for key in ("replicas", "minReadySeconds", "revisionHistoryLimit", "parallelism", "completions",
                "backoffLimit", "activeDeadlineSeconds", "ttlSecondsAfterFinished", "progressDeadlineSeconds"):
        out += _not_negative(doc, spec.get(key), f"spec.{key}",
                             2**63 - 1 if key == "activeDeadlineSeconds" else INT32_MAX)  # batch's one int64
    template = spec.get("template")
    if doc.kind == "CronJob":
        template = ((spec.get("jobTemplate") or {}).get("spec") or {}).get("template")
        field = "spec.jobTemplate.spec.template"
    else:
        field = "spec.template"
    return out + check_pod_template(doc, template, field)


def check_service(doc: Doc) -> list[Problem]:
    # ValidateService: ports 1-65535, targetPort a port or a port name, names unique when there are several
    spec = doc.obj.get("spec") or {}
    out: list[Problem] = []
    ports = _dicts(spec.get("ports"))
    names: dict[Any, int] = {}
    for i, port in ports:
        path = f"spec.ports[{i}]"
        if not is_port_number(port.get("port")):
            out.append(doc.problem(f"{path}.port", f"is {shown(port.get('port'))}, not a port from 1 to 65535.",
                                   "use a port from 1 to 65535"))
        target = port.get("targetPort")
        if _int(target) and not is_port_number(target):
            out.append(doc.problem(f"{path}.targetPort", f"is {target}, not a port from 1 to 65535.",
                                   "use a port from 1 to 65535, or a container port's name"))
        if port.get("nodePort") not in (None, 0) and not is_port_number(port.get("nodePort")):
            out.append(doc.problem(f"{path}.nodePort", f"is {shown(port.get('nodePort'))}, not a port.",
                                   "leave it out: Kubernetes picks one"))
        if len(ports) > 1 and not port.get("name"):
            out.append(doc.problem(f"{path}.name", "is required when a Service has several ports.", "name each port"))
        elif port.get("name") in names:
            out.append(doc.problem(f"{path}.name", f"{shown(port.get('name'))} already names "
                                   f"spec.ports[{names[port.get('name')]}].", "give each port its own name"))
        names.setdefault(port.get("name"), i)
    if spec.get("selector") is not None:
        out += check_labels(doc, spec["selector"], "spec.selector")
    return out


def check_config_map(doc: Doc) -> list[Problem]:
    # ValidateConfigMap (and ValidateSecret): keys are IsConfigMapKey, none in both data and binaryData
    out: list[Problem] = []
    keys: dict[str, str] = {}
    for part in ("data", "binaryData", "stringData"):
        for key in doc.obj.get(part) or {}:
            if not isinstance(key, str) or not is_config_map_key(key):
                out.append(doc.problem(f"{part}", f"key {shown(key)} is not a valid {doc.kind} key.",
                                       "use letters, digits, '-', '_' and '.' (a file name), at most 253 characters"))
            elif key in keys and not (doc.kind == "Secret" and {keys[key], part} == {"data", "stringData"}):
                out.append(doc.problem(f"{part}.{key}", f"is also a key of {keys[key]}.", "keep it in one of them"))
            keys.setdefault(str(key), part)
    return out


OBJECT_CHECKS = {"Pod": lambda doc: check_pod_spec(doc, doc.obj.get("spec"), "spec"),
                 "PodTemplate": lambda doc: check_pod_template(doc, doc.obj.get("template"), "template"),
                 "Service": check_service, "ConfigMap": check_config_map, "Secret": check_config_map,
                 "CronJob": check_workload, **{kind: check_workload for kind in WORKLOADS}}


def check_core_object(doc: Doc) -> list[Problem]:
    """A core object whose schema held: its metadata, then its kind's own rules."""
    return check_object_meta(doc, custom=False) + OBJECT_CHECKS.get(doc.kind, lambda _: [])(doc)
