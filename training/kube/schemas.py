"""Where the KubeRay CRDs live and how their OpenAPI schemas become JSON-schema validators.

The directory is always a parameter; only the CLI reads RAYTRAIN_KUBERAY_CRDS.
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

import jsonschema
import yaml

KUBERAY_VERSION = "v1.7.0"
CRD_FILES = {"RayCluster": "ray.io_rayclusters.yaml", "RayJob": "ray.io_rayjobs.yaml"}


def repo_root() -> Path:
    return Path(__file__).resolve().parents[2]


def default_crd_dir() -> Path:
    """<repo>/../shared/kuberay-crds-v1.7.0: where the KubeRay v1.7.0 CRDs sit beside every checkout."""
    return repo_root().parent / "shared" / f"kuberay-crds-{KUBERAY_VERSION}"


class CRDError(Exception):
    """The CRD directory or file is missing or unreadable; the message says where to get the files."""


def _to_jsonschema(node: Any) -> Any:
    """OpenAPI v3 (structural, as the API server applies it) -> JSON schema.

    - x-kubernetes-int-or-string: integer or string.
    - nullable: null allowed too.
    - objects with properties and no additionalProperties reject unknown fields (kubectl's default
      strict field validation does), unless x-kubernetes-preserve-unknown-fields.
    - x-kubernetes-validations (CEL) are left to kuberay_rules.check_cel.
    """
    if isinstance(node, list):
        return [_to_jsonschema(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {k: _to_jsonschema(v) for k, v in node.items() if not k.startswith("x-kubernetes-") and k != "format"}
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    out.pop("nullable", None)
    if ("properties" in out and "additionalProperties" not in out
            and not node.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


@functools.lru_cache(maxsize=8)
def _load_crd(path: str) -> dict[str, Any]:
    try:
        # The CRDs are 1-2 MB: the C loader keeps this well under a second, and lru_cache makes it once.
        return yaml.load(Path(path).read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except OSError as exc:
        raise CRDError(
            f"cannot read KubeRay CRD {path}: {exc.strerror}. Get the {KUBERAY_VERSION} CRDs from "
            f"https://github.com/ray-project/kuberay/tree/{KUBERAY_VERSION}/ray-operator/config/crd/bases "
            f"and point --crds (or RAYTRAIN_KUBERAY_CRDS) at their directory") from exc


@functools.lru_cache(maxsize=8)
def crd_validator(crd_dir: str, kind: str, api_version: str = "ray.io/v1") -> jsonschema.protocols.Validator:
    """A cached JSON-schema validator for a KubeRay kind and version from the CRD in crd_dir."""
    crd = _load_crd(str(Path(crd_dir) / CRD_FILES[kind]))
    group, _, version = api_version.partition("/")
    if crd.get("spec", {}).get("group") != group:
        raise CRDError(f"{crd_dir}/{CRD_FILES[kind]} is not the {group} CRD for {kind}")
    for served in crd["spec"]["versions"]:
        if served["name"] == version:
            schema = _to_jsonschema(copy.deepcopy(served["schema"]["openAPIV3Schema"]))
            # metadata is checked by the rules (DNS-1035 names); status is written by the operator.
            schema["properties"]["metadata"] = {"type": "object"}
            schema["properties"].pop("status", None)
            return jsonschema.Draft7Validator(schema)
    raise CRDError(f"{crd_dir}/{CRD_FILES[kind]} serves no version {version!r} of {kind}")


def crd_served_versions(crd_dir: str, kind: str) -> list[str]:
    crd = _load_crd(str(Path(crd_dir) / CRD_FILES[kind]))
    return [v["name"] for v in crd["spec"]["versions"] if v.get("served")]


def crd_openapi_schema(crd_dir: str, kind: str, version: str = "v1") -> dict[str, Any]:
    """The CRD's openAPIV3Schema for a version, as written (with its x-kubernetes-validations CEL rules)."""
    crd = _load_crd(str(Path(crd_dir) / CRD_FILES[kind]))
    for served in crd["spec"]["versions"]:
        if served["name"] == version:
            return served["schema"]["openAPIV3Schema"]
    raise CRDError(f"{crd_dir}/{CRD_FILES[kind]} serves no version {version!r} of {kind}")
