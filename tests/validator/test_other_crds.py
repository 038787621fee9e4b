"""Kinds of other operators' CRDs (issue 40): the API server accepts a Gateway API Gateway, a Kueue or Volcano Queue
wherever its CRD is installed, so `raytrain validate` notes that it has no schema for it instead of refusing it, and
checks it against its CRD when the CRD directory (--crds DIR) holds one. A kind that a group of Kubernetes' own
lacks is still refused: the API server has no such resource."""

from __future__ import annotations

import json
import shutil
from importlib import resources
from pathlib import Path

import pytest
import yaml

from raytrain.validator.validate import KUBERNETES_GROUPS, KUBE_VERSION, validate_paths

DATA = Path(__file__).parent / "data"
GATEWAY_SAMPLE = DATA / "kuberay-v1.7.0-ray-cluster-agc-gatewayapi.yaml"
GATEWAY_CLASS_CRD = DATA / "gateway-api-v1.6.1-gatewayclasses-crd.yaml"
# KubeRay v1.7.0's config/samples/gateway-api/istio-class.yaml
ISTIO_CLASS = {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "GatewayClass", "metadata": {"name": "istio"},
               "spec": {"controllerName": "istio.io/gateway-controller"}}


def _write(tmp_path: Path, *objects: dict) -> Path:
    path = tmp_path / "objects.yaml"
    path.write_text(yaml.safe_dump_all(objects, sort_keys=False))
    return path


def _crds_with(tmp_path: Path, crd_dir: Path, *extra: Path) -> Path:
    """A --crds directory: KubeRay's two CRDs and the given files."""
    directory = tmp_path / "crds"
    directory.mkdir()
    for source in [*Path(crd_dir).glob("ray.io_*.yaml"), *extra]:
        shutil.copy(source, directory / source.name)
    return directory


@pytest.mark.parametrize("api_version, kind, severity, words", [
    ("gateway.networking.k8s.io/v1", "Gateway", "note", "Gateway (gateway.networking.k8s.io/v1) is not checked: no schema"),
    ("gateway.networking.k8s.io/v1", "HTTPRoute", "note", "is not checked: no schema"),
    ("kueue.x-k8s.io/v1beta1", "ClusterQueue", "note", "is not checked: no schema"),
    ("example.com/v1alpha1", "Widget", "note", "is not checked: no schema"),
    ("scheduling.volcano.sh/v1beta1", "Queue", "note", "is not checked: no schema"),
    # Kubernetes' own groups: the API server serves every kind they have, and no other
    ("v1", "Pod2", "error", "Pod2 is not a kind of v1 in Kubernetes"),
    ("apps/v1", "Deploymnet", "error", "Deploymnet is not a kind of apps/v1"),
    ("networking.k8s.io/v1", "Gateway", "error", "Gateway is not a kind of networking.k8s.io/v1"),
    ("storage.k8s.io/v1", "Bucket", "error", "Bucket is not a kind of storage.k8s.io/v1"),
])
def test_a_kind_without_a_schema_is_a_note_unless_kubernetes_serves_its_group(crd_dir, tmp_path, api_version, kind,
                                                                               severity, words):
    path = _write(tmp_path, {"apiVersion": api_version, "kind": kind, "metadata": {"name": "a"}, "spec": {"x": 1}})
    [problem] = validate_paths([path], crd_dir)
    assert problem.severity == severity and words in problem.message and problem.field == "kind", str(problem)
    assert str(path) == problem.file and problem.obj == f"{kind}/a" and problem.fix


def test_kuberays_gateway_api_sample_passes_with_notes(crd_dir):
    problems = validate_paths([GATEWAY_SAMPLE], crd_dir)
    assert [(p.severity, p.obj) for p in problems] == [("note", "Gateway/ray-cluster-gateway"),
                                                       ("note", "HTTPRoute/ray-cluster-http-route")]
    assert all("put the CRD's YAML file in a directory with KubeRay's and pass --crds DIR" in p.fix for p in problems)


def test_the_metadata_of_another_operators_kind_is_still_checked(crd_dir, tmp_path):
    """The API server's ObjectMeta rules hold for every kind, whatever its CRD."""
    path = _write(tmp_path, {**ISTIO_CLASS, "metadata": {"name": "istio", "labels": {"app": "a b"}}})
    [error] = [p for p in validate_paths([path], crd_dir) if p.is_error]
    assert error.field == "metadata.labels.app" and "not a valid label value" in error.message


# (case, edit of KubeRay's istio GatewayClass sample, field, words): checked against Gateway API v1.6.1's CRD
GATEWAY_CLASS_BROKEN = [
    ("unknown field", {"spec": {"controllerName": "istio.io/gateway-controller", "colour": "blue"}}, "spec.colour",
     "unknown field 'colour'"),
    ("missing controllerName", {"spec": {"description": "no controller"}}, "spec.controllerName", "is required"),
    ("controllerName without a path", {"spec": {"controllerName": "istio"}}, "spec.controllerName", "does not match"),
    ("a version the CRD does not serve", {"apiVersion": "gateway.networking.k8s.io/v1alpha9"}, "apiVersion",
     "is not a version its CRD gatewayclasses.gateway.networking.k8s.io serves (served: v1, v1beta1)"),
]


@pytest.mark.parametrize("case, edit, field, words", GATEWAY_CLASS_BROKEN, ids=[c[0] for c in GATEWAY_CLASS_BROKEN])
def test_a_crd_in_the_crd_directory_checks_its_kind(crd_dir, tmp_path, case, edit, field, words):
    crds = _crds_with(tmp_path, crd_dir, GATEWAY_CLASS_CRD)
    assert validate_paths([_write(tmp_path, ISTIO_CLASS)], crds) == []  # KubeRay's sample, now checked
    problems = validate_paths([_write(tmp_path, {**ISTIO_CLASS, **edit})], crds)
    assert [(p.severity, p.field, words in p.message) for p in problems] == [("error", field, True)], \
        "\n".join(map(str, problems))


def test_an_unreadable_file_in_the_crd_directory_is_one_problem(crd_dir, tmp_path):
    crds = _crds_with(tmp_path, crd_dir, GATEWAY_CLASS_CRD)
    (crds / "broken.yaml").write_text("kind: CustomResourceDefinition\nspec: {group: a\n")
    problems = validate_paths([_write(tmp_path, ISTIO_CLASS)], crds)
    assert [(p.file, "cannot be read as YAML" in p.message) for p in problems] == [(str(crds / "broken.yaml"), True)]


def test_the_kubernetes_groups_are_those_kubernetes_validate_has_schemas_for():
    """KUBERNETES_GROUPS decides which kinds must have a schema: it is exactly the groups of the definitions."""
    folder = resources.files("kubernetes_validate") / "kubernetes-json-schema" / f"v{KUBE_VERSION}.0-local-strict"
    definitions = json.loads((folder / "_definitions.json").read_text())["$defs"]
    groups = {gvk["group"] for schema in definitions.values() for gvk in schema.get("x-kubernetes-group-version-kind", [])}
    assert groups == KUBERNETES_GROUPS


@pytest.mark.parametrize("schema", [{"type": 5}, {"type": "object", "properties": []},
                                    {"type": "object", "properties": {"spec": {"type": "object", "properties": {
                                        "controllerName": {"type": "string", "pattern": "("}}}}}])
def test_a_crd_whose_schema_is_no_schema_is_one_problem_naming_its_file(crd_dir, tmp_path, schema):
    crd = yaml.safe_load(GATEWAY_CLASS_CRD.read_text())
    for version in crd["spec"]["versions"]:
        version["schema"]["openAPIV3Schema"] = schema
    broken = tmp_path / "gatewayclasses.yaml"
    broken.write_text(yaml.safe_dump(crd))
    crds = _crds_with(tmp_path, crd_dir, broken)
    [problem] = validate_paths([_write(tmp_path, ISTIO_CLASS)], crds)
    assert problem.file == str(crds / "gatewayclasses.yaml") and "cannot be used" in problem.message, str(problem)
    assert "GatewayClass/istio is not checked" in problem.message and problem.fix
