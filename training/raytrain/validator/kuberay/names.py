"""KubeRay v1.7.0's name rules for a RayCluster or RayJob (ValidateRayClusterMetadata /
ValidateRayJobMetadata, the webhooks' validateRayCluster/validateRayJob), and the limits they use."""

from __future__ import annotations

from typing import TYPE_CHECKING

from raytrain.validator.apimachinery import DNS1035

if TYPE_CHECKING:
    from raytrain.validator.problems import Doc, Problem

# KubeRay limits (utils/constant.go): 63 minus "-serve-svc" for a RayCluster; minus 6 more for the suffix a RayJob's
# cluster gets.
MAX_RAYCLUSTER_NAME = 53
MAX_RAYJOB_NAME = MAX_RAYCLUSTER_NAME - 6


def check_name(doc: Doc) -> list[Problem]:
    # ValidateRayClusterMetadata / ValidateRayJobMetadata (also the webhooks' validateRayCluster/validateRayJob)
    out: list[Problem] = []
    limit = MAX_RAYCLUSTER_NAME if doc.kind == "RayCluster" else MAX_RAYJOB_NAME
    if len(doc.name) > limit:
        why = "" if doc.kind == "RayCluster" else " (KubeRay appends 6 characters for the RayJob's cluster)"
        out.append(doc.problem("metadata.name", f"'{doc.name}' has {len(doc.name)} characters; KubeRay allows at most "
                               f"{limit} for a {doc.kind}{why}.", f"shorten it to {limit} characters or fewer"))
    if not DNS1035.match(doc.name):
        out.append(doc.problem("metadata.name", f"'{doc.name}' is not a DNS-1035 label.",
                               "use lower-case letters, digits and '-', starting with a letter"))
    return out


