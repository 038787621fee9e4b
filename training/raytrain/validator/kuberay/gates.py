"""KubeRay v1.7.0's operator feature gates (ray-operator/pkg/features/features.go) and the message for a
field whose gate is off."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from raytrain.validator.problems import Doc, Problem

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


def gate_off(doc: Doc, field: str, gate: str, what: str) -> Problem:
    return doc.problem(field, f"{what} needs the KubeRay operator's {gate} feature gate, which is off "
                       f"(v1.7.0 default: {str(DEFAULT_FEATURE_GATES[gate]).lower()}).",
                       f"start the operator with --feature-gates={gate}=true and validate with "
                       f"`raytrain validate --feature-gates {gate}=true`, or remove {field.rsplit('.', 1)[-1]}")


