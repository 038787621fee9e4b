"""The whole user path on a real Kubernetes cluster: scripts/kind-e2e creates a kind cluster, installs the KubeRay
operator v1.7.0, builds and loads our image, serves ReadWriteMany storage from an in-cluster NFS server,
`helm install`s our chart, applies manifests/rayjob.yaml twice (the second time deleting a worker pod
mid-training) and tears it all down. This test runs it and checks what it copied out of the cluster with the
emulate tier's assertions (tests/support/checks.py, through tests/e2e/kind_artifacts.py).

Needs Docker (an engine that answers), kind, helm, kubectl and internet (images are pulled); about 20-40 minutes.
    .venv/bin/python -m pytest -m e2e tests/e2e/test_kind.py -v
Settings of the script pass through (STORAGE=hostpath, SKIP_BUILD=1, ARTIFACTS=...); RAYTRAIN_E2E_KEEP=1 adds
--keep; RAYTRAIN_E2E_REQUIRED=1 (CI) turns a missing prerequisite into a failure instead of a skip.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.e2e import kind_artifacts

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "kind-e2e"
# Bounded: the script's own waits add up to less (cluster 900 s, each job 1200 s, kill 600 s) plus build and pulls.
TIMEOUT_S = int(os.environ.get("RAYTRAIN_E2E_TIMEOUT", "5400"))


def missing_prerequisite() -> str | None:
    """Why the kind tier cannot run here, or None."""
    tools = {"docker": os.environ.get("DOCKER", "docker"), "kind": os.environ.get("KIND", "kind"),
             "helm": os.environ.get("HELM", "helm"), "kubectl": os.environ.get("KUBECTL", "kubectl")}
    missing = [name for name, command in tools.items() if not shutil.which(command)]
    if missing:
        return f"needs {', '.join(missing)} (not installed; `scripts/kind-e2e` prints how to install each)"
    try:
        info = subprocess.run([tools["docker"], "info"], capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return "no Docker engine answers (docker info timed out)"
    if info.returncode != 0:
        return f"no Docker engine answers (docker info: {(info.stderr or info.stdout).strip().splitlines()[-1:]})"
    return None


def manifest_epochs() -> int:
    docs = list(yaml.safe_load_all((REPO / "manifests" / "rayjob.yaml").read_text()))
    [config_map] = [d for d in docs if d["kind"] == "ConfigMap"]
    return yaml.safe_load(config_map["data"]["job.yaml"])["train"]["epochs"]


def test_user_path_on_kind_with_a_lost_worker_pod(tmp_path):
    reason = missing_prerequisite()
    if reason and os.environ.get("RAYTRAIN_E2E_REQUIRED") == "1":
        pytest.fail(f"RAYTRAIN_E2E_REQUIRED=1 but the kind tier cannot run: {reason}")
    if reason:
        pytest.skip(reason)
    artifacts = Path(os.environ.get("ARTIFACTS") or tmp_path / "artifacts")
    args = [str(SCRIPT)] + (["--keep"] if os.environ.get("RAYTRAIN_E2E_KEEP") == "1" else [])
    log = artifacts.parent / "kind-e2e.log"
    artifacts.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as out:
        try:
            code = subprocess.run(args, cwd=REPO, env={**os.environ, "ARTIFACTS": str(artifacts)}, stdout=out,
                                  stderr=subprocess.STDOUT, timeout=TIMEOUT_S).returncode
        except subprocess.TimeoutExpired:
            code = None
    output = log.read_text()
    assert code is not None, f"scripts/kind-e2e did not finish in {TIMEOUT_S} s; its output ended:\n{output[-6000:]}"
    assert code == 0, f"scripts/kind-e2e failed ({code}); logs in {artifacts / 'logs'}; its output ended:\n{output[-6000:]}"

    epochs = manifest_epochs()
    first = kind_artifacts.check_run(artifacts / "run1", epochs)
    assert not (artifacts / "run1" / "killed.json").exists()
    second = kind_artifacts.check_run(artifacts / "run2", epochs)
    assert (artifacts / "run2" / "killed.json").is_file(), "run 2 recorded no deleted worker pod"
    print(first)
    print(second)
