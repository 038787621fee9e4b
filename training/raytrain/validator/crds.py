"""The KubeRay v1.7.0 CRDs: where they are found (or fetched), how they load, and how their OpenAPI schemas
become JSON-schema validators and defaulters.

Where, in this order (as kubeconform resolves its schemas): `--crds DIR`, then $RAYTRAIN_KUBERAY_CRDS (both read
by the CLI and passed in here), then the user cache ${XDG_CACHE_HOME:-~/.cache}/raytrain/kuberay-crds-v1.7.0/,
else the two files are downloaded from KubeRay's v1.7.0 tag, checked against the sha256 below, into that cache.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import hashlib
import json
import os
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from raytrain.errors import UsageError
from raytrain.rundir.atomicfile import write_atomic

KUBERAY_VERSION = "v1.7.0"
CRD_FILES = {"RayCluster": "ray.io_rayclusters.yaml", "RayJob": "ray.io_rayjobs.yaml"}
# The files at the tag (ray-operator/config/crd/bases); a download that does not match is refused.
CRD_SHA256 = {
    "ray.io_rayclusters.yaml": "c44704442eef0c6721ad40c1d66782c8bd3fdab9d3344306a5820910a679baa1",
    "ray.io_rayjobs.yaml": "01a5cf3b17c1769fda44af7e82debcd98722f0c27b9ab84d084681c6649121f5",
}
RELEASE_URL = f"https://raw.githubusercontent.com/ray-project/kuberay/{KUBERAY_VERSION}/ray-operator/config/crd/bases"
CRDS_ENV = "RAYTRAIN_KUBERAY_CRDS"


class CRDError(UsageError):
    """The CRDs cannot be found, fetched or read; the message is one paragraph saying how to stage them."""


def cache_dir(env: Mapping[str, str] | None = None) -> Path:
    """${XDG_CACHE_HOME:-~/.cache}/raytrain/kuberay-crds-v1.7.0."""
    env = os.environ if env is None else env
    root = env.get("XDG_CACHE_HOME") or str(Path(env.get("HOME") or Path.home()) / ".cache")
    return Path(root) / "raytrain" / f"kuberay-crds-{KUBERAY_VERSION}"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _complete(directory: Path, check_sha: bool) -> bool:
    files = [directory / name for name in CRD_FILES.values()]
    if not all(f.is_file() for f in files):
        return False
    return not check_sha or all(_sha256(f) == CRD_SHA256[f.name] for f in files)


def _staging_help(cache: Path, cause: str) -> str:
    return (f"the KubeRay {KUBERAY_VERSION} CRDs are needed to check RayCluster and RayJob objects, and {cause}. "
            f"Fix: on a machine with internet, download {', '.join(CRD_FILES.values())} from {RELEASE_URL}/ and "
            f"put them in {cache} (or any directory, then pass --crds DIR or set {CRDS_ENV}=DIR); "
            "`raytrain validate` on a machine with internet fetches them into that cache by itself.")


def download_crds(dest: Path, base_url: str = RELEASE_URL, timeout: float = 30.0) -> Path:
    """Fetch the pinned CRD files into dest, each checked against CRD_SHA256 before it is put in place."""
    for name, digest in CRD_SHA256.items():
        url = f"{base_url.rstrip('/')}/{name}"
        try:
            with urllib.request.urlopen(url, timeout=timeout) as response:
                body = response.read()
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise CRDError(_staging_help(dest, f"downloading {url} failed ({reason})")) from None
        got = hashlib.sha256(body).hexdigest()
        if got != digest:
            raise CRDError(f"{url} is not KubeRay's {KUBERAY_VERSION} {name}: its sha256 is {got}, expected {digest}. "
                           f"Nothing was written to {dest}. Fix: check for a proxy that rewrites downloads, or stage "
                           f"the files by hand from {RELEASE_URL}/ (--crds DIR)")
        dest.mkdir(parents=True, exist_ok=True)
        write_atomic(dest / name, body)
    return dest


def resolve_crd_dir(explicit: str | None = None, from_env: str | None = None, *,
                    env: Mapping[str, str] | None = None, base_url: str = RELEASE_URL) -> Path:
    """The directory holding the CRDs: explicit (--crds), else from_env ($RAYTRAIN_KUBERAY_CRDS), else the user
    cache, downloading into it when it is not complete. `base_url` is where the download comes from (tests serve
    the files locally). CRDError with one paragraph when none of these works."""
    for given, what in ((explicit, "--crds"), (from_env, CRDS_ENV)):
        if given:
            directory = Path(given).expanduser()
            if not _complete(directory, check_sha=False):
                raise CRDError(f"{what} {directory} does not hold {' and '.join(CRD_FILES.values())}. "
                               + _staging_help(cache_dir(env), f"{what} names a directory without them"))
            return directory
    cache = cache_dir(env)
    if _complete(cache, check_sha=True):
        return cache
    return download_crds(cache, base_url)


# ----------------------------------------------------------------------------------------------------------
# schemas


INT_FORMAT_BOUNDS = {"int32": (-2**31, 2**31 - 1), "int64": (-2**63, 2**63 - 1)}


def _to_jsonschema(node: Any) -> Any:
    """OpenAPI v3 (structural, as the API server applies it) -> JSON schema.

    - x-kubernetes-int-or-string: integer or string.
    - nullable: null allowed too.
    - objects with properties and no additionalProperties reject unknown fields (kubectl's default
      strict field validation does), unless x-kubernetes-preserve-unknown-fields.
    - x-kubernetes-validations (CEL) are left to the rules.
    """
    if isinstance(node, list):
        return [_to_jsonschema(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {k: _to_jsonschema(v) for k, v in node.items() if not k.startswith("x-kubernetes-") and k != "format"}
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    # The API server checks an integer field's format (kube-openapi's IsValueValidAgainstRange): a value beyond
    # int32 in `replicas` (format: int32) is refused, not wrapped.
    bounds = INT_FORMAT_BOUNDS.get(node.get("format")) if node.get("type") == "integer" else None
    if bounds:
        out["minimum"] = max(out.get("minimum", bounds[0]), bounds[0])
        out["maximum"] = min(out.get("maximum", bounds[1]), bounds[1])
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    out.pop("nullable", None)
    if ("properties" in out and "additionalProperties" not in out
            and not node.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


def apply_defaults(obj: Any, schema: Mapping[str, Any]) -> Any:
    """obj with the schema's `default`s filled in where a field is absent, as the API server does for a structural
    schema before it validates (a worker group without minReplicas gets 0). obj itself is not changed."""
    if isinstance(obj, dict):
        out = dict(obj)
        properties = schema.get("properties") or {}
        for key, sub in properties.items():
            if key not in out and "default" in sub:
                out[key] = copy.deepcopy(sub["default"])
            if key in out:
                out[key] = apply_defaults(out[key], sub)
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for key in out.keys() - properties.keys():
                out[key] = apply_defaults(out[key], extra)
        return out
    if isinstance(obj, list) and isinstance(schema.get("items"), dict):
        return [apply_defaults(item, schema["items"]) for item in obj]
    return obj


@functools.lru_cache(maxsize=8)
def _load_crd(path: str) -> dict[str, Any]:
    """The CRD as data. Parsing its 1-2 MB of YAML takes ~0.4 s even with the C loader, so the parsed form is kept
    as JSON in the user cache, named by the file's sha256 (any directory's CRDs, never a stale copy)."""
    try:
        body = Path(path).read_bytes()
    except OSError as exc:
        raise CRDError(f"cannot read KubeRay CRD {path}: {exc.strerror}. "
                       + _staging_help(Path(path).parent, "this one is unreadable")) from exc
    parsed = cache_dir().parent / "parsed-crds" / f"{hashlib.sha256(body).hexdigest()}.json"
    try:
        return json.loads(parsed.read_text())
    except (OSError, ValueError):
        pass
    crd = yaml.load(body, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    try:
        parsed.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(parsed, json.dumps(crd))
    except OSError:
        pass  # a read-only home: parse the YAML each time
    return crd


def crd_served_versions(crd_dir: str, kind: str) -> list[str]:
    crd = _load_crd(str(Path(crd_dir) / CRD_FILES[kind]))
    return [v["name"] for v in crd["spec"]["versions"] if v.get("served")]


@functools.lru_cache(maxsize=8)
def openapi_schema(crd_dir: str, kind: str, api_version: str = "ray.io/v1") -> dict[str, Any]:
    """The CRD's openAPIV3Schema for a kind and version (metadata and status left to others: metadata is checked
    by the rules, status is written by the operator)."""
    crd = _load_crd(str(Path(crd_dir) / CRD_FILES[kind]))
    group, _, version = api_version.partition("/")
    if crd.get("spec", {}).get("group") != group:
        raise CRDError(f"{crd_dir}/{CRD_FILES[kind]} is not the {group} CRD for {kind}. "
                       + _staging_help(Path(crd_dir), "this directory holds another file under that name"))
    for served in crd["spec"]["versions"]:
        if served["name"] == version:
            schema = copy.deepcopy(served["schema"]["openAPIV3Schema"])
            schema["properties"]["metadata"] = {"type": "object"}
            schema["properties"].pop("status", None)
            return schema
    raise CRDError(f"{crd_dir}/{CRD_FILES[kind]} serves no version {version!r} of {kind}")


@functools.lru_cache(maxsize=8)
def crd_validator(crd_dir: str, kind: str, api_version: str = "ray.io/v1"):
    """A cached JSON-schema validator for a KubeRay kind and version from the CRD in crd_dir."""
    import jsonschema

    return jsonschema.Draft7Validator(_to_jsonschema(openapi_schema(crd_dir, kind, api_version)))


# ----------------------------------------------------------------------------------------------------------
# other operators' CRDs: any CustomResourceDefinition among the --crds directory's files (Gateway API's, Kueue's, ...)


@dataclasses.dataclass(frozen=True)
class OtherCRDs:
    """The CRDs of other groups than ray.io found in a CRD directory: (group, kind) -> the CRD, and the files that
    could not be read as YAML (each one problem, said once)."""

    by_kind: dict[tuple[str, str], tuple[str, dict[str, Any]]]  # (group, kind) -> (its file, the CRD)
    unreadable: tuple[tuple[str, str], ...]  # (file, why)


@functools.lru_cache(maxsize=8)
def other_crds(crd_dir: str) -> OtherCRDs:
    """Every apiextensions.k8s.io CustomResourceDefinition in crd_dir's *.yaml/*.yml/*.json files but KubeRay's own
    two (multi-document files too, as Gateway API's standard-install.yaml). The directory only: a CRD elsewhere is
    not looked for."""
    found: dict[tuple[str, str], tuple[str, dict[str, Any]]] = {}
    unreadable: list[tuple[str, str]] = []
    try:
        files = sorted(p for p in Path(crd_dir).iterdir() if p.suffix in (".yaml", ".yml", ".json") and p.is_file()
                       and p.name not in CRD_FILES.values())
    except OSError:
        return OtherCRDs({}, ())
    for path in files:
        try:
            docs = list(yaml.load_all(path.read_bytes(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)))
        except (OSError, yaml.YAMLError) as exc:
            unreadable.append((str(path), " ".join(str(exc).split())[:200]))
            continue
        for doc in docs:
            if not (isinstance(doc, dict) and doc.get("kind") == "CustomResourceDefinition"
                    and isinstance(doc.get("spec"), dict)):
                continue
            spec = doc["spec"]
            kind = (spec.get("names") or {}).get("kind") if isinstance(spec.get("names"), dict) else None
            if isinstance(spec.get("group"), str) and isinstance(kind, str):
                found[(spec["group"], kind)] = (str(path), doc)
    return OtherCRDs(found, tuple(unreadable))


def other_crd_schema(crd: dict[str, Any], version: str) -> tuple[dict[str, Any] | None, list[str]]:
    """(the openAPIV3Schema of a served version, as openapi_schema gives KubeRay's; the served versions). None: the
    version is not served, or the CRD gives no schema for it."""
    versions = (crd.get("spec") or {}).get("versions")
    versions = [v for v in versions if isinstance(v, dict)] if isinstance(versions, list) else []
    served = [str(v.get("name")) for v in versions if v.get("served")]
    for entry in versions:
        schema = (entry.get("schema") or {}).get("openAPIV3Schema") if isinstance(entry.get("schema"), dict) else None
        if entry.get("name") == version and entry.get("served") and isinstance(schema, dict):
            schema = copy.deepcopy(schema)
            properties = schema.setdefault("properties", {})
            if isinstance(properties, dict):  # else no schema: check_other_crd says so
                properties["metadata"] = {"type": "object"}
                properties.pop("status", None)
            return schema, served
    return None, served


def schema_validator(schema: dict[str, Any]):
    """A JSON-schema validator for a CRD's openAPIV3Schema (structural, as the API server applies it)."""
    import jsonschema

    return jsonschema.Draft7Validator(_to_jsonschema(schema))
