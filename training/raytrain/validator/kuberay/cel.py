"""The KubeRay CRDs' CEL rules (x-kubernetes-validations), evaluated with cel-python as the API server does."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raytrain.validator.crds import openapi_schema

if TYPE_CHECKING:
    from raytrain.validator.problems import Doc, Problem


# ----------------------------------------------------------------------------------------------------------
# the CRDs' CEL rules (x-kubernetes-validations), evaluated with cel-python

# What to do when a rule fails; the CRD gives only the message.
CEL_FIXES = {
    "!((has(self.onSuccess) || has(self.onFailure)) && has(self.deletionRules))": "keep only deletionRules",
    "((has(self.onSuccess) && has(self.onFailure)) || has(self.deletionRules))":
        "add deletionRules (or both onSuccess and onFailure)",
    "!(has(self.jobStatus) && has(self.jobDeploymentStatus))": "keep exactly one of jobStatus and jobDeploymentStatus",
    "has(self.jobStatus) || has(self.jobDeploymentStatus)": "keep exactly one of jobStatus and jobDeploymentStatus",
    "self in ['ray.io/kuberay-operator', 'kueue.x-k8s.io/multikueue']":
        "remove managedBy (KubeRay manages the object), or set it to kueue.x-k8s.io/multikueue",
}


@functools.lru_cache(maxsize=64)
def _cel_program(expression: str) -> Any:
    env = _cel_environment()
    return env.program(env.compile(expression))


@functools.lru_cache(maxsize=1)
def _cel_environment() -> Any:
    import celpy  # only when a manifest has a field with a CEL rule: the parser takes ~0.2 s to build

    return celpy.Environment()


def _without_nulls(value: Any) -> Any:
    """The API server drops a null field before it validates: has(self.x) is false for `x: null`."""
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


def _cel_holds(expression: str, value: Any) -> bool:
    import celpy

    try:
        return bool(_cel_program(expression).evaluate({"self": celpy.json_to_cel(_without_nulls(value))}))
    except celpy.CELEvalError:
        return False  # the API server refuses an object its rule cannot evaluate


def _cel_rules(schema: dict, value: Any, path: str) -> Iterator[tuple[str, dict, Any]]:
    """(field path, rule, value) for each CEL rule on a field present in the object, as the API server applies
    them: a rule on an absent field does not run."""
    for rule in schema.get("x-kubernetes-validations") or []:
        if "oldSelf" not in rule.get("rule", ""):  # transition rules run only on update
            yield path, rule, value
    if isinstance(value, dict):
        properties = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        for key, item in value.items():
            child = properties.get(key) if key in properties else (extra if isinstance(extra, dict) else None)
            if child is not None and item is not None:
                yield from _cel_rules(child, item, f"{path}.{key}" if path else str(key))
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            yield from _cel_rules(schema["items"], item, f"{path}[{i}]")


def check_cel(doc: Doc, crd_dir: Path) -> list[Problem]:
    """The CEL rules of the KubeRay CRD for doc's kind (apiextensions: evaluated by the API server on create)."""
    schema = openapi_schema(str(crd_dir), doc.kind)
    out: list[Problem] = []
    for path, rule, value in _cel_rules(schema, doc.obj, ""):
        if not _cel_holds(rule["rule"], value):
            message = str(rule.get("message") or f"fails `{rule['rule']}`").rstrip(".")
            out.append(doc.problem(path, f"{message} (a CEL rule of the KubeRay CRD).",
                                   CEL_FIXES.get(rule["rule"], f"change it so that `{rule['rule']}` holds")))
    return out
