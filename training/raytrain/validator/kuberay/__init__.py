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

from typing import TYPE_CHECKING

from raytrain.validator.kuberay.cel import check_cel
from raytrain.validator.kuberay.common import parse_generic_version
from raytrain.validator.kuberay.gates import DEFAULT_FEATURE_GATES, FeatureGateError, FeatureGates
from raytrain.validator.kuberay.names import check_name
from raytrain.validator.kuberay.raycluster import check_cluster_spec, check_upgrade_strategy
from raytrain.validator.kuberay.rayjob import check_job_spec
from raytrain.validator.shape import get as dig

if TYPE_CHECKING:
    from raytrain.validator.problems import Doc, Problem

__all__ = ["DEFAULT_FEATURE_GATES", "FeatureGateError", "FeatureGates", "check_cel", "check_kuberay",
           "parse_generic_version"]


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
