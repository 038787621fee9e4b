"""Render and lint the Helm chart offline with the real Helm library (helm-python-sdk, Helm v4).

No cluster is contacted: values are coalesced like `helm install -f ... --set ...`, checked against the
chart's values.schema.json, and the templates rendered to Kubernetes objects.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import helm_python as helm
import yaml

from raytrain.spec import yamlfile


def default_chart_dir() -> Path:
    """helm/raytrain-cluster of the checkout this package runs from (the chart is not part of the wheel)."""
    return Path(__file__).resolve().parents[3] / "helm" / "raytrain-cluster"


class ChartError(Exception):
    """The chart could not be rendered or linted; the message names the chart, the values files and the cause."""


def merge_values(base: dict[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """Coalesce like Helm: maps merge key by key, anything else (lists included) is replaced, null deletes."""
    merged = copy.deepcopy(base)
    for key, value in override.items():
        if value is None:
            merged.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(merged.get(key), dict):
            merged[key] = merge_values(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def _nest(set_values: Mapping[str, Any]) -> dict[str, Any]:
    """{"worker.replicas": 3} -> {"worker": {"replicas": 3}}; nested mappings pass through."""
    nested: dict[str, Any] = {}
    for key, value in set_values.items():
        parts = str(key).split(".")
        node = nested
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = dict(value) if isinstance(value, Mapping) else value
    return nested


def load_values(values_files: Sequence[Path] = (), set_values: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The user-supplied values: each file in order, then set_values (dotted keys allowed), like -f then --set."""
    values: dict[str, Any] = {}
    for path in values_files:
        path = Path(path)
        try:
            loaded = yamlfile.read(path) or {}
        except yamlfile.YAMLFileError as exc:
            raise ChartError(str(exc)) from None
        if not isinstance(loaded, Mapping):
            raise ChartError(f"{path}: a values file must be a YAML mapping, got {type(loaded).__name__}")
        values = merge_values(values, loaded)
    if set_values:
        values = merge_values(values, _nest(set_values))
    return values


def render_chart_templates(
    chart_dir: Path,
    values_files: Sequence[Path] = (),
    set_values: Mapping[str, Any] | None = None,
    release_name: str = "raytrain",
    namespace: str = "default",
) -> list[tuple[str, dict[str, Any]]]:
    """Render the chart; returns (template path, object) pairs in template order, NOTES.txt left out."""
    chart_dir = Path(chart_dir)
    values = load_values(values_files, set_values)
    where = f"chart {chart_dir}" + (f" with {', '.join(str(p) for p in values_files)}" if values_files else "")
    try:
        with helm.Chart.load(chart_dir) as chart:
            rendered = chart.render(values=values, name=release_name, namespace=namespace, is_install=True)
    except helm.HelmError as exc:
        raise ChartError(f"{where}: {str(exc).strip()}") from exc
    objects: list[tuple[str, dict[str, Any]]] = []
    for template in sorted(rendered):
        if template.endswith("NOTES.txt"):
            continue
        try:
            docs = list(yaml.safe_load_all(rendered[template]))
        except yaml.YAMLError as exc:
            raise ChartError(f"{where}: {template} renders invalid YAML: {exc}") from exc
        objects.extend((template, doc) for doc in docs if doc)
    return objects


def render_chart(
    chart_dir: Path,
    values_files: Sequence[Path] = (),
    set_values: Mapping[str, Any] | None = None,
    release_name: str = "raytrain",
    namespace: str = "default",
) -> list[dict[str, Any]]:
    """Render the chart like `helm template` and return its Kubernetes objects (values schema enforced).

    Raises ChartError naming the chart, values files and Helm's message (schema violation, validateValues).
    """
    return [obj for _, obj in render_chart_templates(chart_dir, values_files, set_values, release_name, namespace)]


def lint_chart(chart_dir: Path, values_files: Sequence[Path] = (), strict: bool = True) -> list[str]:
    """`helm lint --strict`: the findings that fail it (warnings and errors), each as one line; [] = clean."""
    values = load_values(values_files)
    try:
        report = helm.lint(Path(chart_dir), values, strict=strict)
    except helm.HelmError as exc:
        raise ChartError(f"chart {chart_dir}: {str(exc).strip()}") from exc
    # Severity: 1 info, 2 warning, 3 error. Strict lint fails on warnings too; info (e.g. "icon is recommended") never fails.
    worst = 2 if strict else 3
    findings = [f"{m['path']}: {m['error']}" for m in report.get("messages", []) if m.get("severity", 0) >= worst]
    findings += [e for e in report.get("errors", []) if e not in findings and not any(e in f for f in findings)]
    return findings
