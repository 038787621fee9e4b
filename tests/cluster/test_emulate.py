"""Unit tests of the emulate pieces that need no running cluster: RayJob files, ConfigMap materialisation, job ids
and status output. The real clusters are in tests/integration/test_emulate.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support import checks

from raytrain.cluster.emulate import (
    JobInput, RayJobError, RayJobStatus, load_rayjob, local_runtime_env, materialise_configmaps, new_job_id,
)

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
