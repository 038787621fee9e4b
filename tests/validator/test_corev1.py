"""`raytrain validate` is as strict as the API server (core/v1 validation, apimachinery's helpers) and KubeRay: each
mistake the schemas cannot say is one problem naming the file, the object, the field and the fix; inputs that are
not objects, or not UTF-8, are one problem each; an input with nothing in it says so."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from raytrain.validator.validate import validate_paths

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "raytrain-cluster"
SA = REPO / "manifests" / "rayjob-standalone.yaml"
HEAD_POD = ["spec", "rayClusterSpec", "headGroupSpec", "template", "spec"]
HEAD_C = HEAD_POD + ["containers", 0]
WORKER0 = ["spec", "rayClusterSpec", "workerGroupSpecs", 0]
DELETE = object()

CORE = """
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, labels: {app: web}}
spec:
  replicas: 1
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      volumes: [{name: cache, emptyDir: {}}]
      containers:
      - name: web
        image: nginx:1.27
        ports: [{containerPort: 80}]
        resources: {requests: {cpu: 100m, memory: 64Mi}, limits: {cpu: 200m, memory: 128Mi}}
        volumeMounts: [{name: cache, mountPath: /cache}]
---
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  selector: {app: web}
  ports: [{port: 80, targetPort: 80}]
---
apiVersion: v1
kind: ConfigMap
metadata: {name: settings}
data: {settings.yaml: "a: 1"}
"""
CONTAINER = ["spec", "template", "spec", "containers", 0]


def _edit(docs: list[dict], kind: str, path: list, value) -> None:
    [doc] = [d for d in docs if d["kind"] == kind]
    node = doc
    for key in path[:-1]:
        node = node[key] if isinstance(node, list) or key in node else node.setdefault(key, {})
    if value is DELETE:
        node.pop(path[-1], None)
    else:
        node[path[-1]] = value


def _write(tmp_path: Path, docs: list[dict], edits) -> Path:
    docs = copy.deepcopy(docs)
    for kind, path, value in edits:
        _edit(docs, kind, path, value)
    out = tmp_path / "objects.yaml"
    out.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    return out


def test_the_bases_are_valid(crd_dir, tmp_path):
    assert validate_paths([_write(tmp_path, list(yaml.safe_load_all(CORE)), [])], crd_dir) == []
    # the standalone RayJob names the local build's image (the README sets the user's own): a note, no error
    assert [p for p in validate_paths([SA], crd_dir) if p.severity != "note"] == []


# (case, kind, edits, field, words): on the core objects above
CORE_BROKEN = [
    ("label value with a space", "Deployment", [(["metadata", "labels", "app"], "a b")],
     "metadata.labels.app", "is not a valid label value"),
    ("label value with NUL", "Deployment", [(["metadata", "labels", "app"], "a\x00b")],
     "metadata.labels.app", "is not a valid label value"),
    ("label value over 63", "Deployment", [(["metadata", "labels", "app"], "a" * 64)],
     "metadata.labels.app", "is not a valid label value"),
    ("label key with a space", "Deployment", [(["metadata", "labels", "a b"], "x")],
     "metadata.labels", "is not a valid label key"),
    ("label key over 63", "Service", [(["metadata", "labels"], {"k" * 64: "x"})],
     "metadata.labels", "is not a valid label key"),
    ("annotation key with a space", "Service", [(["metadata", "annotations"], {"a b": "x"})],
     "metadata.annotations", "is not a valid annotation key"),
    ("name not a subdomain", "ConfigMap", [(["metadata", "name"], "Settings_1")],
     "metadata.name", "is not a DNS subdomain"),
    ("Service name not DNS-1035", "Service", [(["metadata", "name"], "1web")],
     "metadata.name", "is not a DNS-1035 label"),
    ("ConfigMap key with a space", "ConfigMap", [(["data"], {"my key": "x"})],
     "data", "is not a valid ConfigMap key"),
    ("ConfigMap key '..'", "ConfigMap", [(["data"], {"..": "x"})], "data", "is not a valid ConfigMap key"),
    ("negative memory request", "Deployment", [(CONTAINER + ["resources", "requests", "memory"], "-1Gi")],
     "spec.template.spec.containers[0].resources.requests.memory", "negative"),
    ("request over limit", "Deployment", [(CONTAINER + ["resources", "requests", "cpu"], "2")],
     "spec.template.spec.containers[0].resources.requests.cpu", "more than the limit"),
    ("container name with a space", "Deployment", [(CONTAINER + ["name"], "my web")],
     "spec.template.spec.containers[0].name", "is not a DNS-1123 label"),
    ("duplicate volumes", "Deployment", [(["spec", "template", "spec", "volumes"],
                                          [{"name": "cache", "emptyDir": {}}, {"name": "cache", "emptyDir": {}}])],
     "spec.template.spec.volumes[1].name", "already names volumes[0]"),
    ("duplicate volumeMounts", "Deployment", [(CONTAINER + ["volumeMounts"], [{"name": "cache", "mountPath": "/c"},
                                                                               {"name": "cache", "mountPath": "/c"}])],
     "spec.template.spec.containers[0].volumeMounts[1].mountPath", "already mounted"),
    ("mount of a missing volume", "Deployment", [(CONTAINER + ["volumeMounts", 0, "name"], "cash")],
     "spec.template.spec.containers[0].volumeMounts[0].name", "is not a volume of the pod"),
    ("runAsUser -1", "Deployment", [(["spec", "template", "spec", "securityContext"], {"runAsUser": -1})],
     "spec.template.spec.securityContext.runAsUser", "between 0 and"),
    ("seccompProfile.type Bogus", "Deployment", [(CONTAINER + ["securityContext"], {"seccompProfile": {"type": "Bogus"}})],
     "spec.template.spec.containers[0].securityContext.seccompProfile.type", "not RuntimeDefault"),
    ("image with a space", "Deployment", [(CONTAINER + ["image"], "nginx :1.27")],
     "spec.template.spec.containers[0].image", "whitespace"),
    ("empty image", "Deployment", [(CONTAINER + ["image"], "")], "spec.template.spec.containers[0].image", "is empty"),
    ("containerPort 70000", "Deployment", [(CONTAINER + ["ports", 0, "containerPort"], 70000)],
     "spec.template.spec.containers[0].ports[0].containerPort", "not a port from 1 to 65535"),
    ("preStop exec without a command", "Deployment", [(CONTAINER + ["lifecycle"], {"preStop": {"exec": {"command": []}}})],
     "spec.template.spec.containers[0].lifecycle.preStop.exec.command", "needs a command"),
    ("toleration operator Bogus", "Deployment", [(["spec", "template", "spec", "tolerations"],
                                                   [{"key": "a", "operator": "Bogus"}])],
     "spec.template.spec.tolerations[0].operator", "not Equal or Exists"),
    ("Deployment replicas -1", "Deployment", [(["spec", "replicas"], -1)], "spec.replicas", "must be 0 or more"),
    ("Deployment replicas beyond int32", "Deployment", [(["spec", "replicas"], 2**31)], "spec.replicas",
     "beyond a 32-bit integer"),
    ("pod template annotations over 256 KiB", "Deployment",
     [(["spec", "template", "metadata", "annotations"], {"note": "x" * (256 * 1024)})],
     "spec.template.metadata.annotations", "above Kubernetes' 262144"),
    ("Service port 0", "Service", [(["spec", "ports", 0, "port"], 0)], "spec.ports[0].port", "not a port"),
    ("two unnamed Service ports", "Service", [(["spec", "ports"], [{"port": 80}, {"port": 81}])],
     "spec.ports[0].name", "required when a Service has several ports"),
]


@pytest.mark.parametrize("case,kind,edits,field,words", CORE_BROKEN, ids=[c[0] for c in CORE_BROKEN])
def test_core_objects_the_api_server_refuses(crd_dir, tmp_path, case, kind, edits, field, words):
    path = _write(tmp_path, list(yaml.safe_load_all(CORE)), [(kind, p, v) for p, v in edits])
    problems = [p for p in validate_paths([path], crd_dir) if p.is_error]
    assert any(p.field == field and words in p.message for p in problems), "\n".join(map(str, problems))
    for problem in problems:
        assert str(path) == problem.file and problem.obj.startswith(f"{kind}/") and problem.fix


# (case, edits on the standalone RayJob, field, words): KubeRay's pods and the API server's rules for them
RAY_BROKEN = [
    ("unknown metadata field", [(["metadata", "colour"], "blue")], "metadata.colour", "unknown field"),
    ("label value with a space", [(["metadata", "labels"], {"app": "a b"})], "metadata.labels.app",
     "not a valid label value"),
    ("head container name with a space", [(HEAD_C + ["name"], "ray head")], "{HEAD_C}.name", "DNS-1123 label"),
    ("head image empty", [(HEAD_C + ["image"], "")], "{HEAD_C}.image", "is empty"),
    ("head negative memory", [(HEAD_C + ["resources", "requests", "memory"], "-2Gi")],
     "{HEAD_C}.resources.requests.memory", "negative"),
    ("head containerPort 70000", [(HEAD_C + ["ports"], [{"containerPort": 70000, "name": "gcs"}])],
     "{HEAD_C}.ports[0].containerPort", "1 to 65535"),
    ("head runAsUser -1", [(HEAD_POD + ["securityContext"], {"runAsUser": -1})],
     "{HEAD_POD}.securityContext.runAsUser", "between 0 and"),
    ("submitterConfig.backoffLimit -1", [(["spec", "submitterConfig"], {"backoffLimit": -1})],
     "spec.submitterConfig.backoffLimit", "0 or more"),
    ("empty entrypoint", [(["spec", "entrypoint"], "")], "spec.entrypoint", "empty or missing"),
    ("missing entrypoint", [(["spec", "entrypoint"], DELETE)], "spec.entrypoint", "empty or missing"),
    ("groupName not a label value", [(WORKER0 + ["groupName"], "cpu workers")],
     "spec.rayClusterSpec.workerGroupSpecs[0].groupName", "not a valid label value"),
    ("runtimeEnvYAML nested 3000 deep", [(["spec", "runtimeEnvYAML"], "a: " + "[" * 3000 + "]" * 3000)],
     "spec.runtimeEnvYAML", "nests too deeply"),
    ("runtimeEnvYAML with a key twice", [(["spec", "runtimeEnvYAML"], "working_dir: a\nworking_dir: b\n")],
     "spec.runtimeEnvYAML", "found the key 'working_dir' twice"),
    ("num-cpus not a number", [(WORKER0 + ["rayStartParams"], {"num-cpus": "abc"})],
     "spec.rayClusterSpec.workerGroupSpecs[0].rayStartParams.num-cpus", "is not a number"),
    # issue 40: what the API server refuses that passed
    ("worker replicas beyond int32", [(WORKER0 + ["replicas"], 2**31), (WORKER0 + ["maxReplicas"], 2**31)],
     "spec.rayClusterSpec.workerGroupSpecs[0].replicas", "beyond a 32-bit integer (format: int32)"),
    ("maxReplicas beyond int32", [(WORKER0 + ["maxReplicas"], 2**40)],
     "spec.rayClusterSpec.workerGroupSpecs[0].maxReplicas", "beyond a 32-bit integer"),
    ("annotations over 256 KiB of UTF-8, under it in characters", [(["metadata", "annotations"], {"a": "é" * 140000})],
     "metadata.annotations", "total 280001 bytes, above Kubernetes' 262144"),
    ("worker pod annotations over 256 KiB", [(WORKER0 + ["template", "metadata", "annotations"], {"a": "x" * 262144})],
     "spec.rayClusterSpec.workerGroupSpecs[0].template.metadata.annotations", "above Kubernetes' 262144"),
]


def _field(text: str) -> str:
    def path(parts):
        return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts).lstrip(".")
    return text.replace("{HEAD_C}", path(HEAD_C)).replace("{HEAD_POD}", path(HEAD_POD))


@pytest.mark.parametrize("case,edits,field,words", RAY_BROKEN, ids=[c[0] for c in RAY_BROKEN])
def test_ray_objects_kuberay_or_the_api_server_refuses(crd_dir, tmp_path, case, edits, field, words):
    path = _write(tmp_path, [d for d in yaml.safe_load_all(SA.read_text()) if d], [("RayJob", p, v) for p, v in edits])
    problems = [p for p in validate_paths([path], crd_dir) if p.is_error]
    assert any(p.field == _field(field) and words in p.message for p in problems), "\n".join(map(str, problems))


@pytest.mark.parametrize("values, field, words", [
    ("head:\n  rayStartParams:\n    num-cpus: abc\n", "spec.headGroupSpec.rayStartParams.num-cpus", "is not a number"),
    ("worker:\n  tolerations: [{key: a, operator: Bogus}]\n", "spec.workerGroupSpecs[0].template.spec.tolerations[0]"
     ".operator", "not Equal or Exists"),
])
def test_values_files_whose_cluster_is_refused(crd_dir, tmp_path, values, field, words):
    path = tmp_path / "my-values.yaml"
    chosen = (Path(__file__).parents[1] / "support" / "chosen-values.yaml").read_text()  # what the chart asks for
    path.write_text(chosen + values)
    problems = validate_paths([path], crd_dir)
    assert any(p.field == field and words in p.message and str(path) in p.file for p in problems), \
        "\n".join(map(str, problems))


@pytest.mark.parametrize("name, content, words", [
    ("latin1.yaml", b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: caf\xe9}\n", "is not UTF-8 text (byte 0xe9 at line 3)"),
    ("latin1-values.yaml", b"worker:\n  image: caf\xe9\n", "is not UTF-8 text (byte 0xe9 at line 2)"),
    ("utf16.yaml", "apiVersion: v1\n".encode("utf-16"), "is not UTF-8 text"),
    ("kind.yaml", b"apiVersion: v1\nkind: 5\nmetadata: {name: a}\n", "kind: is 5, not a string"),
    ("api.yaml", b"apiVersion: 1\nkind: ConfigMap\nmetadata: {name: a}\n", "apiVersion: is 1, not a string"),
    ("list-kind.yaml", b"apiVersion: v1\nkind: [ConfigMap]\nmetadata: {name: a}\n", "kind: is ['ConfigMap']"),
    ("meta.yaml", b"apiVersion: v1\nkind: ConfigMap\nmetadata: [a]\n", "metadata: is list, not a mapping"),
    ("meta-str.yaml", b"apiVersion: v1\nkind: ConfigMap\nmetadata: a\n", "metadata: is str, not a mapping"),
    ("unknown.yaml", b"apiVersion: v1\nkind: ConfigMapp\nmetadata: {name: a}\n", "did you mean 'configmap'"),
    ("unknown-apps.yaml", b"apiVersion: apps/v1\nkind: Deploymnet\nmetadata: {name: a}\n", "did you mean 'deployment'"),
    ("dup.yaml", b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\ndata: {k: a, k: b}\n",
     "found the key 'k' twice"),
    ("deep.yaml", b"a: " + b"[" * 3000 + b"]" * 3000 + b"\n", "nest"),
    ("empty.yaml", b"", "nothing to check"),
    ("dashes.yaml", b"---\n---\n", "nothing to check"),
    ("comments.yaml", b"# only a comment\n", "nothing to check"),
])
def test_inputs_that_are_not_objects_are_one_problem(crd_dir, tmp_path, name, content, words):
    path = tmp_path / name
    path.write_bytes(content)
    problems = validate_paths([path], crd_dir)
    assert len(problems) == 1 and words in str(problems[0]) and str(path) in problems[0].file, \
        "\n".join(map(str, problems))


def test_an_empty_folder_has_nothing_to_check(crd_dir, tmp_path):
    [problem] = validate_paths([tmp_path], crd_dir)
    assert problem.is_error and "nothing to check" in problem.message


def test_another_operators_kind_is_a_note(crd_dir, tmp_path):
    path = tmp_path / "cert.yaml"
    path.write_text("apiVersion: cert-manager.io/v1\nkind: Certificate\nmetadata: {name: a}\n")
    [note] = validate_paths([path], crd_dir)
    assert not note.is_error and "not checked" in note.message
