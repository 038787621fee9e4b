"""Reading KubeRay objects as the operator reads them: groups, containers, env, versions. (The apimachinery name
and label rules the checks share are in validator/apimachinery.py.)"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from raytrain.validator.shape import get as dig
from raytrain.validator.shape import groups

if TYPE_CHECKING:
    from raytrain.validator.problems import Doc, Problem

# ----------------------------------------------------------------------------------------------------------
# reading KubeRay objects


def worker_groups(spec: dict, prefix: str) -> list[tuple[str, str, dict]]:
    return groups(spec, prefix)[1:]


def containers_of(group: dict) -> list[dict]:
    return dig(group, "template", "spec", "containers", default=[])


def head_container(spec: dict) -> dict:
    """The head's Ray container (RayContainerIndex 0)."""
    return dig(spec, "headGroupSpec", "template", "spec", "containers", 0, default={})


def head_env_path(prefix: str) -> str:
    return f"{prefix}.headGroupSpec.template.spec.containers[0].env"


def env_by_name(env_list: Any) -> dict[str, dict]:
    """name -> the env entry (EnvVarByName: the first of a name wins)."""
    out: dict[str, dict] = {}
    for entry in env_list or []:
        if isinstance(entry, dict) and entry.get("name") not in out:
            out[entry.get("name")] = entry
    return out


def env_true(env_list: Any, name: str) -> bool:
    return str(env_by_name(env_list).get(name, {}).get("value", "")) in ("1", "true")


def autoscaler_v2(spec: dict) -> bool:
    # utils.IsAutoscalingV2Enabled
    return dig(spec, "autoscalerOptions", "version") == "v2"


def v2_or_env(spec: dict) -> bool:
    """Autoscaler v2 by autoscalerOptions.version, or the head's RAY_enable_autoscaler_v2 (KubeRay < 1.4 style)."""
    return autoscaler_v2(spec) or env_true(head_container(spec).get("env"), "RAY_enable_autoscaler_v2")


GO_VERSION = re.compile(r"^\s*v?([0-9]+(?:\.[0-9]+)*)(.*)$", re.S)


def parse_generic_version(text: Any) -> tuple[int, ...] | None:
    """k8s.io/apimachinery util/version.ParseGeneric: two or more numeric fields, the first without a leading
    zero, then anything; None where KubeRay's parse fails."""
    match = GO_VERSION.match(str(text))
    if not match:
        return None
    parts = match.group(1).split(".")
    if len(parts) < 2 or (parts[0].startswith("0") and parts[0] != "0"):
        return None
    return tuple(int(p) for p in parts)


def at_least(version: tuple[int, ...], floor: tuple[int, ...]) -> bool:
    width = max(len(version), len(floor))  # Version.LessThan pads the shorter one with zeros
    return version + (0,) * (width - len(version)) >= floor + (0,) * (width - len(floor))


def version_floor(doc: Doc, spec: dict, prefix: str, what: str, floor: str) -> list[Problem]:
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
    if not at_least(parsed, tuple(int(p) for p in floor.split("."))):
        return [doc.problem(field, f"is {ray_version}, but {what} needs Ray {floor} or later.", fix)]
    return []
