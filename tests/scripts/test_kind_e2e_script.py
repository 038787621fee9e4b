"""scripts/kind-e2e offline: shellcheck, the plan it prints (steps, every docker/kind/helm/kubectl command), the
manifests and chart values it applies validate, its dry run, its refusal when tools are missing, and the
artifact checks it runs after each RayJob. The kind run itself is tests/e2e/test_kind.py (marker e2e).

    .venv/bin/python -m pytest tests/scripts/test_kind_e2e_script.py -v
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from raytrain.validator.crds import CRDS_ENV, CRDError, resolve_crd_dir
from raytrain.validator.render import render_chart
from tests.e2e import kind_artifacts, kind_capacity
from tests.support.cli import Done
from tests.support.tools import require_tool

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "kind-e2e"
CHART = REPO / "helm" / "raytrain-cluster"
RAYTRAIN = str(Path(sys.executable).parent / "raytrain")
PLACEHOLDER_IP = "10.96.0.100"  # stands in for <nfs-server-cluster-ip>, known only on a live cluster
STEPS = ["Preflight", "Validate offline", "kind cluster", "KubeRay operator v1.7.0", "Image", "Shared storage",
         "Capacity", "Our chart", "RayJob run 1", "RayJob run 2", "Teardown"]


def in_process(main, argv: list[str], capsys) -> Done:
    """A helper's main(argv) in this process, as `python -m tests.e2e.NAME` would run it (without the import time)."""
    capsys.readouterr()
    try:
        code = main(argv)
    except SystemExit as stop:
        code = stop.code
    out, err = capsys.readouterr()
    return Done(code, out, err)


def crd_dir() -> Path:
    try:
        return resolve_crd_dir(None, os.environ.get(CRDS_ENV))
    except CRDError as exc:
        pytest.fail(str(exc))


def script(*args: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess:
    # KIND/HELM point nowhere: whatever this machine has installed, the script can never create a cluster here.
    # RAYTRAIN: this interpreter's, wherever its venv is (the script's default is the checkout's .venv).
    full_env = {**os.environ, "KIND": "/nonexistent/kind", "HELM": "/nonexistent/helm", "RAYTRAIN": RAYTRAIN, **env}
    return subprocess.run([str(SCRIPT), *args], cwd=REPO, env=full_env, capture_output=True, text=True,
                          timeout=timeout)


def plan(tmp_path: Path, *args: str, **env: str) -> str:
    result = script("--plan", *args, ARTIFACTS=str(tmp_path / "artifacts"), **env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert not (tmp_path / "artifacts").exists(), "--plan created the artifacts directory"
    return result.stdout


def commands(output: str) -> list[list[str]]:
    """The printed commands ('+ ' lines), split as the shell would (a pipe or redirection stays a word)."""
    return [shlex.split(line[2:]) for line in output.splitlines() if line.startswith("+ ")]


def tool(words: list[str]) -> str:
    return Path(words[0]).name


def chart_install(output: str) -> list[str]:
    [words] = [w for w in commands(output) if tool(w) == "helm" and "raytrain" in w and "upgrade" in w]
    return words


def values_of(words: list[str]) -> tuple[list[Path], dict[str, str]]:
    files, sets = [], {}
    for flag, value in zip(words, words[1:]):
        if flag == "-f":
            files.append(REPO / value)
        elif flag == "--set":
            key, _, val = value.partition("=")
            sets[key] = val
    return files, sets


# --------------------------------------------------------------------------------------------------- the script

def test_shellcheck_passes():
    result = subprocess.run([require_tool("shellcheck"), "--external-sources", str(SCRIPT)], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_usage_and_bad_settings_are_refused(tmp_path):
    help_ = script("--help")
    assert help_.returncode == 0 and help_.stdout.startswith("usage: scripts/kind-e2e"), help_.stdout
    bad = script("--bogus")
    assert bad.returncode == 2 and "usage: scripts/kind-e2e" in bad.stderr, bad.stderr
    storage = script("--plan", STORAGE="ceph")
    assert storage.returncode == 2 and "STORAGE must be nfs or hostpath" in storage.stderr, storage.stderr


def test_plan_prints_every_step_in_order(tmp_path):
    output = plan(tmp_path)
    titles = [line for line in output.splitlines() if line.startswith("== ")]
    assert len(titles) == len(STEPS), titles
    for number, (title, expected) in enumerate(zip(titles, STEPS), start=1):
        assert title.startswith(f"== {number}. {expected}"), (title, expected)


def test_plan_commands_follow_the_user_path(tmp_path):
    lines = [" ".join(words).replace(str(tmp_path / "artifacts"), "/ARTIFACTS") for words in commands(plan(tmp_path))]

    def index(fragment: str) -> int:
        found = [i for i, line in enumerate(lines) if fragment in line]
        assert found, f"no command containing {fragment!r} in the plan:\n" + "\n".join(lines)
        return found[0]

    order = [
        "raytrain validate manifests/kind-config.yaml manifests/rayjob.yaml manifests/kind/nfs-server.yaml",
        "kind create cluster --config manifests/kind-config.yaml --name raytrain",
        "helm repo add kuberay https://ray-project.github.io/kuberay-helm/",
        "helm pull kuberay/kuberay-operator --version 1.7.0",
        "apply --server-side --force-conflicts -f",  # the CRDs
        "wait --for=condition=Established crd/rayclusters.ray.io crd/rayjobs.ray.io",
        "upgrade --install kuberay-operator",
        "scripts/build-image",
        # Docker 29's containerd image store breaks `kind load docker-image` (kind issue 3795): an archive loads.
        "docker save --output /ARTIFACTS/work/image.tar ghcr.io/raytrain/raytrain:0.1.0-ray2.60.0",
        "kind load image-archive /ARTIFACTS/work/image.tar --name raytrain",
        # nfsd checked in the kernel that runs the node, whatever the host OS, before waiting on the NFS server.
        "docker exec raytrain-control-plane sh -c grep -qw nfsd /proc/filesystems || modprobe nfsd",
        "apply -f manifests/kind/nfs-server.yaml",
        "rollout status deployment/nfs-server",
        "template raytrain helm/raytrain-cluster",
        "get node raytrain-control-plane -o json",
        "tests.e2e.kind_capacity --node /ARTIFACTS/work/node.json --pods /ARTIFACTS/work/pods.json "
        "/ARTIFACTS/work/chart.yaml manifests/rayjob.yaml",
        "upgrade --install raytrain helm/raytrain-cluster",
        "wait --for=jsonpath={.status.state}=ready raycluster/raytrain",
        "apply -f manifests/rayjob.yaml",
        "get rayjob raytrain-linear -o jsonpath={.status.jobDeploymentStatus} {.status.jobStatus}",
        "tests.e2e.kind_artifacts",  # run 1 checked
        "delete -f manifests/rayjob.yaml",
        # The pod loss waits on the first complete checkpoint, not on polled epoch counts.
        "timeout 600 sh -c until ls /mnt/shared/runs/linear/checkpoint_*/meta.json",
        "delete pod <worker-pod>",
        "--killed-pod <worker-pod>",  # run 2 checked, resume included
        "kind delete cluster --name raytrain",
    ]
    positions = [index(fragment) for fragment in order]
    assert positions == sorted(positions), list(zip(order, positions))
    assert "--skip-crds" in lines[index("upgrade --install kuberay-operator")]
    assert not [line for line in lines if "kind load docker-image" in line or "--kind-load" in line]
    assert not [line for line in lines if "metrics.jsonl | wc -l" in line and "delete pod" not in line
                and lines.index(line) < index("delete pod <worker-pod>")], "epoch polling before the pod loss"


def test_every_cluster_command_targets_the_kind_context_only(tmp_path):
    for words in commands(plan(tmp_path)):
        if tool(words) == "kubectl":
            assert words[1:3] == ["--context", "kind-raytrain"], words
        if tool(words) == "helm" and words[1] not in ("repo", "pull", "template"):
            assert words[1:3] == ["--kube-context", "kind-raytrain"], words


def test_keep_and_hostpath_change_the_plan(tmp_path):
    kept = plan(tmp_path, "--keep")
    assert "Teardown" not in kept and "kind delete cluster" not in kept
    hostpath = plan(tmp_path, STORAGE="hostpath")
    assert "nfs-server" not in hostpath.replace("hostPath fallback", "")
    files, sets = values_of(chart_install(hostpath))
    assert files == [CHART / "values-kind.yaml"] and sets == {}, (files, sets)


def test_the_manifests_it_applies_validate(raytrain, tmp_path):
    applied = []
    for words in commands(plan(tmp_path)):
        if tool(words) == "kubectl" and "apply" in words:
            path = words[words.index("-f") + 1]
            if not path.startswith(str(tmp_path)):  # the KubeRay CRDs come from the downloaded chart
                applied.append(path)
    assert applied == ["manifests/kind/nfs-server.yaml", "manifests/rayjob.yaml", "manifests/rayjob.yaml"], applied
    result = raytrain("validate", "manifests/kind-config.yaml", *sorted(set(applied)), "--values", str(CHART / "values-kind.yaml"),
                      "--crds", str(crd_dir()), cwd=REPO)
    assert result.returncode == 0, result.output


def test_the_kind_config_is_what_the_script_and_the_values_expect(tmp_path):
    config = yaml.safe_load((REPO / "manifests" / "kind-config.yaml").read_text())
    assert "+ mkdir -p " + config["nodes"][0]["extraMounts"][0]["hostPath"] in plan(tmp_path)
    assert config["kind"] == "Cluster" and config["apiVersion"] == "kind.x-k8s.io/v1alpha4"
    assert config["name"] == "raytrain"  # the script's CLUSTER default, and `kind load --name`
    [mount] = config["nodes"][0]["extraMounts"]
    values = yaml.safe_load((CHART / "values-kind.yaml").read_text())
    assert mount["containerPath"] == values["sharedStorage"]["hostPath"]
    # raytrain validate accepts it: test_the_manifests_it_applies_validate runs it with the manifests.


def test_the_chart_as_installed_on_nfs_renders_validates_and_fits_the_rayjob(raytrain, tmp_path):
    """`helm upgrade --install` exactly as planned, rendered offline by the Helm library (what helm template and
    --dry-run=client do), then checked with raytrain validate together with the RayJob that runs on it."""
    files, sets = values_of(chart_install(plan(tmp_path)))
    assert sets.pop("sharedStorage.nfs.server") == "<nfs-server-cluster-ip>"
    sets["sharedStorage.nfs.server"] = PLACEHOLDER_IP
    objects = render_chart(CHART, files, sets, release_name="raytrain")
    by_kind = {o["kind"]: o for o in objects}
    assert by_kind["PersistentVolume"]["spec"]["nfs"] == {"server": PLACEHOLDER_IP, "path": "/"}
    assert by_kind["PersistentVolumeClaim"]["metadata"]["name"] == "raytrain-shared"
    assert by_kind["PersistentVolumeClaim"]["spec"]["accessModes"] == ["ReadWriteMany"]
    head = by_kind["RayCluster"]["spec"]["headGroupSpec"]["template"]["spec"]
    [shared] = [v for v in head["volumes"] if v["name"] == "shared"]
    assert shared == {"name": "shared", "persistentVolumeClaim": {"claimName": "raytrain-shared"}}
    together = tmp_path / "set"
    together.mkdir()
    (together / "chart.yaml").write_text(yaml.safe_dump_all(objects))
    shutil.copy(REPO / "manifests" / "rayjob.yaml", together / "rayjob.yaml")
    result = raytrain("validate", str(together), "--crds", str(crd_dir()), cwd=REPO)
    assert result.returncode == 0, result.output


def test_dry_run_validates_for_real_and_touches_no_cluster(tmp_path):
    artifacts = tmp_path / "artifacts"
    result = script("--dry-run", ARTIFACTS=str(artifacts), RAYTRAIN_KUBERAY_CRDS=str(crd_dir()), timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "raytrain validate: OK (manifests/kind-config.yaml, manifests/rayjob.yaml, manifests/kind/nfs-server.yaml)" \
        in result.stdout, result.stdout
    assert "(helm not installed: helm template skipped)" in result.stdout
    assert not (artifacts / "run1").exists()


def test_missing_tools_are_named_with_how_to_install_them(tmp_path):
    result = script(ARTIFACTS=str(tmp_path / "artifacts"))
    assert result.returncode == 1, result.stdout + result.stderr
    missing = re.search(r"kind-e2e: missing: (.*) \(how to install each is above\)", result.stderr)
    assert missing and {"kind", "helm"} <= set(missing.group(1).split()), result.stderr
    assert "kind: go install sigs.k8s.io/kind@" in result.stderr
    assert "helm: https://helm.sh/docs/intro/install/" in result.stderr
    assert "== 2." not in result.stdout, "went past the preflight"


# --------------------------------------------------------------------------------------------------- artifact checks

def status(deployment: str, job: str) -> dict:
    return {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": "raytrain-linear"},
            "status": {"jobDeploymentStatus": deployment, "jobStatus": job}}


@pytest.mark.parametrize("case, rayjob, expected", [
    ("no status file", None, "no RayJob status"),
    ("job failed", status("Failed", "FAILED"), "RayJob did not succeed"),
    ("still running", status("Running", "RUNNING"), "RayJob did not succeed"),
    ("succeeded but no run files", status("Complete", "SUCCEEDED"), "no run directory"),
])
def test_artifact_checks_fail_with_the_reason(capsys, tmp_path, case, rayjob, expected):
    if rayjob is not None:
        (tmp_path / "rayjob.yaml").write_text(yaml.safe_dump(rayjob))
    result = in_process(kind_artifacts.main, [str(tmp_path), "--epochs", "60"], capsys)
    assert result.returncode == 1, (case, result.stdout, result.stderr)
    assert expected in result.stderr, (case, result.stderr)


def test_killed_pod_needs_what_the_resume_check_uses(tmp_path):
    # `python -m`, as the script runs it (the other checks call its main() in this process)
    result = subprocess.run([sys.executable, "-m", "tests.e2e.kind_artifacts", str(tmp_path), "--epochs", "60",
                             "--killed-pod", "w-1", "--interval", "5"], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 2 and "--killed-pod needs --epoch-before, --newest-checkpoint-before" in result.stderr
    assert not (tmp_path / "killed.json").exists()


def plan_text(artifacts: str) -> str:
    return script("--plan", ARTIFACTS=artifacts).stdout


def test_artifact_checks_get_the_epochs_of_the_manifest():
    """The epochs the script passes come from the manifest the user applies (not a copy in the script)."""
    docs = list(yaml.safe_load_all((REPO / "manifests" / "rayjob.yaml").read_text()))
    [config_map] = [d for d in docs if d["kind"] == "ConfigMap"]
    epochs = yaml.safe_load(config_map["data"]["job.yaml"])["train"]["epochs"]
    assert f"kind_artifacts {{ARTIFACTS}}/run1 --epochs {epochs}" in plan_text("{ARTIFACTS}"), "run 1's epochs"


def test_skip_build_loads_the_image_already_built_through_an_archive(tmp_path):
    words = commands(plan(tmp_path, SKIP_BUILD="1"))
    assert not [w for w in words if w[0] == "scripts/build-image"]
    loads = [w for w in words if tool(w) in ("docker", "kind") and ("save" in w or "load" in w)]
    assert [w[:3] for w in loads] == [["docker", "save", "--output"], ["/nonexistent/kind", "load", "image-archive"]]


# --------------------------------------------------------------------------------------------------- capacity preflight

def kind_node(cpu: str, memory: str) -> dict:
    return {"metadata": {"name": "raytrain-control-plane"}, "status": {"allocatable": {"cpu": cpu, "memory": memory}}}


def node_pod(name: str, cpu: str, memory: str, node: str = "raytrain-control-plane", phase: str = "Running") -> dict:
    return {"metadata": {"name": name}, "status": {"phase": phase},
            "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu, "memory": memory}}}]}}


# What a fresh kind node runs before the chart (kube-system, the KubeRay operator, the NFS server) requests.
KIND_SYSTEM_PODS = {"items": [node_pod("kube-apiserver", "250m", "0"), node_pod("kube-controller-manager", "200m", "0"),
                              node_pod("kube-scheduler", "100m", "0"), node_pod("etcd", "100m", "100Mi"),
                              node_pod("coredns-1", "100m", "70Mi"), node_pod("coredns-2", "100m", "70Mi"),
                              node_pod("kindnet", "100m", "50Mi"), node_pod("kuberay-operator", "100m", "512Mi"),
                              node_pod("nfs-server", "100m", "128Mi"),
                              node_pod("elsewhere", "8", "64Gi", node="other-node"),
                              node_pod("done", "8", "64Gi", phase="Succeeded")]}


def capacity(tmp_path: Path, capsys, node: dict, pods: dict = KIND_SYSTEM_PODS) -> Done:
    files, sets = values_of(chart_install(plan(tmp_path)))
    sets["sharedStorage.nfs.server"] = PLACEHOLDER_IP
    (tmp_path / "chart.yaml").write_text(yaml.safe_dump_all(render_chart(CHART, files, sets, release_name="raytrain")))
    (tmp_path / "node.json").write_text(json.dumps(node))
    (tmp_path / "pods.json").write_text(json.dumps(pods))
    return in_process(kind_capacity.main, ["--node", str(tmp_path / "node.json"), "--pods", str(tmp_path / "pods.json"),
                                           str(tmp_path / "chart.yaml"), str(REPO / "manifests" / "rayjob.yaml")], capsys)


def test_capacity_says_what_a_4_cpu_docker_vm_is_short_of(capsys, tmp_path):
    result = capacity(tmp_path, capsys, kind_node("4", "8025424Ki"))
    assert result.returncode == 1, result.stdout + result.stderr
    # head + 2 workers (1 CPU, 2Gi each) and the submitter (500m, 512Mi) on top of 1.15 CPU already requested.
    assert "pods on it request 1.15 CPU" in result.stderr and "to apply 3.5 CPU, 6.5Gi" in result.stderr
    assert "RayCluster raytrain worker: 1 CPU, 2.0Gi" in result.stderr
    assert "short by 0.65 CPU: pods would stay Pending" in result.stderr and "memory" not in result.stderr.split("short by")[1].split(":")[0]
    assert "Docker Desktop: Settings > Resources" in result.stderr


def test_capacity_passes_where_the_node_has_room_and_names_memory_when_it_is_short(capsys, tmp_path):
    roomy = capacity(tmp_path, capsys, kind_node("8", "16Gi"))
    assert roomy.returncode == 0 and "to apply 3.5 CPU, 6.5Gi" in roomy.stdout, roomy.stdout + roomy.stderr
    tight = capacity(tmp_path, capsys, kind_node("8", "6Gi"))
    assert tight.returncode == 1 and "short by 1.4Gi of memory" in tight.stderr, tight.stderr
