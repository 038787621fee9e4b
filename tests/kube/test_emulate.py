"""Unit tests of the emulate pieces that need no running cluster: cluster shapes from RayCluster specs, `ray start`
commands, the K8sJobMode submitter command, ConfigMap materialisation, status output and stale-run cleanup.
The real clusters are in tests/integration/test_emulate.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.support import checks

from raytrain.kube import localcluster
from raytrain.kube.emulate import (
    JobInput, RayJobError, RayJobStatus, cluster_spec, load_rayjob, local_runtime_env, materialise_configmaps,
    new_job_id, submitter_script,
)
from raytrain.kube.localcluster import (
    ClusterError, NodeSpec, Ports, cluster_shape, parse_quantity, parse_resources_param, ray_start_command,
)

REPO = Path(__file__).resolve().parents[2]
GiB = 2**30


def group(cpu="1", memory="2Gi", params=None, replicas=None, name="worker", **extra):
    spec = {"groupName": name, "rayStartParams": params or {},
            "template": {"spec": {"containers": [{"name": "ray", "resources": {"limits": {"cpu": cpu, "memory": memory}}}]}},
            **extra}
    if replicas is not None:
        spec["replicas"] = replicas
    return spec


@pytest.mark.parametrize("text, value", [
    ("500m", 0.5), ("2", 2), ("4Gi", 4 * GiB), ("1G", 1e9), ("128Mi", 128 * 2**20), ("1e3", 1000), (3, 3),
])
def test_parse_quantity(text, value):
    assert parse_quantity(text) == value


@pytest.mark.parametrize("text", ["", "two", "4GB", "1.5.2", "-1"])
def test_parse_quantity_rejects_bad_input_naming_the_field(text):
    with pytest.raises(ClusterError, match=r"spec\.x: .* is not a Kubernetes quantity"):
        parse_quantity(text, "spec.x")


@pytest.mark.parametrize("text, value", [
    ('"{\\"TPU\\": 4}"', {"TPU": 4.0}), ('{"a": 1, "b": 0.5}', {"a": 1.0, "b": 0.5}), ("'{\"x\": 2}'", {"x": 2.0}),
])
def test_parse_resources_param(text, value):
    assert parse_resources_param(text, "w") == value


@pytest.mark.parametrize("text", ["{TPU: 4}", '["TPU"]', '{"TPU": "four"}'])
def test_parse_resources_param_rejects(text):
    with pytest.raises(ClusterError, match="rayStartParams.resources"):
        parse_resources_param(text, "g.rayStartParams.resources")


def test_shape_of_the_chart_with_kind_values():
    """The RayCluster the chart renders for kind: head 1 CPU, two 1-CPU workers, token auth on."""
    job = load_rayjob(REPO / "manifests" / "rayjob.yaml")
    spec, name, owned = cluster_spec(job, REPO / "helm" / "raytrain-cluster" / "values-kind.yaml")
    assert (name, owned) == ("raytrain", False)
    shape = cluster_shape(spec, max_worker_nodes=4, memory_budget=64 * GiB)
    assert shape.auth_token
    assert [(n.name, n.num_cpus, n.memory) for n in shape.nodes] == [
        ("head", 1, 2 * GiB), ("worker-0", 1, 2 * GiB), ("worker-1", 1, 2 * GiB)]
    assert shape.notes == []


def test_shape_rules_follow_kuberay():
    spec = {"headGroupSpec": group(cpu="1500m", params={"num-cpus": "0"}),
            "workerGroupSpecs": [group(cpu="500m", memory="1Gi", replicas=2,
                                       params={"resources": '"{\\"CUSTOM\\": 2}"', "object-store-memory": "100000000"}),
                                 group(name="off", replicas=3, suspend=True),
                                 group(name="minonly", minReplicas=1)]}
    shape = cluster_shape(spec, max_worker_nodes=8, memory_budget=64 * GiB)
    assert shape.head.num_cpus == 0  # rayStartParams win over limits
    worker = shape.workers[0]
    assert worker.num_cpus == 1  # 500m rounds up, as KubeRay's quantity.Value() does
    assert worker.memory == GiB and worker.resources == {"CUSTOM": 2.0}
    assert worker.params == {"object-store-memory": "100000000"}  # passed through; resources handled
    assert [n.name for n in shape.workers] == ["worker-0", "worker-1", "minonly-0"]
    assert any("off: suspended" in note for note in shape.notes)
    assert not shape.auth_token


def test_shape_is_capped_with_a_note():
    spec = {"headGroupSpec": group(), "workerGroupSpecs": [group(replicas=5, memory="4Gi")]}
    shape = cluster_shape(spec, max_worker_nodes=2, memory_budget=64 * GiB)
    assert len(shape.workers) == 2
    assert any("5 replica(s) asked, 2 started" in note for note in shape.notes)
    tight = cluster_shape(spec, max_worker_nodes=8, memory_budget=10 * GiB)
    assert len(tight.workers) == 1  # head 2Gi + one 4Gi worker (+ overheads) fit 10 GiB, two do not


def test_shape_without_head_group_names_the_field():
    with pytest.raises(ClusterError, match=r"rayClusterSpec\.headGroupSpec: missing"):
        cluster_shape({"workerGroupSpecs": []})
    with pytest.raises(ClusterError, match=r"headGroupSpec\.template\.spec\.containers"):
        cluster_shape({"headGroupSpec": {"rayStartParams": {}}})


def test_ray_start_command_for_head_and_worker():
    ports = Ports()
    head = ray_start_command(NodeSpec("head", "head", True, num_cpus=0, memory=2 * GiB, params={"disable-usage-stats": "true"}),
                             ray_bin="ray", node_ip="10.0.0.2", temp_dir="/tmp/x", ports=ports, head_address=None,
                             dashboard_host="0.0.0.0")
    assert head[:2] == ["ray", "start"] and "--head" in head and "--block" in head
    assert "--num-cpus=0" in head and f"--memory={2 * GiB}" in head and "--dashboard-host=0.0.0.0" in head
    assert any(a.startswith("--object-store-memory=") for a in head)  # kept inside the pod's memory
    worker = ray_start_command(NodeSpec("w", "w", False, resources={"A": 1}), ray_bin="ray", node_ip="10.0.0.3",
                               temp_dir="/tmp/y", ports=ports, head_address="10.0.0.2:6379", dashboard_host="x")
    assert "--address=10.0.0.2:6379" in worker and '--resources={"A":1}' in worker and "--head" not in worker
    with pytest.raises(ClusterError, match="head's address"):
        ray_start_command(NodeSpec("w", "w", False), ray_bin="ray", node_ip="1", temp_dir="/t", ports=ports,
                          head_address=None, dashboard_host="x")


def test_ports_pick_distinct():
    ports = list(vars(Ports.pick()).values())
    assert len(set(ports)) == len(ports)


JOB = """
apiVersion: ray.io/v1
kind: RayJob
metadata: {name: demo}
spec:
  entrypoint: raytrain run job.yaml --name demo --storage /mnt/shared/runs --address auto
  runtimeEnvYAML: |
    working_dir: /etc/raytrain-job
    env_vars: {A: "1"}
  metadata: {team: ml}
  entrypointNumCpus: 1
  submitterPodTemplate:
    spec:
      containers:
      - name: s
        volumeMounts: [{name: job, mountPath: /etc/raytrain-job}]
      volumes:
      - name: job
        configMap: {name: demo-job, items: [{key: job.yaml, path: job.yaml}]}
  clusterSelector: {ray.io/cluster: raytrain}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: demo-job}
data:
  job.yaml: "train: {epochs: 2}\\n"
  other: ignored
"""


def test_configmaps_become_the_submitters_working_dir(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(JOB)
    job = load_rayjob(path)
    mounts = materialise_configmaps(job, tmp_path / "sub")
    assert list(mounts) == ["/etc/raytrain-job"]
    assert sorted(p.name for p in mounts["/etc/raytrain-job"].iterdir()) == ["job.yaml"]  # items select keys
    env = local_runtime_env(job, mounts)
    assert env == {"working_dir": str(mounts["/etc/raytrain-job"]), "env_vars": {"A": "1"}}


def test_unmounted_working_dir_is_an_error_naming_the_fix(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(JOB.replace("mountPath: /etc/raytrain-job", "mountPath: /etc/other"))
    job = load_rayjob(path)
    with pytest.raises(RayJobError, match=r"working_dir /etc/raytrain-job is not mounted .* Fix: mount"):
        local_runtime_env(job, materialise_configmaps(job, tmp_path / "sub"))


def test_missing_configmap_is_an_error(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(JOB.split("---")[0])
    with pytest.raises(RayJobError, match=r"ConfigMap 'demo-job' .* Fix: add the ConfigMap"):
        materialise_configmaps(load_rayjob(path), tmp_path / "sub")


@pytest.mark.parametrize("text, message", [
    ("kind: ConfigMap\nmetadata: {name: a}\n", "holds 0 RayJob objects"),
    ("kind: RayJob\nmetadata: {name: a}\nspec: {}\n", "spec.entrypoint is missing"),
    ("kind: RayJob\nspec: {entrypoint: x}\n", "metadata.name is missing"),
    ("kind: [\n", "is not valid YAML"),
])
def test_bad_rayjob_files(tmp_path, text, message):
    path = tmp_path / "job.yaml"
    path.write_text(text)
    with pytest.raises(RayJobError, match=message):
        load_rayjob(path)


def test_submitter_script_is_kuberays_k8s_job_mode_command(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(JOB)
    job = load_rayjob(path)
    script = submitter_script(job, "http://10.0.0.2:8265", "demo-abcde", {"working_dir": "/w"},
                              job.spec["entrypoint"])
    # wait for the dashboard, skip a duplicate submission, submit without waiting, follow the logs
    order = ["/api/gcs_healthz", "if ! ray job status --address http://10.0.0.2:8265 demo-abcde",
             "then ray job submit --address http://10.0.0.2:8265 --no-wait", "--runtime-env-json",
             "--metadata-json", "--submission-id demo-abcde", "--entrypoint-num-cpus 1.000000",
             "-- raytrain run job.yaml --name demo", "; fi ;",
             "ray job logs --address http://10.0.0.2:8265 --follow demo-abcde"]
    positions = [script.index(part) for part in order]
    assert positions == sorted(positions), script
    assert '\'{"working_dir":"/w"}\'' in script


def test_job_ids_are_kuberay_shaped(tmp_path):
    job = JobInput(tmp_path, {"metadata": {"name": "demo"}, "spec": {}}, {})
    ids = {new_job_id(job) for _ in range(5)}
    assert len(ids) == 5 and all(i.startswith("demo-") and len(i) == len("demo-") + 5 for i in ids)
    fixed = JobInput(tmp_path, {"metadata": {"name": "demo"}, "spec": {"jobId": "mine"}}, {})
    assert new_job_id(fixed) == "mine"


def test_status_output_is_read_back_by_the_shared_checks():
    status = RayJobStatus(job_id="d-1", job_status="FAILED", deployment="Failed", reason="AppFailed",
                          message="boom", failed=1, train_worker_nodes=["head", "worker-0"])
    output = "logs...\n" + status.as_yaml("demo") + "cluster removed\n"
    rayjob = checks.rayjob_from_emulate_output(output)
    checks.assert_job_failed(rayjob, "AppFailed")
    with pytest.raises(AssertionError):
        checks.assert_job_succeeded(rayjob)
    assert checks.train_worker_nodes(output) == ["head", "worker-0"]


def test_run_checks_on_a_run_directory(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("x: 1\n")
    (run / "metrics.jsonl").write_text("".join(json.dumps({"epoch": e}) + "\n" for e in range(1, 11)))
    (run / "events.jsonl").write_text(json.dumps({"event": "start", "resumed_from_epoch": None}) + "\n"
                                      + json.dumps({"event": "start", "resumed_from_epoch": 5}) + "\n")
    (run / "result.json").write_text(json.dumps({"status": "succeeded", "epochs_completed": 10}))
    (run / "checkpoint_epoch000010_ab").mkdir()
    checks.assert_run_completed(run, 10)
    assert checks.assert_resumed(run, newest_checkpoint_before=5, epoch_before=7, interval=5)["resumed_from_epoch"] == 5
    with pytest.raises(AssertionError, match="lost 6 epochs"):
        checks.assert_resumed(run, epoch_before=11, interval=5)
    with pytest.raises(AssertionError, match="older than the newest checkpoint"):
        checks.assert_resumed(run, newest_checkpoint_before=10)
    with open(run / "metrics.jsonl", "a") as handle:
        handle.write(json.dumps({"epoch": 10}) + "\n")
    with pytest.raises(AssertionError, match=r"more than once.*\[10\]"):
        checks.assert_run_completed(run, 10)


def test_clean_stale_removes_dead_runs_and_keeps_live_and_kept_ones(tmp_path):
    me = {"owner_pid": os.getpid(), "owner_started": localcluster.process_start(os.getpid()), "nodes": []}
    dead = {"owner_pid": os.getpid(), "owner_started": -1.0, "nodes": []}  # same PID, other start: a reused PID
    for name, state in [("rte000001", me), ("rte000002", dead), ("rte000003", {**dead, "keep": True})]:
        (tmp_path / name).mkdir()
        (tmp_path / name / "state.json").write_text(json.dumps(state))
    (tmp_path / "rte000002-shared").mkdir()  # the shared storage outlives its cluster
    (tmp_path / "rtx000004").mkdir()  # not ours
    assert localcluster.clean_stale(root=tmp_path) == ["rte000002"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rte000001", "rte000002-shared", "rte000003", "rtx000004"]
