"""`raytrain validate`: check charts, values files and manifests before anything reaches a cluster.

Paths become manifest sets (a chart rendered once per values file, a kustomization directory rendered by
`kubectl kustomize`, a manifest file or directory as it is), and
each object goes through four layers, each reported as a Problem (problems.py) that names the file, the object,
the field and the fix:
1. core Kubernetes objects against the Kubernetes OpenAPI schemas (kubernetes-validate), then the API server's own
   rules beyond them (core.py, apimachinery.py; the pod rules on KubeRay's pod templates too);
2. RayCluster and RayJob against the KubeRay v1.7.0 CRD schemas, with the CRDs' defaults applied first, as the
   API server does (crds.py), and their CEL rules;
3. KubeRay's admission rules that live in the webhook and the operator's code, under the operator's feature
   gates (kuberay_rules.py; RayService and RayCronJob are not checked);
4. raytrain's cross-checks: a RayJob running `raytrain run` fits its cluster, writes to the shared mount,
   uses an image whose Ray matches rayVersion, and carries a valid run config (raytrain_rules.py);
5. Kueue's rules for a RayJob or RayCluster labelled kueue.x-k8s.io/queue-name, and with --kueue-queues whether it
   can ever fit its ClusterQueue's quota (kueue.py).
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import importlib.resources
import re
from collections.abc import Sequence
from pathlib import Path

from raytrain.errors import shown
from raytrain.spec import yamlfile
from raytrain.validator import kueue, raytrain_rules
from raytrain.validator.apimachinery import check_object_meta
from raytrain.validator.corev1 import check_core_object, check_pod_template
from raytrain.validator.crds import (CRD_FILES, CRDError, apply_defaults, crd_served_versions, crd_validator,
                                     openapi_schema, other_crd_schema, other_crds, schema_validator)
from raytrain.validator.kuberay import FeatureGates, check_cel, check_kuberay
from raytrain.validator.kustomize import KUSTOMIZATION_FILES, KustomizeError, is_kustomization, kustomize_build
from raytrain.validator.problems import Doc, Problem, field_path, split_fix
from raytrain.validator.render import ChartError, default_chart_dir, render_chart_templates
from raytrain.validator.shape import groups

# Kubernetes version the core schemas are checked against (KubeRay v1.7.0 supports 1.27+; kind ships ~1.33).
KUBE_VERSION = "1.33"
RAY_GROUP = "ray.io"
# What the API server appends to metadata.generateName: 5 random characters. The rules check the whole name.
GENERATED_SUFFIX = "xxxxx"


# ----------------------------------------------------------------------------------------------------------
# loading: paths -> manifest sets


def _is_chart(path: Path) -> bool:
    return (path / "Chart.yaml").is_file()


def _values_files_of(chart: Path) -> list[Path]:
    """values.yaml first (the defaults), then the overlays values-*.yaml."""
    return sorted(chart.glob("values*.yaml"), key=lambda p: (p.name != "values.yaml", p.name))


# The heading of the chart's refusals that only the installer can answer (templates/_validate.tpl).
TO_CHOOSE = "values to choose"


def render_set(chart: Path, values_file: Path | None, release_name: str = "raytrain",
               shipped: bool = False) -> tuple[list[Doc], list[Problem]]:
    """Render the chart with one values file (the chart's own values.yaml, or None: the defaults alone) into a
    manifest set. The values file may live anywhere. `shipped`: one of the chart's own values files, checked as
    it ships; one that leaves to the installer what only they can choose (the image, the storage) is a note."""
    is_defaults = values_file is None or Path(values_file).resolve() == (Path(chart) / "values.yaml").resolve()
    overlays = [] if is_defaults else [Path(values_file)]
    shown = "values.yaml" if values_file is None else (values_file.name if is_defaults or Path(values_file).parent
                                                        == Path(chart) else str(values_file))
    label = f"{chart} (values: {shown})"
    try:
        rendered = render_chart_templates(chart, overlays, release_name=release_name)
    except ChartError as exc:
        text = str(exc)
        if TO_CHOOSE in text and "invalid values" not in text:
            if shipped:
                return [], [Problem(label, "", "", f"renders once the installer has chosen what it leaves open: {text}",
                                    "nothing to do for the chart; check the values you install with: raytrain "
                                    "validate my-values.yaml (and --values my-values.yaml with a RayJob)", "note")]
            return [], [Problem(label, "", "", text, "choose them in the values file you install the chart with and "
                                "give it: raytrain validate --values my-values.yaml ... (a RayJob on the chart's "
                                "cluster is checked against that cluster)")]
        message, fix = split_fix(text)  # a values file we could not read says its own fix
        if " Fix: " not in text:
            fix = "change the value the message names (see the chart's README for every value)"
        return [], [Problem(label, "", "", message, fix)]
    return [Doc(f"{label} [{template}]", obj) for template, obj in rendered], []


def _read_yaml_documents(path: Path, text: str | None = None) -> tuple[list, list[Problem]]:
    try:
        return (yamlfile.read_all(path) if text is None else yamlfile.load_all(text, str(path))), []
    except yamlfile.YAMLFileError as exc:
        return [], [Problem(str(path), "", "", exc.message, exc.fix)]


def load_manifest_file(path: Path, text: str | None = None) -> tuple[list[Doc], list[Problem]]:
    """A multi-document YAML file (or `text` read from it) as Docs; documents that are not Kubernetes objects become
    Problems."""
    docs, problems = _read_yaml_documents(path, text)
    out: list[Doc] = []
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


def load_kustomization(path: Path) -> tuple[list[Doc], list[Problem]]:
    """A kustomization directory as `kubectl apply -k` would apply it (rendered by kubectl)."""
    try:
        text = kustomize_build(path)
    except KustomizeError as exc:
        message, fix = split_fix(str(exc).removeprefix(f"{path}: "))
        return [], [Problem(str(path), "", "", message, fix)]
    return load_manifest_file(Path(f"{path} (kubectl kustomize)"), text)


def _is_values_file(path: Path) -> bool:
    """A chart values file given on its own: named *values*.yaml and holding one mapping that is not an object."""
    if "values" not in path.name or path.suffix not in (".yaml", ".yml"):
        return False
    docs, problems = _read_yaml_documents(path)
    docs = [d for d in docs if d is not None]
    return not problems and len(docs) <= 1 and all(isinstance(d, dict) and "kind" not in d for d in docs)


def collect_sets(paths: Sequence[Path], chart: Path | None = None) -> tuple[list[list[Doc]], list[Problem]]:
    """Each path becomes one or more manifest sets: a chart one per values file (a chart inside a directory too), a
    values file one (rendered with its own chart, else `chart`, else the default chart), a kustomization directory
    one (inside a directory too), a manifest file or the other files of a directory one (a RayJob finds its ConfigMap and cluster within its set)."""
    sets: list[list[Doc]] = []
    problems: list[Problem] = []

    def add(result: tuple[list[Doc], list[Problem]]) -> None:
        sets.append(result[0])
        problems.extend(result[1])

    for path in map(Path, paths):
        before = (sum(map(len, sets)), len(problems))
        try:
            _collect_one(path, chart, sets, problems, add)
        except (OSError, ValueError) as exc:  # a name too long for the OS, a NUL in it, a directory we cannot list
            problems.append(Problem(str(path)[:200], "", "", f"cannot be read ({getattr(exc, 'strerror', None) or exc}).",
                                    "check the path and its permissions"))
            continue
        if (sum(map(len, sets)), len(problems)) == before:  # an empty file, a file of `---`, an empty folder
            problems.append(Problem(str(path), "", "", "holds no Kubernetes object: nothing to check.",
                                    "give a manifest file, a chart, a values file or a directory holding them"))
    return sets, problems


def _collect_one(path: Path, chart: Path | None, sets: list[list[Doc]], problems: list[Problem], add) -> None:
    if is_kustomization(path):
        add(load_kustomization(path))
    elif path.is_dir() and _is_chart(path):
        for values_file in _values_files_of(path):
            add(render_set(path, values_file, shipped=True))
    elif path.is_dir():
        charts = sorted({c.parent for c in path.rglob("Chart.yaml")}, key=lambda c: len(c.parts))
        outermost = [c for c in charts if not any(o != c and o in c.parents for o in charts)]
        for found in outermost:  # a chart is rendered, never parsed as YAML
            for values_file in _values_files_of(found):
                add(render_set(found, values_file, shipped=True))
        # A kustomization is rendered too: its files are inputs (a run config, a patch), not objects.
        kustomizations = sorted({p.parent for name in KUSTOMIZATION_FILES for p in path.rglob(name)
                                 if not any(c in p.parents for c in outermost)}, key=lambda k: len(k.parts))
        kustomizations = [k for k in kustomizations if not any(o != k and o in k.parents for o in kustomizations)]
        for found in kustomizations:
            add(load_kustomization(found))
        files = sorted(p for p in path.rglob("*") if p.suffix in (".yaml", ".yml") and p.is_file()
                       and not any(c in p.parents for c in outermost + kustomizations))
        docs: list[Doc] = []
        for file in files:
            file_docs, file_problems = load_manifest_file(file)
            docs.extend(file_docs)
            problems.extend(file_problems)
        sets.append(docs)
    elif path.is_file() and _is_chart(path.parent) and path.name.startswith("values"):
        add(render_set(path.parent, path, shipped=True))
    elif path.is_file() and _is_values_file(path):
        add(render_set(Path(chart) if chart else default_chart_dir(), path))
    elif path.is_file():
        add(load_manifest_file(path))
    else:
        problems.append(Problem(str(path), "", "", "does not exist.", "give a chart directory, a values file, "
                                "a manifest file or a directory of manifests"))


# ----------------------------------------------------------------------------------------------------------
# schema layers


def _schema_problem(doc: Doc, error) -> list[Problem]:
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
    if error.validator in ("minimum", "maximum") and error.validator_value in (-2**31, 2**31 - 1, -2**63, 2**63 - 1):
        bits = 32 if abs(error.validator_value) < 2**32 else 64
        # Kubernetes before 1.36 stores such a value in a custom resource (CRD validation ignored the format until
        # kubernetes/kubernetes#136582), but KubeRay's Go types (int32 replicas, say) cannot decode it.
        low = error.schema.get("minimum", -2**(bits - 1)) if isinstance(error.schema, dict) else -2**(bits - 1)
        return [doc.problem(field_path(path), f"is {error.instance}, beyond a {bits}-bit integer (format: int{bits}): "
                            "the API server refuses it, or (a custom resource on Kubernetes before 1.36) stores it "
                            "and the operator cannot read the object.",
                            f"use a value from {low} to {2**(bits - 1) - 1}")]
    if error.validator in ("type", "anyOf"):
        expected = error.validator_value if error.validator == "type" else "integer or string"
        return [doc.problem(field_path(path), f"is {type(error.instance).__name__} {error.instance!r}, "
                            f"must be {expected}.", f"write it as {expected}")]
    return [doc.problem(field_path(path), error.message + ".", "correct the value to satisfy the schema")]


# The API groups the Kubernetes 1.33 API server serves itself (every group of kubernetes-validate's schemas for it;
# tests/validator/test_validate.py checks this list against them). A kind of any other group comes from a CRD, which
# the API server accepts wherever that CRD is installed: gateway.networking.k8s.io ends in .k8s.io and is still a
# CRD (Gateway API), so the suffix says nothing.
KUBERNETES_GROUPS = frozenset({
    "", "admission.k8s.io", "admissionregistration.k8s.io", "apiextensions.k8s.io", "apiregistration.k8s.io", "apps",
    "authentication.k8s.io", "authorization.k8s.io", "autoscaling", "batch", "certificates.k8s.io",
    "coordination.k8s.io", "discovery.k8s.io", "events.k8s.io", "extensions", "flowcontrol.apiserver.k8s.io",
    "imagepolicy.k8s.io", "internal.apiserver.k8s.io", "networking.k8s.io", "node.k8s.io", "policy",
    "rbac.authorization.k8s.io", "resource.k8s.io", "scheduling.k8s.io", "storage.k8s.io",
    "storagemigration.k8s.io"})


def api_group(api_version: str) -> str:
    return api_version.rpartition("/")[0]


def is_kubernetes_group(api_version: str) -> bool:
    """v1, apps/v1, networking.k8s.io/v1: a group the API server itself serves (its kinds all have schemas)."""
    return api_group(api_version) in KUBERNETES_GROUPS


def _known_kinds(api_version: str, kube_version: str) -> list[str]:
    """The kinds kubernetes-validate holds a schema for in this group version (lower-case, as its files name them)."""

    suffix = "-" + re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version) + ".json"
    try:
        folder = importlib.resources.files("kubernetes_validate") / "kubernetes-json-schema" / f"v{kube_version}.0-local-strict"
        return sorted(entry.name[: -len(suffix)] for entry in folder.iterdir() if entry.name.endswith(suffix))
    except OSError:
        return []


def check_core_schema(doc: Doc, kube_version: str = KUBE_VERSION) -> list[Problem]:
    """A kind of a group the API server serves itself against kubernetes-validate's schema: a kind it lacks is
    refused (the API server has no such resource)."""
    import kubernetes_validate  # ~0.1 s; only core objects need it

    try:
        kubernetes_validate.validate(doc.obj, kube_version, strict=True)
    except kubernetes_validate.SchemaNotFoundError:
        api_version = str(doc.obj.get("apiVersion"))
        close = difflib.get_close_matches(doc.kind.lower(), _known_kinds(api_version, kube_version), n=1)
        hint = f"did you mean '{close[0]}' (in its usual capitalisation)? " if close else ""
        return [doc.problem("kind", f"{doc.kind} is not a kind of {api_version} in Kubernetes {kube_version}: the "
                            "API server refuses the object.", f"{hint}check the kind and the apiVersion")]
    except kubernetes_validate.ValidationError as error:
        return _schema_problem(doc, error)
    return []


def check_other_crd(doc: Doc, crd_dir: Path) -> list[Problem]:
    """A kind of another operator's group (Gateway API, Kueue, cert-manager, ...): the API server accepts it wherever
    its CRD is installed. Checked against that CRD's schema when the CRD directory (--crds) holds it, after its
    defaults; else a note, since nothing here can say what its fields should be."""
    api_version = str(doc.obj.get("apiVersion"))
    group, version = api_group(api_version), api_version.rpartition("/")[2]
    found = other_crds(str(crd_dir)).by_kind.get((group, doc.kind))
    if found is None:
        return [doc.problem("kind", f"{doc.kind} ({api_version}) is not checked: no schema (its CRD is not among "
                            f"those in {crd_dir}).", "nothing to do if its CRD is installed in the cluster; to check it, "
                            "put the CRD's YAML file in a directory with KubeRay's and pass --crds DIR",
                            severity="note")]
    file, crd = found
    schema, served = other_crd_schema(crd, version)
    if schema is None:
        meta = crd.get("metadata") if isinstance(crd.get("metadata"), dict) else {}
        return [doc.problem("apiVersion", f"{api_version} is not a version its CRD "
                            f"{str(meta.get('name', doc.kind))[:253]} serves (served: "
                            f"{', '.join(served) or 'none'}): the API server refuses the object.",
                            f"use apiVersion: {group}/{served[0]}" if served else "check the CRD")]
    import jsonschema

    try:
        defaulted = apply_defaults(doc.obj, schema)
        errors = sorted(schema_validator(schema).iter_errors(defaulted), key=lambda e: [str(x) for x in e.absolute_path])
        return [p for error in errors for p in _schema_problem(doc, error)]
    except (jsonschema.SchemaError, jsonschema.exceptions.UnknownType, re.error, AttributeError, TypeError, ValueError,
            RecursionError) as exc:
        # a hand-edited CRD whose schema is no schema: the API server would not have installed it
        return [Problem(file, "", "", f"holds the CRD for {doc.kind} ({group}), whose openAPIV3Schema for {version} "
                        f"cannot be used ({type(exc).__name__}: {' '.join(str(exc).split())[:160]}), so {doc.ref} is "
                        "not checked.", "use the CRD file as its project publishes it")]


def with_defaults(doc: Doc, crd_dir: Path) -> Doc:
    """The object as the API server stores it: the CRD's structural-schema defaults filled in."""
    if doc.kind not in CRD_FILES or str(doc.obj.get("apiVersion")) != f"{RAY_GROUP}/v1":
        return doc
    return Doc(doc.source, apply_defaults(doc.obj, openapi_schema(str(crd_dir), doc.kind)))


def check_ray_schema(doc: Doc, crd_dir: Path) -> list[Problem]:
    """A RayCluster or RayJob against its CRD, after the CRD's defaults are applied (as the API server does)."""
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
    defaulted = with_defaults(doc, crd_dir)
    for error in sorted(validator.iter_errors(defaulted.obj), key=lambda e: [str(p) for p in e.absolute_path]):
        problems.extend(_schema_problem(doc, error))
    return problems


# ----------------------------------------------------------------------------------------------------------
# entry point


def _named(doc: Doc) -> tuple[Doc, list[Problem]]:
    """The object under the name the API server gives it: metadata.name, or generateName plus 5 characters
    (`kubectl create`; `kubectl apply` needs a name, which is worth a note)."""
    if doc.name or not doc.generate_name:
        return doc, []
    obj = copy.deepcopy(doc.obj)
    obj["metadata"]["name"] = doc.generate_name + GENERATED_SUFFIX
    note = doc.problem("metadata.generateName", "has no metadata.name: `kubectl create -f` completes the name, "
                       "`kubectl apply -f` refuses the object.", "use kubectl create, or set metadata.name to apply "
                       "it", severity="note")
    return Doc(doc.source, obj), [note]


def _rules_of(doc: Doc, completed: Doc, gates: FeatureGates) -> list[Problem]:
    """KubeRay's admission rules on the stored object, the API server's rules for the metadata and for the pods
    KubeRay creates from its templates, and the image's Ray against rayVersion; problems keep the object's own
    reference."""
    found = (check_kuberay(completed, gates) + raytrain_rules.check_ray_images(completed)
             + raytrain_rules.check_grace_periods(completed)
             + raytrain_rules.check_local_build_image(completed) + kueue.check_kueue(completed))
    said = {p.field for p in found}
    found += [p for p in check_object_meta(completed, custom=True) + _ray_pod_templates(completed) if p.field not in said]
    return [dataclasses.replace(p, obj=doc.ref) for p in found]


def _ray_pod_templates(doc: Doc) -> list[Problem]:
    """Every pod template of a RayCluster (or a RayJob's cluster and submitter) under the pod rules: KubeRay admits
    what its CRD's schema holds, then the API server refuses the pods it creates."""
    spec = doc.obj.get("spec") or {}
    cluster, prefix = (spec, "spec") if doc.kind == "RayCluster" else (spec.get("rayClusterSpec"), "spec.rayClusterSpec")
    out: list[Problem] = []
    if isinstance(cluster, dict):
        for path, _, group in groups(cluster, prefix):
            out += check_pod_template(doc, group.get("template"), f"{path}.template")
    if doc.kind == "RayJob" and spec.get("submitterPodTemplate") is not None:
        out += check_pod_template(doc, spec["submitterPodTemplate"], "spec.submitterPodTemplate")
    return out


# A kind is a CamelCase name, a group a DNS subdomain (apimachinery's IsDNS1123Subdomain): bounded, so that no kind
# ever becomes a file name too long for kubernetes-validate's schema lookup.
KIND = re.compile(r"^[A-Za-z][A-Za-z0-9]{0,62}$")
API_VERSION = re.compile(r"^([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?v[0-9]{1,9}((alpha|beta)[0-9]{1,9})?$")


def _not_an_object(doc: Doc) -> list[Problem]:
    """The top-level fields every later step reads, of the types they must have: one problem each, never a traceback."""
    out = []
    for key, pattern, what in (("apiVersion", API_VERSION, "group/version, e.g. apps/v1 (v1 for the core group)"),
                               ("kind", KIND, "a kind name, e.g. ConfigMap")):
        value = doc.obj.get(key)
        if not isinstance(value, str) or not value.strip():
            out.append(Problem(doc.source, "", key, f"is {value!r}, not a string.",
                               f"write it as a string, e.g. {key}: {'v1' if key == 'apiVersion' else 'ConfigMap'}"))
        elif not pattern.match(value):  # the API server has no such resource (and it must never name a file path)
            out.append(Problem(doc.source, "", key, f"{shown(value)} is not {what.split(', e.g.')[0]}.", f"write {what}"))
    meta = doc.obj.get("metadata")
    if meta is not None and not isinstance(meta, dict):
        out.append(Problem(doc.source, "", "metadata", f"is {type(meta).__name__}, not a mapping.",
                           "write it as indented fields, e.g. metadata: {name: my-object}"))
    return out


def validate_sets(sets: list[list[Doc]], crd_dir: Path, values: Path | None = None,
                  chart: Path | None = None, gates: FeatureGates | None = None,
                  queues: kueue.Queues | None = None) -> list[Problem]:
    gates = gates or FeatureGates()
    problems: list[Problem] = []
    for docs in sets:
        checkable: list[Doc] = []  # objects whose shape is right: the cross-checks would misread the others
        for doc in docs:
            shape = _not_an_object(doc)
            if shape:
                problems.extend(shape)
                continue
            if doc.kind == "Cluster" and str(doc.obj.get("apiVersion", "")).startswith("kind.x-k8s.io/"):
                continue  # a kind cluster config (manifests/kind-config.yaml), not a Kubernetes object
            if not doc.name and not doc.generate_name:
                problems.append(doc.problem("metadata.name", "is missing.", "give the object a name"))
                continue
            named, notes = _named(doc)
            problems.extend(notes)
            is_ray = str(doc.obj.get("apiVersion", "")).split("/")[0] == RAY_GROUP
            is_core = not is_ray and is_kubernetes_group(str(doc.obj.get("apiVersion")))
            if not is_ray and not is_core:  # another operator's kind: its CRD's schema, if given, and the metadata
                found = check_other_crd(named, crd_dir)
                if not [p for p in found if p.is_error]:
                    found += check_object_meta(named, custom=True)
                problems.extend(dataclasses.replace(p, obj=doc.ref) for p in found)
                continue
            schema_problems = check_ray_schema(named, crd_dir) if is_ray else check_core_schema(named)
            if is_ray and not schema_problems:  # the API server evaluates the CRD's CEL rules on a valid shape
                schema_problems = check_cel(named, crd_dir)
            problems.extend(dataclasses.replace(p, obj=doc.ref) for p in schema_problems)
            if schema_problems:
                continue
            stored = with_defaults(named, crd_dir) if is_ray else named
            if is_ray:  # the rules assume the shapes the schema guarantees; the operator never sees a refused one
                problems.extend(_rules_of(doc, stored, gates))
                if queues is not None:
                    problems.extend(dataclasses.replace(p, obj=doc.ref) for p in kueue.check_fits(stored, queues))
            else:
                problems.extend(dataclasses.replace(p, obj=doc.ref) for p in check_core_object(named))
            checkable.append(stored)
        problems.extend(raytrain_rules.cross_check(checkable, lambda name: target_cluster(name, docs, values, chart)))
    return problems


def target_cluster(name: str, docs: list[Doc], values: Path | None, chart: Path | None) -> tuple[list[Doc], list[Problem]]:
    """The cluster a clusterSelector RayJob runs on: a RayCluster of that name in the same manifest set, else the
    chart rendered as `helm install <name>` with the given values file (default: the chart's values.yaml). The
    chart: `chart`, else the values file's own folder when it holds a chart, else helm/raytrain-cluster."""
    if any(d.kind == "RayCluster" and d.name == name for d in docs):
        return docs, []
    if chart is None:
        chart = Path(values).parent if values and _is_chart(Path(values).parent) else default_chart_dir()
    return render_set(Path(chart), Path(values) if values else None, release_name=name)


def validate_paths(paths: Sequence[Path], crd_dir: Path, values: Path | None = None,
                   chart: Path | None = None, gates: FeatureGates | None = None,
                   kueue_queues: Path | None = None) -> list[Problem]:
    """Check charts (rendered with each of their values*.yaml), values files (rendered with their chart),
    rendered YAML and manifest files or directories. Returns errors and notes (Problem.is_error); no errors
    means valid.

    `values` picks the chart values that the target of a clusterSelector RayJob is rendered with (default: the
    chart's values.yaml); `chart` the chart (default: the values file's folder if it is a chart, else
    helm/raytrain-cluster); a values file given as a path outside any chart is rendered with that chart too.
    `gates` the KubeRay operator's feature gates (default: v1.7.0's defaults). `kueue_queues` a YAML file of Kueue
    ClusterQueues and LocalQueues: a queued RayJob or RayCluster is checked against its ClusterQueue's quota.
    """
    crd_dir = Path(crd_dir)
    try:
        for kind in CRD_FILES:  # fail once, clearly, when the CRDs are missing
            crd_validator(str(crd_dir), kind)
    except CRDError as exc:
        return [Problem(str(crd_dir), "", "", str(exc), "download the KubeRay v1.7.0 CRDs")]
    queues = None
    if kueue_queues is not None:
        try:
            queues = kueue.load_queues(Path(kueue_queues))
        except kueue.QueuesFileError as exc:
            message, fix = split_fix(str(exc).removeprefix(f"{kueue_queues}: "))
            return [Problem(str(kueue_queues), "", "", message, fix if " Fix: " in str(exc) else
                            "write ClusterQueues and LocalQueues as Kueue's documentation shows "
                            "(examples/kueue/queues.yaml)")]
    sets, problems = collect_sets(paths, chart)
    problems += [Problem(file, "", "", f"is in the CRD directory but cannot be read as YAML ({why}), so the CRDs it "
                         "may hold are not used.", "fix or remove the file") for file, why in
                 other_crds(str(crd_dir)).unreadable]
    return problems + validate_sets(sets, crd_dir, values, chart, gates, queues)
