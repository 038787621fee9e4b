"""KubeRay v1.7.0's rules for a RayCluster's GCS fault tolerance (utils/validation.go ValidateRayClusterSpec: the
ray.io/ft-enabled annotation, gcsFaultToleranceOptions, Redis and the RocksDB storage gate), part of
raycluster.CLUSTER_CHECKS."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from raytrain.validator.kuberay.common import (
    env_by_name,
    head_container,
    head_env_path,
)
from raytrain.validator.kuberay.gates import FeatureGates, gate_off
from raytrain.validator.shape import get as dig

if TYPE_CHECKING:
    from raytrain.validator.problems import Doc, Problem


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
    if not ft_on and "RAY_REDIS_ADDRESS" in env_by_name(head_container(spec).get("env")):
        return [doc.problem(head_env_path(prefix), "RAY_REDIS_ADDRESS enables GCS fault tolerance implicitly, but "
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
    env = env_by_name(head_container(spec).get("env"))
    for var, instead in (("REDIS_PASSWORD", "redisPassword"), ("RAY_REDIS_ADDRESS", "redisAddress")):
        if var in env:
            out.append(doc.problem(head_env_path(prefix), f"{var} cannot be set with gcsFaultToleranceOptions.",
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
        return [gate_off(doc, f"{prefix}.gcsFaultToleranceOptions.backend", "GCSFaultToleranceEmbeddedStorage",
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
    head = head_container(spec)
    for var in ("RAY_gcs_storage", "RAY_gcs_storage_path"):
        if var in env_by_name(head.get("env")):
            out.append(doc.problem(head_env_path(prefix), f"{var} is managed by KubeRay with the rocksdb backend.",
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
    in_env = "REDIS_USERNAME" in env_by_name(head_container(spec).get("env"))
    if dig(spec, "headGroupSpec", "rayStartParams", "redis-username") or in_env:
        return [doc.problem(f"{prefix}.headGroupSpec", "sets a redis username (rayStartParams redis-username or "
                            "REDIS_USERNAME).", "use gcsFaultToleranceOptions.redisUsername")]
    return []
