"""How `raytrain emulate` ends a RayJob, decided against a fake cluster and a fake submitter (as Ray Train v2 tests
its controller against a DummyWorkerGroup): AppFailed and backoffLimit's retries on a new cluster, DeadlineExceeded
past activeDeadlineSeconds, SubmissionFailed once the submitter Job's retries are spent, a dead head counted as a
failed attempt, and Ctrl-C / SIGTERM tearing the cluster down. The real `emulate()` runs each time, with its real
submitter loop: the submitter is a real bash process (a fake script instead of `ray job submit`), signals are real,
and only LocalCluster and the dashboard's job status are stand-ins.

End to end, on real clusters, these paths are proven once in tests/integration/test_emulate.py (a failing
entrypoint's AppFailed and a killed emulate's leftovers; a killed driver's retry on a new cluster) and by every
integration test's real teardown (assert_torn_down)."""

from __future__ import annotations

import io
import os
import signal
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import ClassVar

import pytest
import yaml

from tests.support import checks

from raytrain.cluster import emulate as emulate_module
from raytrain.platform import processes


class FakeCluster:
    """What an Emulation uses of a LocalCluster, with no Ray: its run directory is real (status and spec.suspend are
    written there), its head lives unless a test kills it, and each start, restart, stop and keep is recorded."""

    instances: ClassVar[list[FakeCluster]] = []
    root: Path

    def __init__(self, shape, *, out, isolation, shared_dir, keep):
        self.run_id = f"rte{len(FakeCluster.instances):06x}"
        self.run_dir = FakeCluster.root / self.run_id
        self.run_dir.mkdir(parents=True)
        self.shape, self.out, self.isolation, self.keep = shape, out, "netns", keep
        self.shared_dir = FakeCluster.root / "shared"
        self.dashboard_url, self.token, self.token_path = "http://127.0.0.1:9", None, None
        self.head = SimpleNamespace(spec=shape.nodes[0], log=self.run_dir / "head.log")
        self.nodes = [self.head]  # no worker pods: none to lose or recreate
        self.head_dead = False
        self.events: list[str] = []
        FakeCluster.instances.append(self)

    def start(self) -> None:
        self.events.append("start")

    def restart(self) -> None:
        self.events.append("restart")

    def stop(self) -> None:
        self.events.append("stop")

    def mark_keep(self) -> None:
        self.events.append("keep")

    def client_env(self) -> dict[str, str]:
        return dict(os.environ)

    def shared_path(self, text: str) -> str:
        return text

    def node_exited(self, node) -> bool:
        return node is self.head and self.head_dead


class Submitter:
    """The submitter pod's command (a bash script of the test's own, whose sleep is named so that it can be found) and
    the Ray job status the dashboard answers after each of its runs, in turn (the last one repeated)."""

    def __init__(self, script: str, statuses: list[str | None]):
        self.marker = f"rtfake{uuid.uuid4().hex[:8]}"
        self.script = script.replace("@MARK@", self.marker)  # `exec -a @MARK@ sleep 600`: a sleep named so
        self.statuses = statuses
        self.asked: list[str] = []
        self.entrypoints: list[str] = []

    def submitter_script(self, spec, address, job_id, runtime_env, entrypoint) -> str:
        self.entrypoints.append(entrypoint)
        return self.script

    def job_info(self, url, token, job_id) -> dict | None:
        self.asked.append(job_id)
        status = self.statuses[min(len(self.asked), len(self.statuses)) - 1]
        return None if status is None else {"status": status, "message": f"job {job_id} {status}"}

    def processes(self) -> list[int]:
        return processes.pids_mentioning(self.marker)


@pytest.fixture
def fake(tmp_path, monkeypatch):
    FakeCluster.instances, FakeCluster.root = [], tmp_path / "runs"
    monkeypatch.setattr(emulate_module, "LocalCluster", FakeCluster)
    monkeypatch.setattr(emulate_module, "clean_stale", lambda out: [])  # /tmp's real runs are not this test's
    monkeypatch.setattr(emulate_module, "train_worker_nodes", lambda cluster: [])

    installed: list[Submitter] = []

    def install(script: str, statuses: list[str | None]) -> Submitter:
        submitter = Submitter(script, statuses)
        installed.append(submitter)
        monkeypatch.setattr(emulate_module, "submitter_script", submitter.submitter_script)
        monkeypatch.setattr(emulate_module, "job_info", submitter.job_info)
        return submitter

    yield install
    for submitter in installed:  # whatever a failing test left running
        processes.kill_pids(submitter.processes())


def rayjob(tmp_path: Path, entrypoint: str = "python train.py", **spec) -> Path:
    container = {"name": "ray", "image": "ghcr.io/raytrain/raytrain:0.1.0-ray2.60.0",
                 "resources": {"limits": {"cpu": "1", "memory": "1Gi"}}}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({
        "apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": "tiny"},
        "spec": {"entrypoint": entrypoint, **spec, "rayClusterSpec": {
            "rayVersion": "2.60.0",
            "headGroupSpec": {"rayStartParams": {}, "template": {"spec": {"containers": [container]}}}}},
    }))
    return path


def emulate(path: Path, crd_dir: Path, keep: bool = False) -> tuple[int, str, dict]:
    out = io.StringIO()
    code = emulate_module.emulate(path, None, keep, crd_dir, out=out)
    output = out.getvalue()
    status = checks.rayjob_from_emulate_output(output)["status"] if "\nkind: RayJob\n" in output else {}
    return code, output, status


def test_a_failed_job_is_app_failed_after_backoff_limit_retries_each_on_a_new_cluster(tmp_path, fake, crd_dir):
    submitter = fake("exit 0", ["FAILED"])
    code, output, status = emulate(rayjob(tmp_path, backoffLimit=1), crd_dir)
    assert code == 1, output
    assert (status["jobDeploymentStatus"], status["reason"], status["jobStatus"]) == ("Failed", "AppFailed", "FAILED")
    assert (status["failed"], status["succeeded"]) == (2, 0), status  # the first try and its one retry
    assert len(set(submitter.asked)) == 2, submitter.asked  # each attempt a new submission id
    assert status["jobId"] == submitter.asked[-1]
    assert "attempt 1 of 2 (backoffLimit 1): jobDeploymentStatus Retrying, a new submission on a new RayCluster" \
        in output, output
    [cluster] = FakeCluster.instances
    assert cluster.events == ["start", "restart", "stop"], cluster.events  # rayClusterSpec: a new cluster each retry
    assert submitter.entrypoints == ["python train.py"] * 2


def test_a_retry_that_succeeds_completes_with_the_failure_counted(tmp_path, fake, crd_dir):
    fake("exit 0", ["FAILED", "SUCCEEDED"])
    code, output, status = emulate(rayjob(tmp_path, backoffLimit=2), crd_dir)
    assert code == 0, output
    assert (status["jobDeploymentStatus"], status["jobStatus"], status["reason"]) == ("Complete", "SUCCEEDED", "")
    assert (status["failed"], status["succeeded"]) == (1, 1), status


def test_without_backoff_limit_a_failed_job_is_not_retried(tmp_path, fake, crd_dir):
    submitter = fake("exit 0", ["FAILED"])
    code, output, status = emulate(rayjob(tmp_path), crd_dir)
    assert code == 1 and status["reason"] == "AppFailed" and status["failed"] == 1, output
    assert len(submitter.asked) == 1 and "Retrying" not in output
    assert FakeCluster.instances[0].events == ["start", "stop"]


def test_past_active_deadline_seconds_the_job_fails_deadline_exceeded_and_the_submitter_is_deleted(
        tmp_path, fake, crd_dir):
    submitter = fake("exec -a @MARK@ sleep 600", ["RUNNING"])
    code, output, status = emulate(rayjob(tmp_path, activeDeadlineSeconds=1, backoffLimit=3), crd_dir)
    assert code == 1, output
    assert (status["jobDeploymentStatus"], status["reason"]) == ("Failed", "DeadlineExceeded"), status
    assert status["jobStatus"] == "RUNNING"  # the Ray job's status as the dashboard last gave it
    assert "ActiveDeadlineSeconds: 1" in status["message"], status
    assert status["failed"] == 0 and "Retrying" not in output  # a passed deadline is never retried
    assert "activeDeadlineSeconds (1s) passed" in output
    assert not submitter.processes(), "the submitter outlived the RayJob"
    assert FakeCluster.instances[0].events == ["start", "stop"]


def test_a_submitter_that_keeps_failing_is_submission_failed_after_its_own_backoff_limit(tmp_path, fake, crd_dir):
    submitter = fake("exit 1", [None])  # the dashboard knows no such job: the submission never went through
    code, output, status = emulate(rayjob(tmp_path, submitterConfig={"backoffLimit": 1}), crd_dir)
    assert code == 1, output
    assert (status["jobDeploymentStatus"], status["reason"]) == ("Failed", "SubmissionFailed"), status
    assert len(submitter.asked) == 2 and len(set(submitter.asked)) == 1  # one submission id, its submitter run twice
    assert "the submitter Job retries (submitterConfig.backoffLimit 1): run 2" in output


def test_a_dead_head_is_a_failed_attempt_that_backoff_limit_bounds(tmp_path, fake, crd_dir, monkeypatch):
    fake("exec -a @MARK@ sleep 600", ["RUNNING"])

    def head_dies(self) -> None:  # the head's processes end; a new cluster's head would too (no Ray to start)
        self.events.append("start")
        self.head_dead = True

    monkeypatch.setattr(FakeCluster, "start", head_dies)
    monkeypatch.setattr(FakeCluster, "restart", lambda self: self.events.append("restart"))
    code, output, status = emulate(rayjob(tmp_path, backoffLimit=1), crd_dir)
    assert code == 1, output
    assert (status["jobDeploymentStatus"], status["reason"], status["failed"]) == ("Failed", "AppFailed", 2), status
    assert "the head node died" in status["message"]
    assert FakeCluster.instances[0].events == ["start", "restart", "stop"]


@pytest.mark.parametrize("sig, name", [(signal.SIGINT, "INT"), (signal.SIGTERM, "TERM")])
def test_ctrl_c_or_sigterm_mid_job_tears_the_cluster_and_the_submitter_down(tmp_path, fake, crd_dir, sig, name):
    """The signal comes from the submitter (a real process) while emulate() follows it: emulate's own handlers turn
    it into the teardown, exit 130 as a shell reports Ctrl-C."""
    submitter = fake(f"sleep 0.3; kill -{name} {os.getpid()}; exec -a @MARK@ sleep 600", ["RUNNING"])
    previous = signal.getsignal(sig)
    code, output, status = emulate(rayjob(tmp_path, backoffLimit=2), crd_dir)
    assert code == 130, output
    assert "interrupted; tearing the cluster down" in output and status == {}  # no RayJob status printed
    [cluster] = FakeCluster.instances
    assert cluster.events == ["start", "stop"], cluster.events
    assert f"cluster {cluster.run_id} removed" in output
    assert not submitter.processes(), "the submitter outlived emulate"
    assert signal.getsignal(sig) == previous  # emulate's handlers are its own


def test_keep_leaves_the_cluster_up_and_says_how_to_stop_it(tmp_path, fake, crd_dir):
    fake("exit 0", ["FAILED"])
    code, output, _ = emulate(rayjob(tmp_path), crd_dir, keep=True)
    [cluster] = FakeCluster.instances
    assert code == 1 and cluster.events == ["start", "keep"], (cluster.events, output)
    assert f"stop it with: raytrain cluster stop {cluster.run_id}" in output
