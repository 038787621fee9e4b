"""`raytrain emulate` on real local multi-node Ray clusters: success on the kind values, recovery from a lost
worker node and from a killed driver, token auth, a failure's ending, teardown. Each test cleans up after itself.
Which ending a RayJob gets when (retries, deadline, Ctrl-C) is decided in tests/cluster/test_emulate_endings.py.

    .venv/bin/python -m pytest -m integration tests/integration/test_emulate.py -v --durations=0
"""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable

import pytest
import yaml

from tests.support import checks
from tests.support.tools import find_tool

from raytrain.cluster import localcluster, pods
from raytrain.cluster.emulate import emulate
from raytrain.platform import processes
from raytrain.rundir import goodput
from raytrain.validator.crds import CRDS_ENV, resolve_crd_dir

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
RAYTRAIN = str(Path(sys.executable).parent / "raytrain")
KIND_VALUES = REPO / "helm" / "raytrain-cluster" / "values-kind.yaml"
CRDS = resolve_crd_dir(None, os.environ.get(CRDS_ENV))
EPOCHS = 10  # the manifests train 60; 10 keeps the failure tests short: a kill at epoch 7 lands past checkpoint 5
# and before checkpoint 10, so the resume from 5 trains 5 epochs again
INTERVAL = 5  # run.checkpoint_every in the manifests


# --------------------------------------------------------------------------------------------------- helpers

def variant(src: Path, dest: Path, job: dict | None = None, spec: dict | None = None,
            worker_pods: int | None = None) -> Path:
    """A copy of a RayJob manifest with the run config (ConfigMap job.yaml) and RayJob spec fields replaced, and
    with `worker_pods`, each worker group of its rayClusterSpec at that many pods."""
    docs = list(yaml.safe_load_all(src.read_text()))
    for doc in docs:
        if doc.get("kind") == "RayJob" and worker_pods is not None:
            for group in doc["spec"]["rayClusterSpec"]["workerGroupSpecs"]:
                group.update(replicas=worker_pods, minReplicas=worker_pods, maxReplicas=worker_pods)
        if doc.get("kind") == "ConfigMap" and job:
            cfg = yaml.safe_load(doc["data"]["job.yaml"])
            for section, fields in job.items():
                cfg.setdefault(section, {}).update(fields)
            doc["data"]["job.yaml"] = yaml.safe_dump(cfg)
        if doc.get("kind") == "RayJob" and spec:
            doc["spec"].update(spec)
    dest.write_text(yaml.safe_dump_all(docs))
    return dest


def tiny_job(dest: Path, entrypoint: str, workers: int = 0, **spec) -> Path:
    """A RayJob with its own small cluster (token auth on) and an arbitrary entrypoint."""
    container = {"name": "ray", "image": "ghcr.io/raytrain/raytrain:0.1.0-ray2.60.0",
                 "resources": {"limits": {"cpu": "1", "memory": "1Gi"}}}
    job = {
        "apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": "tiny"},
        "spec": {"entrypoint": entrypoint, **spec, "rayClusterSpec": {
            "rayVersion": "2.60.0", "authOptions": {"mode": "token"},
            "headGroupSpec": {"rayStartParams": {}, "template": {"spec": {"containers": [container]}}},
            "workerGroupSpecs": [{"groupName": "worker", "replicas": workers, "minReplicas": 0, "maxReplicas": 2,
                                  "rayStartParams": {}, "template": {"spec": {"containers": [container]}}}]}},
    }
    dest.write_text(yaml.safe_dump(job))
    return dest


class Emulation:
    """`raytrain emulate` as a subprocess, its output collected line by line."""

    def __init__(self, *args: str, worker_nodes: int | None = None):
        """`worker_nodes`: at most that many worker nodes (RAYTRAIN_EMULATE_MAX_WORKER_NODES; the default on this
        machine is one per CPU, at least 2), for a test whose point is not where the workers run."""
        self.started = time.monotonic()
        env = dict(os.environ)
        if worker_nodes is not None:
            env["RAYTRAIN_EMULATE_MAX_WORKER_NODES"] = str(worker_nodes)
        self.proc = subprocess.Popen([RAYTRAIN, "emulate", *args, "--crds", str(CRDS)], stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, cwd=REPO, env=env)
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.output = ""
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def _drain(self, wait: float) -> bool:
        try:
            line = self.lines.get(timeout=wait)
        except queue.Empty:
            return True
        if line is None:
            return False
        self.output += line
        started = re.match(r"cluster (rte[0-9a-f]{6}):", line)
        if started:
            STARTED_HERE.add(started.group(1))
        return True

    def wait_for(self, condition: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if not self._drain(0.2) or time.monotonic() > deadline:
                raise AssertionError(f"never saw {what}; output so far:\n{self.output[-4000:]}")

    def run_id(self) -> str:
        self.wait_for(lambda: re.search(r"^cluster (rte[0-9a-f]{6}):", self.output, re.M) is not None, 180,
                      "the cluster start")
        return re.search(r"^cluster (rte[0-9a-f]{6}):", self.output, re.M).group(1)

    def finish(self, timeout: float = 600) -> tuple[int, str, float]:
        deadline = time.monotonic() + timeout
        while self._drain(1.0):
            if time.monotonic() > deadline:
                self.proc.kill()
                raise AssertionError(f"emulate did not finish in {timeout}s:\n{self.output[-4000:]}")
        return self.proc.wait(), self.output, time.monotonic() - self.started


def assert_torn_down(run_id: str) -> None:
    assert not (localcluster.RUN_ROOT / run_id).exists(), f"{run_id}: run directory left behind"
    assert not processes.pids_mentioning(str(localcluster.RUN_ROOT / run_id)), f"{run_id}: processes left"
    ip = find_tool("ip")
    if ip is None:  # the emulator made no namespaces then (it falls back to loopback without `ip`)
        return
    netns = subprocess.run([ip, "netns", "list"], capture_output=True, text=True).stdout
    assert run_id not in netns, f"{run_id}: network namespaces left: {netns}"
    links = subprocess.run([ip, "-o", "link"], capture_output=True, text=True).stdout
    assert f"{run_id}h" not in links, f"{run_id}: host veth left"


def run_dir(run_id: str, name: str) -> Path:
    return localcluster.RUN_ROOT / f"{run_id}-shared" / "runs" / name


STARTED_HERE: set[str] = set()  # run ids of the clusters this session's Emulations started


def _started_here(run_dir: Path) -> bool:
    """A run whose owner (`raytrain emulate`) is this test process's child, or is gone: never the live cluster of
    another session's emulate sharing /tmp on this machine."""
    try:
        state = json.loads((run_dir / "state.json").read_text())
    except (OSError, ValueError):
        return False
    owner = state.get("owner_pid")
    return owner in processes.tree_pids(os.getpid()) or processes.process_start(owner) != state.get("owner_started")


@pytest.fixture(autouse=True)
def _no_leftovers():
    """Whatever a failing test leaves, the next one must not trip over it: tear down runs this test started."""
    before = {p.name for p in localcluster.RUN_ROOT.glob("rte*")}
    yield
    for path in localcluster.RUN_ROOT.glob("rte*"):
        if path.name not in before:
            if path.name.endswith("-shared"):
                if path.name.removesuffix("-shared") in STARTED_HERE:
                    shutil.rmtree(path, ignore_errors=True)
            elif path.name in STARTED_HERE or _started_here(path):
                localcluster.stop_run(path.name)


# --------------------------------------------------------------------------------------------------- tests

def test_lost_worker_node_resumes_from_newest_checkpoint(tmp_path):
    """Acceptance: manifests/rayjob.yaml on the chart's kind values (its epochs shortened) trains with workers on
    several nodes, survives the loss of one and resumes from the newest checkpoint; the checks scripts/kind-e2e runs
    on its artifacts (tests/e2e/kind_artifacts.py) pass on this real run."""
    job = variant(REPO / "manifests" / "rayjob.yaml", tmp_path / "rayjob.yaml", job={"train": {"epochs": EPOCHS}})
    run = Emulation(str(job), "--values", str(KIND_VALUES))
    run_id = run.run_id()
    directory = run_dir(run_id, "linear")
    # Kill mid-interval, after the first checkpoint: epoch 7 of 5-epoch intervals.
    run.wait_for(lambda: len(checks.metrics_epochs(directory)) >= INTERVAL + 2, 300, "epoch 7")
    epoch_before = max(checks.metrics_epochs(directory))
    killed_at = time.time()
    killed = pods.kill_node(localcluster.RUN_ROOT / run_id / "state.json", "worker-1")
    # A checkpoint is complete once a later epoch is recorded (its report returned before that epoch trained);
    # a newer one may still be mid-upload when the node dies.
    newest_before = max((e for e in checks.checkpoint_epochs(directory) if e < epoch_before), default=0)
    assert killed, "no processes of worker-1 to kill"
    # The first group's rows as written, until the restarted group drops those past its checkpoint (goodput below)
    written: dict[int, float] = {}

    def restarted() -> bool:
        for row in checks.read_jsonl(directory / "metrics.jsonl"):
            written.setdefault(row["epoch"], row["timing"]["time"])
        return len(checks.starts(directory)) >= 2

    run.wait_for(restarted, 300, "the worker group's restart")
    code, output, seconds = run.finish()
    checks.assert_run_completed(directory, EPOCHS)
    resume = checks.assert_resumed(directory, newest_checkpoint_before=newest_before, epoch_before=epoch_before,
                                   interval=INTERVAL)
    print(f"lost worker node: killed at epoch {epoch_before}, newest checkpoint {newest_before}, resumed from "
          f"{resume['resumed_from_epoch']}; {seconds:.0f}s")
    assert code == 0, output[-4000:]
    checks.assert_job_succeeded(checks.rayjob_from_emulate_output(output))
    assert "worker node worker-1 is gone" in output
    # Ray Train restarted the worker group within the same attempt (no RayJob retry was needed).
    result = json.loads((directory / "result.json").read_text())
    assert result["worker_group_starts"] >= 2 and result["attempt"] == 1, result
    nodes = checks.train_worker_nodes(output)
    assert len(nodes) >= 2, f"training workers ran on {nodes}, expected at least 2 nodes"
    assert_torn_down(run_id)
    assert_goodput_of_a_lost_worker(directory, written, resume, killed_at)

    artifacts = tmp_path / "run2"  # the layout scripts/kind-e2e writes
    artifacts.mkdir()
    (artifacts / "rayjob.yaml").write_text(yaml.safe_dump(checks.rayjob_from_emulate_output(output)))
    shutil.copytree(directory, artifacts / "run")
    command = [sys.executable, "-m", "tests.e2e.kind_artifacts", str(artifacts), "--epochs", str(EPOCHS)]
    passed = subprocess.run(command + ["--killed-pod", "raytrain-worker-1", "--epoch-before", str(epoch_before),
                                       "--newest-checkpoint-before", str(newest_before), "--interval", str(INTERVAL)],
                            cwd=REPO, capture_output=True, text=True, timeout=60)
    assert passed.returncode == 0 and f"Complete/SUCCEEDED, {EPOCHS} epochs" in passed.stdout, \
        passed.stdout + passed.stderr
    # ...and fail on a claim this run does not bear out (a newer checkpoint than it resumed from)
    claimed = subprocess.run(command + ["--killed-pod", "raytrain-worker-1", "--epoch-before", str(EPOCHS),
                                        "--newest-checkpoint-before", str(EPOCHS), "--interval", str(INTERVAL)],
                             cwd=REPO, capture_output=True, text=True, timeout=60)
    assert claimed.returncode == 1 and "kind e2e check failed" in claimed.stderr, claimed.stdout + claimed.stderr


def assert_goodput_of_a_lost_worker(directory: Path, written: dict[int, float], resume: dict,
                                    killed_at: float) -> None:
    """Issue 38: the kill's cost, by cause. Progress lost: the rows the restart dropped, trained again, their time
    as written (to the hundredth of a second the records keep). Recovery and the restore: the kill to the new
    group's start, give or take the part of an epoch trained after its last row before the kill (at most an
    epoch). The parts sum to the wall time."""
    found = goodput.read(directory, epochs=EPOCHS)
    assert sum(found.seconds.values()) == pytest.approx(found.wall_s) and found.seconds["other"] == 0, found.seconds
    resumed = resume["resumed_from_epoch"]
    dropped = [epoch for epoch in written if epoch > resumed]
    assert dropped, (written, resume)
    assert found.seconds["lost"] == pytest.approx(written[max(dropped)] - written[resumed], abs=0.01), \
        (found.seconds, written, resumed)
    epoch_s = max(written[e] - written[e - 1] for e in written if e - 1 in written)
    kill_to_start = resume["time"] - killed_at
    assert abs(found.seconds["recovery"] + found.seconds["restore"] - kill_to_start) <= epoch_s, \
        (found.seconds, kill_to_start, epoch_s)
    print(f"goodput of a lost worker: {found.seconds['lost']:.1f} s lost ({len(dropped)} epochs trained again), "
          f"{found.seconds['recovery']:.1f} s recovery and {found.seconds['restore']:.1f} s restore against "
          f"{kill_to_start:.1f} s from the kill to the new group")


def test_killed_driver_is_retried_and_resumes(tmp_path):
    """rayjob-standalone.yaml (own cluster, backoffLimit 2): the driver dies, KubeRay retries on a new cluster,
    and the run continues from the checkpoint on the shared storage. One worker pod and one Ray Train worker: the
    driver's death and the new cluster are the point, and each pod is Ray started twice (workers on several nodes
    are the lost-worker test's)."""
    job = variant(REPO / "manifests" / "rayjob-standalone.yaml", tmp_path / "rayjob.yaml",
                  job={"train": {"epochs": EPOCHS}, "scaling": {"num_workers": 1}}, worker_pods=1)
    run = Emulation(str(job))
    run_id = run.run_id()
    directory = run_dir(run_id, "linear-standalone")
    state = localcluster.RUN_ROOT / run_id / "state.json"
    run.wait_for(lambda: len(checks.metrics_epochs(directory)) >= INTERVAL + 2, 300, "epoch 7")
    drivers = pods.node_processes(state, "head", "raytrain run job.yaml")
    assert drivers, "no driver process on the head node"
    epoch_before = max(checks.metrics_epochs(directory))
    for pid in drivers:
        os.kill(pid, signal.SIGKILL)
    newest_before = max((e for e in checks.checkpoint_epochs(directory) if e < epoch_before), default=0)
    code, output, seconds = run.finish()
    assert "Retrying" in output, output[-4000:]
    checks.assert_run_completed(directory, EPOCHS)
    resume = checks.assert_resumed(directory, newest_checkpoint_before=newest_before, epoch_before=epoch_before,
                                   interval=INTERVAL)
    print(f"killed driver: at epoch {epoch_before}, resumed from {resume['resumed_from_epoch']}; {seconds:.0f}s")
    assert code == 0, output[-4000:]
    rayjob = checks.rayjob_from_emulate_output(output)
    checks.assert_job_succeeded(rayjob)
    assert rayjob["status"]["failed"] == 1 and rayjob["status"]["succeeded"] == 1, rayjob["status"]
    assert_torn_down(run_id)


def test_a_failing_entrypoint_is_app_failed_after_removing_a_killed_runs_leftovers_and_keep_needs_the_token(
        tmp_path):
    """The endings end to end once, on real clusters: a killed `raytrain emulate` leaves its nodes running, the next
    emulate removes them, runs a RayJob whose entrypoint fails and reports AppFailed; with --keep its cluster (token
    auth on) stays up, refuses a submission without the token, and `raytrain cluster stop` removes it. Which ending
    when (backoffLimit's retries, DeadlineExceeded, SubmissionFailed, a dead head, Ctrl-C and SIGTERM tearing down)
    is decided in tests/cluster/test_emulate_endings.py against a fake cluster; a job whose workers never fit fails
    fast in tests/integration/test_run.py and test_scaleup.py, its driver's failure being this AppFailed."""
    first = Emulation(str(tiny_job(tmp_path / "sleep.yaml", "sleep 600")))
    killed_id = first.run_id()
    first.proc.kill()  # emulate dies without teardown: its nodes (own sessions) live on
    first.proc.wait()
    assert processes.pids_mentioning(str(localcluster.RUN_ROOT / killed_id)), "the killed run left nothing?"
    failing = tiny_job(tmp_path / "fail.yaml", "python -c 'import sys; sys.exit(3)'")
    code, output, seconds = Emulation(str(failing), "--keep").finish()
    print(f"failing entrypoint: {seconds:.0f}s")
    assert code == 1, output[-4000:]
    checks.assert_job_failed(checks.rayjob_from_emulate_output(output), "AppFailed")
    assert f"removed leftovers of killed runs: {killed_id}" in output
    assert_torn_down(killed_id)

    run_id = re.search(r"stop it with: raytrain cluster stop (rte[0-9a-f]{6})", output).group(1)
    state = json.loads((localcluster.RUN_ROOT / run_id / "state.json").read_text())
    url = state["dashboard_url"]
    bare = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH") and k != "RAY_ADDRESS"}
    ray = str(Path(sys.executable).parent / "ray")
    # A loaded machine's dashboard once refused the connection itself, and once answered its version check with 404
    # (its job module not serving yet): neither is about the token, so ask again
    for _ in range(6):
        refused = subprocess.run([ray, "job", "submit", "--address", url, "--", "echo", "hi"], env=bare,
                                 capture_output=True, text=True, timeout=120)
        if not any(text in refused.stderr for text in ("Failed to connect to Ray at address",
                                                       "Version check returned 404")):
            break
        time.sleep(10)
    assert refused.returncode != 0, refused.stdout + refused.stderr
    assert re.search(r"401|[Uu]nauthori[sz]ed|authentication", refused.stdout + refused.stderr), refused.stderr[-2000:]
    allowed = subprocess.run([ray, "job", "list", "--address", url], capture_output=True, text=True, timeout=120,
                             env={**bare, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": state["token_path"]})
    assert allowed.returncode == 0 and "tiny-" in allowed.stdout, allowed.stdout + allowed.stderr
    assert "FAILED" in allowed.stdout, allowed.stdout  # the kept cluster is the one that ran the failing job
    stop = subprocess.run([RAYTRAIN, "cluster", "stop", run_id], capture_output=True, text=True, timeout=120)
    assert stop.returncode == 0, stop.stdout + stop.stderr
    assert_torn_down(run_id)


def emulate_on_loopback(job: Path, tmp_path: Path, shared: Path) -> str:
    """`raytrain emulate JOB` with loopback addresses per node (no namespaces) until the RayJob succeeds; its output."""
    with open(tmp_path / "out.txt", "w+") as out:
        code = emulate(job, None, False, CRDS, out=out, shared_dir=shared, isolation="loopback")
        out.seek(0)
        output = out.read()
    assert code == 0, output[-4000:]
    checks.assert_job_succeeded(checks.rayjob_from_emulate_output(output))
    return output


def test_a_stopped_rayjob_checkpoints_ends_stopped_and_releases_its_lease(tmp_path):
    """Deleting a RayJob (its finalizer stops the Ray job) and `ray job stop` are one path: Ray 2.55's job
    supervisor SIGTERMs the driver and SIGKILLs it RAY_JOB_STOP_WAIT_TIME_S later (Ray's default 3 s). The chart's
    head sets 30 s (jobStopWaitSeconds), and emulate gives its head the chart's container env: the run checkpoints,
    records `stopped` with the signal, loses no completed step and releases its lease. One worker node besides the
    head: the stop reaches the driver, whichever nodes its workers are on."""
    job = variant(REPO / "manifests" / "rayjob.yaml", tmp_path / "rayjob.yaml",
                  job={"train": {"epochs": 400}, "data": {"num_samples": 4000}, "run": {"checkpoint_every_steps": 20}})
    run = Emulation(str(job), "--values", str(KIND_VALUES), worker_nodes=1)
    run_id = run.run_id()
    directory = run_dir(run_id, "linear")
    run.wait_for(lambda: len(checks.metrics_epochs(directory)) >= 2, 300, "epoch 2")
    state = json.loads((localcluster.RUN_ROOT / run_id / "state.json").read_text())
    [head] = [n for n in state["nodes"] if n["name"] == "head"]
    assert head["env"]["RAY_JOB_STOP_WAIT_TIME_S"] == "30"  # the chart's head container env
    ray = str(Path(sys.executable).parent / "ray")
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH") and k != "RAY_ADDRESS"},
           "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": state["token_path"]}
    listed = subprocess.run([ray, "job", "list", "--address", state["dashboard_url"]], capture_output=True, text=True,
                            timeout=120, env=env)
    [submission] = set(re.findall(r"submission_id='([^']+)'", listed.stdout)) or {None}
    assert submission, listed.stdout + listed.stderr
    stopped = subprocess.run([ray, "job", "stop", "--address", state["dashboard_url"], submission],
                             capture_output=True, text=True, timeout=120, env=env)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    code, output, seconds = run.finish()
    result = json.loads((directory / "result.json").read_text())
    assert result["status"] == "stopped" and result["signal"] == "SIGTERM", result
    assert result["epochs_completed"] == max(checks.metrics_epochs(directory)), result  # nothing past the checkpoint
    lease = json.loads((directory / "lease.json").read_text())
    assert lease["released"] is True, lease
    assert "did not stop within" not in output and "Traceback" not in output, output[-4000:]
    print(f"stopped RayJob: {result['epochs_completed']} epoch(s), emulate exit {code}, {seconds:.0f}s")
    assert_torn_down(run_id)


# --------------------------------------------------------------------------------------------------- object storage

@pytest.fixture
def s3_endpoint():
    """A real S3-compatible server on this machine (moto's, as MinIO would be on a cluster), at its own port; the
    environment is left alone (the nodes get the endpoint and keys from the RayJob's Secret)."""
    from tests.support.objectstore import running_s3_server

    with running_s3_server() as server:
        yield server.endpoint


def test_an_s3_rayjob_gets_its_secret_and_trains_into_the_bucket(tmp_path, monkeypatch, s3_endpoint):
    """manifests/rayjob-s3.yaml as shipped (its epochs shortened), with the Secret it names in the same file: the keys
    and AWS_ENDPOINT_URL of an S3-compatible server, as for MinIO. Every node gets the Secret as kubelet's envFrom
    would give it (nothing from this process: its AWS_* are cleared), and the run's records and checkpoints land in
    the bucket, none on the shared storage. Loopback addresses: the nodes reach the server on this host's
    127.0.0.1, as pods would reach a Service: this is also the proof of loopback addresses per node (the non-root
    path); /mnt/shared rewritten to the shared directory on it is test_tracking.py's resubmitted RayJob (its run on
    /mnt/shared/runs lands in the test's shared directory)."""
    import boto3

    for key in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(key)
    keys = {"AWS_ACCESS_KEY_ID": "raytrain-test", "AWS_SECRET_ACCESS_KEY": "raytrain-test-secret",
            "AWS_DEFAULT_REGION": "us-east-1"}
    s3 = boto3.client("s3", endpoint_url=s3_endpoint, aws_access_key_id=keys["AWS_ACCESS_KEY_ID"],
                      aws_secret_access_key=keys["AWS_SECRET_ACCESS_KEY"], region_name=keys["AWS_DEFAULT_REGION"])
    s3.create_bucket(Bucket="raytrain-runs")  # the manifest's --storage s3://raytrain-runs/runs
    epochs = 2 * INTERVAL
    job = variant(REPO / "manifests" / "rayjob-s3.yaml", tmp_path / "rayjob.yaml", job={"train": {"epochs": epochs}})
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "raytrain-s3"},
              "stringData": {**keys, "AWS_ENDPOINT_URL": s3_endpoint}}
    job.write_text(job.read_text() + "---\n" + yaml.safe_dump(secret))
    shared = tmp_path / "shared"
    output = emulate_on_loopback(job, tmp_path, shared)
    # The non-root path: 127.0.0.x per node, and the workers on several of them reach each other and the head.
    assert re.search(r"head +127\.0\.0\.2 ", output) and re.search(r"worker-0 +127\.0\.0\.3 ", output), output[:3000]
    assert len(checks.train_worker_nodes(output)) >= 2, output[-4000:]
    prefix = "runs/linear-s3/"
    listed = s3.list_objects_v2(Bucket="raytrain-runs", Prefix=prefix).get("Contents", [])
    local = tmp_path / "run"
    for obj in listed:
        target = local / obj["Key"][len(prefix):]
        target.parent.mkdir(parents=True, exist_ok=True)
        s3.download_file("raytrain-runs", obj["Key"], str(target))
    checks.assert_run_completed(local, epochs)
    assert not [p for p in shared.rglob("*") if p.is_file()], "the run wrote to the shared storage"
