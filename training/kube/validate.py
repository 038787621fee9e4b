"""`raytrain validate`: check charts, values files and manifests before anything reaches a cluster.

Four layers, each reported as a Problem that names the file, the object, the field and the fix:
1. core Kubernetes objects against the Kubernetes OpenAPI schemas (kubernetes-validate);
2. RayCluster and RayJob against the KubeRay v1.7.0 CRD schemas (schemas.py) and their CEL rules;
3. KubeRay's admission rules that live in the webhook and the operator's code, under the operator's feature
   gates (kuberay_rules.py; RayService and RayCronJob are not checked);
4. raytrain's cross-checks: a RayJob running `raytrain run` fits its cluster, writes to the shared mount,
   uses an image whose Ray matches rayVersion, and carries a valid run config.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml

from raytrain.kube import rules
from raytrain.kube.kuberay_rules import FeatureGates, check_cel, check_kuberay
from raytrain.kube.render import ChartError, render_chart_templates
from raytrain.kube.schemas import CRDError, CRD_FILES, crd_served_versions, crd_validator, repo_root

# Kubernetes version the core schemas are checked against (KubeRay v1.7.0 supports 1.27+; kind ships ~1.33).
KUBE_VERSION = "1.33"
RAY_GROUP = "ray.io"
# KubeRay's label on every pod of a cluster, and the clusterSelector key of a RayJob.
CLUSTER_LABEL = "ray.io/cluster"


@dataclasses.dataclass(frozen=True)
class Problem:
    file: str  # the file (or chart + values file) the object came from
    obj: str  # Kind/name, or "" for the file as a whole
    field: str  # dotted path inside the object, e.g. spec.workerGroupSpecs[0].replicas
    message: str
    fix: str

    def __str__(self) -> str:
        where = ": ".join(part for part in (self.file, self.obj, self.field) if part)
        return f"{where}: {self.message} Fix: {self.fix}"


@dataclasses.dataclass
class Doc:
    """One object and where it came from; docs of one file, directory or chart render form a manifest set."""

    source: str
    obj: dict[str, Any]

    @property
    def kind(self) -> str:
        return str(self.obj.get("kind", ""))

    @property
    def name(self) -> str:
        return str((self.obj.get("metadata") or {}).get("name", ""))

    @property
    def ref(self) -> str:
        return f"{self.kind or '?'}/{self.name or '?'}"

    def problem(self, field: str, message: str, fix: str) -> Problem:
        return Problem(self.source, self.ref, field, message, fix)


def default_chart_dir() -> Path:
    return repo_root() / "helm" / "raytrain-cluster"


# ----------------------------------------------------------------------------------------------------------
# loading: paths -> manifest sets


def _is_chart(path: Path) -> bool:
    return (path / "Chart.yaml").is_file()


def _values_files_of(chart: Path) -> list[Path]:
    """values.yaml first (the defaults), then the overlays values-*.yaml."""
    return sorted(chart.glob("values*.yaml"), key=lambda p: (p.name != "values.yaml", p.name))


def render_set(chart: Path, values_file: Path | None, release_name: str = "raytrain") -> tuple[list[Doc], list[Problem]]:
    """Render the chart with one values file (values.yaml = the defaults alone) into a manifest set."""
    overlays = [values_file] if values_file is not None and values_file.name != "values.yaml" else []
    label = f"{chart} (values: {values_file.name if values_file else 'values.yaml'})"
    try:
        rendered = render_chart_templates(chart, overlays, release_name=release_name)
    except ChartError as exc:
        fix = "change the value the message names (see the chart's README for every value)"
        return [], [Problem(label, "", "", str(exc), fix)]
    return [Doc(f"{label} [{template}]", obj) for template, obj in rendered], []


def load_manifest_file(path: Path) -> tuple[list[Doc], list[Problem]]:
    """A multi-document YAML file as Docs; documents that are not Kubernetes objects become Problems."""
    try:
        docs = list(yaml.safe_load_all(path.read_text()))
    except OSError as exc:
        return [], [Problem(str(path), "", "", f"cannot be read ({exc.strerror}).", "check the path")]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        return [], [Problem(str(path), "", "", f"is not valid YAML{at}: {getattr(exc, 'problem', exc)}.",
                            "fix the YAML syntax there")]
    out: list[Doc] = []
    problems: list[Problem] = []
    for index, doc in enumerate(docs):
        if doc is None:
            continue
        source = f"{path}" if len(docs) == 1 else f"{path} (document {index + 1})"
        if not isinstance(doc, dict) or not doc.get("apiVersion") or not doc.get("kind"):
            problems.append(Problem(source, "", "", "is not a Kubernetes object (no apiVersion/kind).",
                                    "give every YAML document an apiVersion, a kind and metadata.name"))
            continue
        out.append(Doc(str(path), doc))
    return out, problems


def collect_sets(paths: Sequence[Path]) -> tuple[list[list[Doc]], list[Problem]]:
    """Each path becomes one or more manifest sets: a chart one per values file, a values file one, a
    manifest file or directory one (a RayJob finds its ConfigMap and cluster within its set)."""
    sets: list[list[Doc]] = []
    problems: list[Problem] = []

    def add(result: tuple[list[Doc], list[Problem]]) -> None:
        sets.append(result[0])
        problems.extend(result[1])

    for path in map(Path, paths):
        if path.is_dir() and _is_chart(path):
            for values_file in _values_files_of(path):
                add(render_set(path, values_file))
        elif path.is_dir():
            files = sorted(p for p in path.rglob("*") if p.suffix in (".yaml", ".yml") and p.is_file())
            docs: list[Doc] = []
            for file in files:
                file_docs, file_problems = load_manifest_file(file)
                docs.extend(file_docs)
                problems.extend(file_problems)
            sets.append(docs)
        elif path.is_file() and path.name.startswith("values") and _is_chart(path.parent):
            add(render_set(path.parent, path))
        elif path.is_file():
            add(load_manifest_file(path))
        else:
            problems.append(Problem(str(path), "", "", "does not exist.", "give a chart directory, a values file, "
                                    "a manifest file or a directory of manifests"))
    return sets, problems


# ----------------------------------------------------------------------------------------------------------
# schema layers


def field_path(parts: Iterable[Any]) -> str:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _schema_problem(doc: Doc, error: jsonschema.ValidationError) -> list[Problem]:
    path = list(error.absolute_path)
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        allowed = list((error.schema.get("properties") or {}).keys())
        problems = []
        for extra in sorted(set(error.instance) - set(allowed)):
            close = difflib.get_close_matches(str(extra), allowed, n=1)
            fix = f"did you mean '{close[0]}'?" if close else f"remove it; allowed here: {', '.join(sorted(allowed))}"
            problems.append(doc.problem(field_path(path + [extra]), f"unknown field '{extra}'.", fix))
        return problems
    if error.validator == "required":
        missing = re.findall(r"'([^']+)' is a required property", error.message)
        name = missing[0] if missing else "?"
        return [doc.problem(field_path(path + [name]), "is required but missing.", f"add '{name}'")]
    if error.validator == "enum":
        return [doc.problem(field_path(path), f"is {error.instance!r}, not one of {error.validator_value}.",
                            f"use one of {', '.join(map(str, error.validator_value))}")]
    if error.validator in ("type", "anyOf"):
        expected = error.validator_value if error.validator == "type" else "integer or string"
        return [doc.problem(field_path(path), f"is {type(error.instance).__name__} {error.instance!r}, "
                            f"must be {expected}.", f"write it as {expected}")]
    return [doc.problem(field_path(path), error.message + ".", "correct the value to satisfy the schema")]


def check_core_schema(doc: Doc, kube_version: str = KUBE_VERSION) -> list[Problem]:
    try:
        kubernetes_validate.validate(doc.obj, kube_version, strict=True)
    except kubernetes_validate.SchemaNotFoundError:
        return []  # a kind without a published schema (another operator's CRD): nothing to check it against
    except kubernetes_validate.ValidationError as error:
        return _schema_problem(doc, error)
    return []


def check_ray_schema(doc: Doc, crd_dir: Path) -> list[Problem]:
    api_version = str(doc.obj.get("apiVersion"))
    if doc.kind not in CRD_FILES:
        return [doc.problem("kind", f"{doc.kind} is not checked by raytrain (only RayCluster and RayJob).",
                            "validate it with the KubeRay operator's own tooling")]
    version = api_version.partition("/")[2]
    if version != "v1":
        served = crd_served_versions(str(crd_dir), doc.kind)
        what = "deprecated" if version in served else "not served"
        return [doc.problem("apiVersion", f"{api_version} is {what} by KubeRay v1.7.0.", "use apiVersion: ray.io/v1")]
    validator = crd_validator(str(crd_dir), doc.kind)
    problems: list[Problem] = []
    for error in sorted(validator.iter_errors(doc.obj), key=lambda e: [str(p) for p in e.absolute_path]):
        problems.extend(_schema_problem(doc, error))
    return problems


# ----------------------------------------------------------------------------------------------------------
# entry point


def validate_sets(sets: list[list[Doc]], crd_dir: Path, values: Path | None = None,
                  chart: Path | None = None, gates: FeatureGates | None = None) -> list[Problem]:
    gates = gates or FeatureGates()
    problems: list[Problem] = []
    for docs in sets:
        broken: list[Doc] = []  # objects whose shape is wrong: the cross-checks would misread them
        for doc in docs:
            if doc.kind == "Cluster" and str(doc.obj.get("apiVersion", "")).startswith("kind.x-k8s.io/"):
                continue  # a kind cluster config (manifests/kind-config.yaml), not a Kubernetes object
            if not doc.name:
                problems.append(doc.problem("metadata.name", "is missing.", "give the object a name"))
                broken.append(doc)
                continue
            is_ray = str(doc.obj.get("apiVersion", "")).split("/")[0] == RAY_GROUP
            schema_problems = check_ray_schema(doc, crd_dir) if is_ray else check_core_schema(doc)
            if is_ray and not schema_problems:  # the API server evaluates the CRD's CEL rules on a valid shape
                schema_problems = check_cel(doc, crd_dir)
            problems.extend(schema_problems)
            if schema_problems:
                broken.append(doc)
            elif is_ray:  # the rules assume the shapes the schema guarantees; the operator never sees a refused one
                problems.extend(check_kuberay(doc, gates))
                problems.extend(rules.check_ray_images(doc))
        checkable = [d for d in docs if not any(d is b for b in broken)]
        problems.extend(rules.cross_check(checkable, lambda name: target_cluster(name, docs, values, chart)))
    return problems


def target_cluster(name: str, docs: list[Doc], values: Path | None, chart: Path | None) -> tuple[list[Doc], list[Problem]]:
    """The cluster a clusterSelector RayJob runs on: a RayCluster of that name in the same manifest set, else the
    chart rendered as `helm install <name>` with the given values file (default: the chart's values.yaml)."""
    if any(d.kind == "RayCluster" and d.name == name for d in docs):
        return docs, []
    chart = Path(chart) if chart else (Path(values).parent if values else default_chart_dir())
    return render_set(chart, Path(values) if values else None, release_name=name)


def validate_paths(paths: Sequence[Path], crd_dir: Path, values: Path | None = None,
                   chart: Path | None = None, gates: FeatureGates | None = None) -> list[Problem]:
    """Check charts (rendered with each of their values*.yaml), values files (rendered with their chart),
    rendered YAML and manifest files or directories. [] means valid.

    `values` picks the chart values that the target of a clusterSelector RayJob is rendered with (default: the
    chart's values.yaml); `chart` the chart (default: the values file's directory, else helm/raytrain-cluster);
    `gates` the KubeRay operator's feature gates (default: v1.7.0's defaults).
    """
    crd_dir = Path(crd_dir)
    try:
        for kind in CRD_FILES:  # fail once, clearly, when the CRDs are missing
            crd_validator(str(crd_dir), kind)
    except CRDError as exc:
        return [Problem(str(crd_dir), "", "", str(exc), "download the KubeRay v1.7.0 CRDs")]
    sets, problems = collect_sets(paths)
    return problems + validate_sets(sets, crd_dir, values, chart, gates)
