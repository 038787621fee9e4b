"""Unit tests of the emulate pieces that need no running cluster: RayJob files, ConfigMap materialisation, job ids
and status output. The real clusters are in tests/integration/test_emulate.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.support import checks
from tests.support.cli import exit_status

from raytrain.cluster import localcluster
from raytrain.cluster.suspend import SUSPEND_FILE, set_suspend, suspend_refusal, write_status, write_suspend
from raytrain.cluster.rayjobfile import (
    JobInput, RayJobError, container_env, load_rayjob, local_runtime_env, materialise_configmaps, new_job_id, resolve_env,
)
from raytrain.cluster.emulate import RayJobStatus
from raytrain.cluster.localcluster import cluster_shape
from raytrain.platform.processes import process_start

REPO = Path(__file__).resolve().parents[2]


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


# --------------------------------------------------------------------------------------------------- suspend
# `raytrain cluster suspend|unsuspend RUN_ID` against run directories as a running emulation leaves them (written
# with its own writers; the emulation's owner is this test process, alive, or a pid reused since).

RUN_ID = "rte0000aa"


def _run_dir(root: Path, owner: str | None = "alive", deployment: str | None = "Running", suspend: str | None = None,
             refused: str = "") -> None:
    run_dir = root / RUN_ID
    run_dir.mkdir()
    if owner:
        started = process_start(os.getpid())
        (run_dir / "state.json").write_text(json.dumps({
            "run_id": RUN_ID, "owner_pid": os.getpid(),
            "owner_started": started if owner == "alive" else started + 1}))
    if deployment:
        write_status(run_dir, "demo", deployment, refused)
    if suspend in ("true", "false"):
        write_suspend(run_dir, suspend == "true")
    elif suspend is not None:
        (run_dir / SUSPEND_FILE).write_text(suspend)


@pytest.fixture
def run_root(tmp_path, monkeypatch):
    monkeypatch.setattr(localcluster, "RUN_ROOT", tmp_path)  # where this test's run directories are
    return tmp_path


@pytest.mark.parametrize("run_id, layout, suspend, message", [
    ("nope", None, True, r"'nope' is not an emulated cluster's run id \(rte and 6 hex digits\)\. Fix: pass the run id"),
    (RUN_ID, None, True, r"no emulated cluster rte0000aa \(.*state.json is missing .*\): its `raytrain emulate` has "
                         r"ended, or the id is mistyped\. Fix:"),
    (RUN_ID, {"deployment": None}, True, r"rte0000aa runs no RayJob \(.*rayjob-status.json is missing .*\): only `raytrain "
                                         r"emulate` acts on spec.suspend\. Fix:"),
    (RUN_ID, {"owner": "reused"}, False, r"the `raytrain emulate` of rte0000aa is not running .* Fix:"),
    (RUN_ID, {"refused": "KubeRay v1.7.0 marks ... Fix: x"}, True, r"^RayJob demo: KubeRay v1.7.0 marks"),
    (RUN_ID, {"deployment": "Complete"}, True, r"RayJob demo is Complete: KubeRay v1.7.0 suspends only an "
                                               r"Initializing or Running RayJob .* Fix: nothing to suspend"),
    (RUN_ID, {"suspend": "true"}, True, r"spec.suspend is already true \(jobDeploymentStatus Running\)\. Fix: "
                                         r"`raytrain cluster unsuspend rte0000aa` to resume it"),
    (RUN_ID, {"suspend": "false"}, False, r"spec.suspend is already false .* Fix: `raytrain cluster suspend "
                                          r"rte0000aa` first"),
    (RUN_ID, {}, False, r"spec.suspend is already false"),  # no file yet: the emulation starts with false
    (RUN_ID, {"deployment": "Suspended", "suspend": "yes"}, False,
     r"rayjob-suspend: holds 'yes', not true or false \(the RayJob's spec.suspend\)\. Fix:"),
])
def test_suspend_requests_that_cannot_be_done_say_why_and_the_fix(run_root, run_id, layout, suspend, message):
    if layout is not None:
        _run_dir(run_root, **layout)
    spec_file = run_root / RUN_ID / SUSPEND_FILE
    before = spec_file.read_text() if spec_file.exists() else None
    with pytest.raises(RayJobError, match=message) as raised:
        set_suspend(run_id, suspend)
    assert "\n" not in str(raised.value)
    assert (spec_file.read_text() if spec_file.exists() else None) == before  # nothing written


@pytest.mark.parametrize("deployment, before, suspend, after", [
    ("Running", "false", True, "true"),
    ("Initializing", None, True, "true"),  # KubeRay suspends from Initializing too
    ("Suspended", "true", False, "false"),
    ("Suspending", "true", False, "false"),  # KubeRay ends the Suspending first, then sees false
    ("Complete", "true", False, "false"),  # a suspend that came too late can be taken back
])
def test_suspend_and_unsuspend_write_spec_suspend(run_root, deployment, before, suspend, after):
    _run_dir(run_root, deployment=deployment, suspend=before)
    said = set_suspend(RUN_ID, suspend)
    assert said.startswith(f"RayJob demo: spec.suspend set to {after}")
    assert (run_root / RUN_ID / SUSPEND_FILE).read_text() == after + "\n"


def test_the_cli_says_a_refusal_in_one_line(run_root, capsys):
    _run_dir(run_root, suspend="true")
    assert exit_status(["cluster", "suspend", RUN_ID]) == 1
    err = capsys.readouterr().err
    assert err.startswith("raytrain: error: cluster suspend: RayJob demo: spec.suspend is already true")
    assert err.count("\n") == 1 and "Traceback" not in err
    assert exit_status(["cluster", "unsuspend", RUN_ID]) == 0
    assert "spec.suspend set to false" in capsys.readouterr().out
    assert exit_status(["cluster", "unsuspend", "rte0000ab"]) == 1
    assert "no emulated cluster rte0000ab" in capsys.readouterr().err


@pytest.mark.parametrize("manifest, refused", [
    ("rayjob-standalone.yaml", None),  # its own cluster, shutdownAfterJobFinishes: true
    ("rayjob.yaml", "clusterSelector RayJob ValidationFailed"),
])
def test_which_rayjobs_kuberay_suspends(manifest, refused):
    job = load_rayjob(REPO / "manifests" / manifest)
    reason = suspend_refusal(job.spec, owns_cluster=bool(job.spec.get("rayClusterSpec")))
    assert (reason == "") if refused is None else (refused in reason and "Fix:" in reason), reason


@pytest.mark.parametrize("spec, owns, refused", [
    ({"shutdownAfterJobFinishes": True}, True, ""),
    ({}, True, "shutdownAfterJobFinishes false"),
    ({"shutdownAfterJobFinishes": False}, True, "shutdownAfterJobFinishes false"),
    ({"shutdownAfterJobFinishes": True}, False, "clusterSelector"),
])
def test_suspend_refusals_follow_kuberays_validation(spec, owns, refused):
    reason = suspend_refusal(spec, owns)
    assert refused in reason and (reason == "") == (refused == "")


# ----------------------------------------------------------------------------------------------------------
# A Ray container's environment as kubelet builds it (kubelet_pods.go makeEnvironmentVariables): envFrom sources in
# order, then env; a later name wins. Secrets and ConfigMaps come from the RayJob's file.

SOURCES = [
    {"kind": "Secret", "metadata": {"name": "s3"}, "stringData": {"AWS_ACCESS_KEY_ID": "id", "bad-name": "x"},
     "data": {"AWS_SECRET_ACCESS_KEY": "c2VjcmV0", "AWS_ACCESS_KEY_ID": "b2xk"}},  # base64 of "secret", "old"
    {"kind": "ConfigMap", "metadata": {"name": "endpoint"}, "data": {"AWS_ENDPOINT_URL": "http://127.0.0.1:9000"}},
]


def env_job(tmp_path, sources=SOURCES) -> JobInput:
    configmaps = {d["metadata"]["name"]: d for d in sources if d["kind"] == "ConfigMap"}
    return JobInput(tmp_path / "job.yaml", {"metadata": {"name": "demo"}, "spec": {}}, configmaps,
                    [d for d in sources if d["kind"] != "ConfigMap"])


@pytest.mark.parametrize("container, expected", [
    ({"envFrom": [{"secretRef": {"name": "s3"}}]},  # stringData over data, as the API server merges them
     {"AWS_SECRET_ACCESS_KEY": "secret", "AWS_ACCESS_KEY_ID": "id"}),
    ({"envFrom": [{"secretRef": {"name": "s3"}, "prefix": "X_"}, {"configMapRef": {"name": "endpoint"}}]},
     {"X_AWS_SECRET_ACCESS_KEY": "secret", "X_AWS_ACCESS_KEY_ID": "id", "AWS_ENDPOINT_URL": "http://127.0.0.1:9000"}),
    ({"envFrom": [{"secretRef": {"name": "s3"}}], "env": [{"name": "AWS_ACCESS_KEY_ID", "value": "literal"}]},
     {"AWS_SECRET_ACCESS_KEY": "secret", "AWS_ACCESS_KEY_ID": "literal"}),  # env over envFrom
    ({"env": [{"name": "K", "valueFrom": {"secretKeyRef": {"name": "s3", "key": "AWS_SECRET_ACCESS_KEY"}}},
              {"name": "E", "valueFrom": {"configMapKeyRef": {"name": "endpoint", "key": "AWS_ENDPOINT_URL"}}},
              {"name": "T", "valueFrom": {"secretKeyRef": {"name": "s3", "key": "AWS_SESSION_TOKEN", "optional": True}}},
              {"name": "P", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]},
     {"K": "secret", "E": "http://127.0.0.1:9000"}),  # no pod fields here: fieldRef is left out
    ({"envFrom": [{"secretRef": {"name": "absent", "optional": True}}],
      "env": [{"name": "A", "valueFrom": {"secretKeyRef": {"name": "absent", "key": "k", "optional": True}}}]}, {}),
])
def test_a_containers_env_is_what_kubelet_gives_it(tmp_path, container, expected):
    env = container_env(env_job(tmp_path), container, "spec.rayClusterSpec.headGroupSpec.template.spec.containers[0]")
    assert {e["name"]: e["value"] for e in env} == expected


@pytest.mark.parametrize("container, message", [
    ({"envFrom": [{"secretRef": {"name": "absent"}}]},
     "containers[0].envFrom[0].secretRef takes the environment from Secret 'absent', which the file does not hold: "
     "kubelet would keep the pod in CreateContainerConfigError. Fix: add the Secret to the same file"),
    ({"env": [{"name": "A", "valueFrom": {"configMapKeyRef": {"name": "absent", "key": "k"}}}]},
     "containers[0].env[0].valueFrom.configMapKeyRef takes the environment from ConfigMap 'absent'"),
    ({"env": [{"name": "A", "valueFrom": {"secretKeyRef": {"name": "s3", "key": "AWS_SESSION_TOKEN"}}}]},
     "Secret 's3' has no key 'AWS_SESSION_TOKEN' (it has: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, bad-name)"),
])
def test_a_missing_env_source_is_named_with_the_fix(tmp_path, container, message):
    with pytest.raises(RayJobError) as caught:
        container_env(env_job(tmp_path), container, "spec.rayClusterSpec.headGroupSpec.template.spec.containers[0]")
    assert message in str(caught.value) and "RayJob/demo" in str(caught.value)


def test_a_secret_that_is_not_base64_is_named(tmp_path):
    bad = [{"kind": "Secret", "metadata": {"name": "s3"}, "data": {"AWS_ACCESS_KEY_ID": "not base64!"}}]
    with pytest.raises(RayJobError, match=r"Secret/s3: data.AWS_ACCESS_KEY_ID is not base64 .* Fix: encode it"):
        container_env(env_job(tmp_path, bad), {"envFrom": [{"secretRef": {"name": "s3"}}]}, "x")


def test_the_s3_rayjob_gives_every_node_the_secrets_environment(tmp_path):
    """manifests/rayjob-s3.yaml with its Secret in the file: the head and every worker node start with the keys."""
    secret = ("---\napiVersion: v1\nkind: Secret\nmetadata: {name: raytrain-s3}\n"
              "stringData: {AWS_ACCESS_KEY_ID: id, AWS_SECRET_ACCESS_KEY: key, AWS_ENDPOINT_URL: 'http://127.0.0.1:9'}\n")
    path = tmp_path / "rayjob-s3.yaml"
    path.write_text((REPO / "manifests" / "rayjob-s3.yaml").read_text() + secret)
    job = load_rayjob(path)
    spec = resolve_env(job, job.spec["rayClusterSpec"], "spec.rayClusterSpec")
    shape = cluster_shape(spec, max_worker_nodes=3, memory_budget=2**40)
    assert len(shape.nodes) == 4
    for node in shape.nodes:
        assert {k: node.env.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL")} == \
            {"AWS_ACCESS_KEY_ID": "id", "AWS_SECRET_ACCESS_KEY": "key", "AWS_ENDPOINT_URL": "http://127.0.0.1:9"}
        assert node.env["RAY_JOB_STOP_WAIT_TIME_S" if node.head else "AWS_ACCESS_KEY_ID"]  # literal env kept too
    path.write_text((REPO / "manifests" / "rayjob-s3.yaml").read_text())
    job = load_rayjob(path)
    with pytest.raises(RayJobError, match=r"headGroupSpec.template.spec.containers\[0\].envFrom\[0\].secretRef .* "
                                          r"Secret 'raytrain-s3', which the file does not hold"):
        resolve_env(job, job.spec["rayClusterSpec"], "spec.rayClusterSpec")
