"""Kubernetes' own field rules that every object meets, whoever checks it (the API server for core objects, KubeRay's
rules for its names and labels): k8s.io/apimachinery pkg/util/validation/validation.go (names, label keys and
values, ConfigMap keys, ports) and pkg/api/validation/objectmeta.go (ValidateObjectMeta). One copy, shared by the
core-object checks (core.py) and KubeRay's (kuberay/)."""

from __future__ import annotations

import re
from typing import Any

from raytrain.errors import shown
from raytrain.validator.problems import Doc, Problem

# k8s.io/apimachinery/pkg/util/validation
DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
CONFIG_MAP_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")
IANA_SVC_NAME = re.compile(r"^[-a-z0-9]*[a-z]+[-a-z0-9]*$")

LABEL_FIX = "use at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit"
KEY_FIX = ("use [prefix/]name: a name of at most 63 letters, digits, '-', '_' or '.', starting and ending with a "
           "letter or digit; the prefix a DNS subdomain")


def is_dns1123_label(name: str) -> bool:
    # validation.IsDNS1123Label
    return len(name) <= 63 and bool(DNS1123_LABEL.match(name))


def is_dns1035_label(name: str) -> bool:
    # validation.IsDNS1035Label
    return len(name) <= 63 and bool(DNS1035.match(name))


def is_dns1123_subdomain(name: str) -> bool:
    # validation.IsDNS1123Subdomain
    return len(name) <= 253 and bool(DNS1123_SUBDOMAIN.match(name))


def is_qualified_name(key: str) -> bool:
    # validation.IsQualifiedName: [prefix/]name, prefix a DNS-1123 subdomain
    prefix, sep, name = key.rpartition("/")
    if sep and not (prefix and is_dns1123_subdomain(prefix)):
        return False
    return 0 < len(name) <= 63 and bool(QUALIFIED_NAME.match(name))


def is_label_value(value: str) -> bool:
    # validation.IsValidLabelValue
    return len(value) <= 63 and bool(LABEL_VALUE.match(value))


def is_config_map_key(key: str) -> bool:
    # validation.IsConfigMapKey
    return (0 < len(key) <= 253 and bool(CONFIG_MAP_KEY.match(key)) and key not in (".", "..")
            and not key.startswith(".."))


def is_port_number(value: Any) -> bool:
    # validation.IsValidPortNum
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 65535


def is_port_name(value: str) -> bool:
    # validation.IsValidPortName (an IANA service name)
    return (0 < len(value) <= 15 and bool(IANA_SVC_NAME.match(value)) and "--" not in value
            and not value.startswith("-") and not value.endswith("-"))


# pkg/api/validation/objectmeta.go
OBJECT_META_FIELDS = ("annotations", "creationTimestamp", "deletionGracePeriodSeconds", "deletionTimestamp",
                      "finalizers", "generateName", "generation", "labels", "managedFields", "name", "namespace",
                      "ownerReferences", "resourceVersion", "selfLink", "uid")
TOTAL_ANNOTATION_SIZE = 256 * 1024  # ValidateAnnotationsSize


def check_labels(doc: Doc, labels: Any, field: str) -> list[Problem]:
    # ValidateLabels: keys are qualified names, values label values
    if not isinstance(labels, dict):
        return [doc.problem(field, "is not a mapping of label keys to values.", "write it as key: value lines")]
    out = []
    for key, value in labels.items():
        if not isinstance(key, str) or not is_qualified_name(key):
            out.append(doc.problem(field, f"key {shown(key)} is not a valid label key.", KEY_FIX))
        if not isinstance(value, str):
            out.append(doc.problem(f"{field}.{key}", f"is {shown(value)}, not a string.", "quote the value"))
        elif not is_label_value(value):
            out.append(doc.problem(f"{field}.{key}", f"{shown(value)} is not a valid label value.",
                                   LABEL_FIX + " (or an empty string)"))
    return out


def check_annotations(doc: Doc, annotations: Any, field: str) -> list[Problem]:
    # ValidateAnnotations: keys are qualified names (lower-cased), the total size at most 256 KiB
    if not isinstance(annotations, dict):
        return [doc.problem(field, "is not a mapping of annotation keys to values.", "write it as key: value lines")]
    out = []
    for key, value in annotations.items():
        if not isinstance(key, str) or not is_qualified_name(key.lower()):
            out.append(doc.problem(field, f"key {shown(key)} is not a valid annotation key.", KEY_FIX))
        if not isinstance(value, str):
            out.append(doc.problem(f"{field}.{key}", f"is {shown(value)}, not a string.", "quote the value"))
    # Go's len(): bytes of UTF-8, not characters (100 Ki of 'é' is 200 KiB)
    size = sum(len(str(k).encode("utf-8", "surrogatepass")) + len(str(v).encode("utf-8", "surrogatepass"))
               for k, v in annotations.items())
    if size > TOTAL_ANNOTATION_SIZE:
        out.append(doc.problem(field, f"total {size} bytes, above Kubernetes' {TOTAL_ANNOTATION_SIZE} (256 KiB).",
                               "move large data to a ConfigMap"))
    return out


# Which names a kind takes (the nameFn its ValidateXxx passes to ValidateObjectMeta); the others: DNS subdomains.
NAME_RULES = {"Service": ("a DNS-1035 label", is_dns1035_label), "Namespace": ("a DNS-1123 label", is_dns1123_label)}


def check_object_meta(doc: Doc, custom: bool) -> list[Problem]:
    """ValidateObjectMeta: name, generateName, namespace, labels, annotations. custom (a RayCluster, a RayJob): unknown
    fields too (the CRD's schema leaves metadata to the API server; a core schema checks them itself), and no name
    rule (KubeRay's stricter one is in kuberay/names.py)."""
    meta = doc.obj.get("metadata") or {}
    out: list[Problem] = []
    if custom:
        for key in meta:
            if key not in OBJECT_META_FIELDS:
                out.append(doc.problem(f"metadata.{key}", f"unknown field {shown(key)}.",
                                       f"remove it; allowed here: {', '.join(OBJECT_META_FIELDS)}"))
    what, valid = NAME_RULES.get(doc.kind, ("a DNS subdomain", is_dns1123_subdomain))
    for key in () if custom else ("name", "generateName"):
        value = meta.get(key)
        if value is None:
            continue
        if not isinstance(value, str):
            out.append(doc.problem(f"metadata.{key}", f"is {shown(value)}, not a string.", "quote it"))
            continue
        # generateName: a prefix; the API server checks it with a trailing character, as the name it becomes
        name = value + "x" if key == "generateName" and value.endswith("-") else value
        if value and not valid(name):
            out.append(doc.problem(f"metadata.{key}", f"{shown(value)} is not {what}.",
                                   "use lower-case letters, digits and '-'" + (", and '.'" if "subdomain" in what
                                                                                else "")
                                   + f", at most {253 if 'subdomain' in what else 63} characters"))
    namespace = meta.get("namespace")
    if namespace is not None and not (isinstance(namespace, str) and is_dns1123_label(namespace)):
        out.append(doc.problem("metadata.namespace", f"{shown(namespace)} is not a DNS-1123 label.",
                               "use lower-case letters, digits and '-', at most 63 characters"))
    if meta.get("labels") is not None:
        out += check_labels(doc, meta["labels"], "metadata.labels")
    if meta.get("annotations") is not None:
        out += check_annotations(doc, meta["annotations"], "metadata.annotations")
    return out
