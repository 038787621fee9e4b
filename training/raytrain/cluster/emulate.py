"""`raytrain emulate RAYJOB.yaml` (or a kustomization directory): run a RayJob the way KubeRay v1.7.0 runs it, on a real local Ray cluster.

What KubeRay does, and what stands in for it here:
- RayCluster: the RayJob's `rayClusterSpec`, or for a `clusterSelector` job the chart rendered with --values,
  becomes a `LocalCluster` (localcluster.py): one Ray node per pod, own address each, the shared
  volume at its mount path, token auth when the spec turns it on (a fresh token per emulation).
- A lost worker pod is recreated by the RayCluster controller: a worker node whose processes die is started again.
- The K8sJobMode submitter: the same bash command KubeRay builds (common/job.go BuildJobSubmitCommand): wait for
  the dashboard's /api/gcs_healthz, `ray job status` to skip a duplicate submission, `ray job submit --no-wait
  --runtime-env-json ... --submission-id ID -- ENTRYPOINT`, then `ray job logs --follow`. ConfigMaps that the
  submitter pod template mounts are written to a temp dir, and runtime_env paths under those mounts point there.
- A Ray container's environment, as kubelet gives it: `envFrom` (secretRef, configMapRef, with prefix) and then `env`
  (literal values, secretKeyRef, configMapKeyRef), read from the Secrets and ConfigMaps of the RayJob's file; a
  missing one that is not optional stops the emulation, as kubelet keeps the pod in CreateContainerConfigError.
  The node's processes (Ray, and through it the job's driver and workers) run with it.
- Status: jobStatus from Ray; jobDeploymentStatus Complete (SUCCEEDED, STOPPED) or Failed (reason AppFailed for a
  FAILED job, DeadlineExceeded past activeDeadlineSeconds); spec.backoffLimit retries a failed job with a new
  submission ID (a new cluster for an embedded rayClusterSpec, as KubeRay does; the shared storage stays).
- spec.suspend (Kueue's preemption and readmission), patched with `raytrain cluster suspend|unsuspend RUN_ID`:
  Suspending deletes every pod as kubelet does (preStop hook, SIGTERM, SIGKILL after the grace period) and the
  submitter, then Suspended; unsuspended, a new cluster and a new submission (see `Emulation.suspend`).
"""

from __future__ import annotations

import io
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Iterator

import yaml

from raytrain.cluster.dashboard import alive_nodes, http_get
from raytrain.cluster.localcluster import LocalCluster, clean_stale, cluster_shape
from raytrain.cluster.pods import delete_node
from raytrain.cluster.raynode import ClusterError
from raytrain.cluster.submitter import submitter_script
from raytrain.cluster.rayjobfile import (
    JobInput, RayJobError, check_schema, cluster_spec, load_rayjob, local_runtime_env, materialise_configmaps,
    new_job_id, resolve_env,
)
from raytrain.cluster.suspend import SUSPEND_FILE, parse_suspend, suspend_refusal, write_status, write_suspend

TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")
SUBMITTER_BACKOFF_LIMIT = 2  # KubeRay's default submitterConfig.backoffLimit
TRAIN_WORKER_CLASS = "RayTrainWorker"


# --------------------------------------------------------------------------------------------------- status

@dataclass
class RayJobStatus:
    job_id: str = ""
    job_status: str = ""
    deployment: str = "Initializing"
    reason: str = ""
    message: str = ""
    succeeded: int = 0
    failed: int = 0
    cluster_name: str = ""
    dashboard_url: str = ""
    train_worker_nodes: list[str] = field(default_factory=list)

    def as_yaml(self, name: str) -> str:
        status: dict[str, Any] = {
            "jobId": self.job_id, "jobStatus": self.job_status, "jobDeploymentStatus": self.deployment,
            "reason": self.reason, "message": self.message, "succeeded": self.succeeded, "failed": self.failed,
            "rayClusterName": self.cluster_name, "dashboardURL": self.dashboard_url,
        }
        text = yaml.safe_dump({"kind": "RayJob", "metadata": {"name": name}, "status": status}, sort_keys=False)
        nodes = ", ".join(self.train_worker_nodes) if self.train_worker_nodes else "none seen"
        return f"{text}# Ray Train workers ran on: {nodes}\n"


def job_info(url: str, token: str | None, job_id: str) -> dict | None:
    try:
        status, body = http_get(f"{url}/api/jobs/{job_id}", token)
    except OSError:
        return None
    return json.loads(body) if status == 200 else None


def train_worker_nodes(cluster: LocalCluster) -> list[str]:
    """Which of our nodes hosted Ray Train workers (dead actors stay listed in the state API)."""
    query = (f"/api/v0/actors?limit=1000&detail=1&filter_keys=class_name&filter_predicates=%3D"
             f"&filter_values={TRAIN_WORKER_CLASS}")
    try:
        status, body = http_get(cluster.dashboard_url + query, cluster.token, timeout=10)
        nodes = {n["node_id"]: n["node_ip"] for n in alive_nodes(cluster.dashboard_url, cluster.token)}
    except OSError:
        return []
    if status != 200:
        return []
    by_ip = {n.ip: n.spec.name for n in cluster.nodes}
    names = []
    for actor in json.loads(body)["data"]["result"]["result"]:
        ip = (actor.get("address") or {}).get("ip_address") or nodes.get(actor.get("node_id"))
        names.append(by_ip.get(ip, ip or "?"))
    return sorted(set(names))


# --------------------------------------------------------------------------------------------------- running

@contextmanager
def _interrupts_as_keyboard_interrupt() -> Iterator[None]:
    """SIGTERM tears down like Ctrl-C does."""
    def handler(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    # Ctrl-C too, even where the shell started us with SIGINT ignored (a background job).
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, previous_int)


def _pump(stream: IO[str], lines: "queue.Queue[str | None]") -> None:
    for line in stream:
        lines.put(line)
    lines.put(None)


class Emulation:
    def __init__(self, job: JobInput, spec: dict, cluster_name: str, owns_cluster: bool, out: IO[str], *,
                 isolation: str = "auto", shared_dir: Path | None = None, keep: bool = False,
                 max_worker_nodes: int | None = None):
        self.job, self.spec, self.out = job, spec, out
        self.isolation, self.shared_dir, self.keep, self.owns_cluster = isolation, shared_dir, keep, owns_cluster
        self.cluster_name = cluster_name
        self.status = RayJobStatus(cluster_name=cluster_name)
        self.start_time = time.monotonic()
        self.deadline = job.spec.get("activeDeadlineSeconds")
        self.cluster: LocalCluster | None = None
        self.announced_pending: set[str] = set()
        self.max_worker_nodes = max_worker_nodes
        self.suspend_refused = suspend_refusal(job.spec, owns_cluster)
        self.bad_suspend_file = ""

    def say(self, text: str) -> None:
        print(f"[emulate] {text}", file=self.out, flush=True)

    def deadline_passed(self) -> bool:
        return bool(self.deadline) and time.monotonic() - self.start_time > float(self.deadline)

    def start_cluster(self) -> None:
        shape = cluster_shape(self.spec, where=f"{self.job.path}: RayCluster/{self.status.cluster_name}: spec",
                              max_worker_nodes=self.max_worker_nodes)
        self.cluster = LocalCluster(shape, out=self.out, isolation=self.isolation, shared_dir=self.shared_dir,
                                    keep=self.keep)
        # spec.suspend false: a Kueue-queued manifest's `suspend: true` is taken as admitted at once.
        write_suspend(self.cluster.run_dir, False)
        self.write_status()
        self.say(f"RayCluster {self.status.cluster_name}: starting {len(shape.nodes)} Ray node(s) as {self.cluster.run_id}")
        self.cluster.start()
        self.status.dashboard_url = self.cluster.dashboard_url

    def run(self) -> int:
        backoff = int(self.job.spec.get("backoffLimit") or 0)
        self.start_cluster()
        while True:
            self.status.deployment = "Running"
            self.write_status()
            self.attempt()
            if self.status.deployment == "Suspending":
                self.suspend()
                continue
            if self.status.job_status == "FAILED" and self.status.reason == "AppFailed" and \
                    self.status.failed <= backoff and not self.deadline_passed():
                self.say(f"jobStatus FAILED, attempt {self.status.failed} of {backoff + 1} (backoffLimit {backoff}): "
                         "jobDeploymentStatus Retrying, a new submission"
                         + (" on a new RayCluster" if self.owns_cluster else " on the same RayCluster"))
                self.status.deployment, self.status.reason = "Retrying", ""
                self.write_status()
                if self.owns_cluster:
                    self.cluster.restart()
                continue
            break
        self.status.train_worker_nodes = train_worker_nodes(self.cluster)
        self.write_status()
        print(self.status.as_yaml(self.job.name), file=self.out, end="", flush=True)
        return 0 if self.status.job_status == "SUCCEEDED" and self.status.deployment == "Complete" else 1

    def attempt(self) -> None:
        cluster = self.cluster
        job_id = new_job_id(self.job)
        self.status.job_id, self.status.job_status, self.status.message = job_id, "", ""
        mounts = materialise_configmaps(self.job, cluster.run_dir / f"submitter-{job_id}")
        if cluster.isolation != "netns":  # no mount namespaces: point /mnt/shared paths at the shared dir
            for directory in mounts.values():
                for path in directory.rglob("*"):
                    if path.is_file():
                        path.write_text(cluster.shared_path(path.read_text()))
        runtime_env = local_runtime_env(self.job, mounts)
        entrypoint = cluster.shared_path(self.job.spec["entrypoint"])
        script = submitter_script(self.job.spec, cluster.dashboard_url, job_id, runtime_env, entrypoint)
        env = cluster.client_env()
        env["PYTHONUNBUFFERED"] = "1"
        self.say(f"submitter (K8sJobMode), run with /bin/bash -c:\n  {script}")
        backoff = int((self.job.spec.get("submitterConfig") or {}).get("backoffLimit", SUBMITTER_BACKOFF_LIMIT))
        for run in range(backoff + 1):
            finished = self.run_submitter(script, env)
            if not finished:  # deadline passed, or the head is gone
                return
            info = job_info(cluster.dashboard_url, cluster.token, job_id)
            if info and info.get("status") in TERMINAL:
                return self.finish(info)
            self.say(f"submitter exited with the job {info.get('status') if info else 'unknown'}; the submitter "
                     f"Job retries (submitterConfig.backoffLimit {backoff}): run {run + 2}")
        # The submitter Job reached its backoff limit: KubeRay marks the RayJob Failed.
        self.status.deployment, self.status.reason = "Failed", "SubmissionFailed"
        self.status.message = "the submitter Job failed after its retries; see its log above"

    def finish(self, info: dict) -> None:
        self.status.job_status = info["status"]
        self.status.message = info.get("message") or ""
        if info["status"] == "FAILED":
            self.status.deployment, self.status.reason = "Failed", "AppFailed"
            self.status.failed += 1
        else:
            self.status.deployment, self.status.reason = "Complete", ""
            self.status.succeeded += info["status"] == "SUCCEEDED"

    def run_submitter(self, script: str, env: dict[str, str]) -> bool:
        """Run the submitter to its end while playing the operator: recreate lost worker pods, enforce the
        deadline. False when the run was cut short (deadline, head lost)."""
        cluster = self.cluster
        proc = subprocess.Popen(["/bin/bash", "-c", script], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True, cwd=cluster.run_dir)
        lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=_pump, args=(proc.stdout, lines), daemon=True).start()
        checked = time.monotonic()
        try:
            while True:
                try:
                    line = lines.get(timeout=0.5)
                    if line is None:
                        proc.wait()
                        return True
                    self.out.write(line)
                    self.out.flush()
                    if time.monotonic() - checked < 0.5:  # a job that logs without pause still gets checked
                        continue
                except queue.Empty:
                    pass
                checked = time.monotonic()
                # KubeRay checks spec.suspend first in Running (rayjob_controller.go updateStatusToSuspendingIfNeeded)
                if self.suspend_requested():
                    self.status.deployment = "Suspending"
                    return False  # the finally below deletes the submitter (SIGTERM, as its pod's deletion)
                if self.deadline_passed():
                    self.on_deadline()
                    return False
                if cluster.node_exited(cluster.head):
                    self.status.deployment, self.status.reason = "Failed", "AppFailed"
                    self.status.job_status = "FAILED"
                    # Counted like any failed attempt, so backoffLimit bounds the retries (uncounted, a dead head
                    # on a cluster that is not restarted was retried forever).
                    self.status.failed += 1
                    self.status.message = f"the head node died; see {cluster.head.log}"
                    return False
                for node in cluster.nodes[1:]:
                    if cluster.node_exited(node):
                        pending = cluster.pending_for(node)
                        if pending:  # `delete-node --pending`: the recreated pod waits for room
                            if node.spec.name not in self.announced_pending:
                                self.announced_pending.add(node.spec.name)
                                self.say(f"worker node {node.spec.name} is gone ({node.ip}); its recreated pod is "
                                         f"Pending for {pending:.0f} s (no node has room for it)")
                            continue
                        self.announced_pending.discard(node.spec.name)
                        old_ip = node.ip
                        cluster.restart_node(node)
                        self.say(f"worker node {node.spec.name} is gone ({old_ip}); the RayCluster controller "
                                 f"recreates its pod: started again at {node.ip}")
        finally:  # the submitter pod's deletion: all of its processes (`ray job logs --follow` too) go with it
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    proc.wait(timeout=5)
                    break
                except subprocess.TimeoutExpired:
                    continue

    def write_status(self) -> None:
        write_status(self.cluster.run_dir, self.job.name, self.status.deployment, self.suspend_refused)

    def suspend_requested(self) -> bool:
        path = self.cluster.run_dir / SUSPEND_FILE
        try:
            return not self.suspend_refused and parse_suspend(path.read_text(), str(path))
        except (OSError, RayJobError) as err:  # a hand-edited file: say so once, act as if unchanged
            if str(err) != self.bad_suspend_file:
                self.bad_suspend_file = str(err)
                self.say(f"spec.suspend not read: {err}")
            return False

    def suspend(self) -> None:
        """KubeRay v1.7.0 rayjob_controller.go, JobDeploymentStatusSuspending: delete the RayCluster and the
        submitter Job without stopping the Ray job first (the pods' preStop hooks are what stops it gracefully),
        reset the status to Suspended; JobDeploymentStatusSuspended: once spec.suspend is false, New, then
        Initializing (initRayJobStatusIfNeed: a new StartTime, and a new jobId unless spec.jobId), a new RayCluster
        and a new submission. KubeRay reports Suspended once the RayCluster object is gone, while its pods may still
        run their hooks (background deletion; the next driver's --wait-for-lease covers that); here Suspended comes
        after the pods are gone, so the next cluster never shares this machine with the old one."""
        cluster = self.cluster
        self.write_status()
        self.say(f"spec.suspend true: jobDeploymentStatus Suspending: deleting RayCluster {self.status.cluster_name} "
                 f"({len(cluster.nodes)} pods at once, each: its preStop hook, SIGTERM, SIGKILL after its grace "
                 "period) and the submitter Job")
        outcomes: dict[str, Any] = {}
        log = {node.spec.name: io.StringIO() for node in cluster.nodes}  # each pod's lines, printed unmixed

        def delete(name: str) -> None:  # kubelet deletes each pod on its own: in parallel
            try:
                outcomes[name] = delete_node(cluster.run_dir / "state.json", name, out=log[name])
            except Exception as err:  # noqa: BLE001 - reported below; the other pods' deletions go on
                outcomes[name] = err

        threads = [threading.Thread(target=delete, args=(name,), daemon=True) for name in log]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for name, outcome in outcomes.items():
            if isinstance(outcome, Exception):
                raise ClusterError(f"deleting pod {name} of {cluster.run_id} failed: {outcome}")
            hook = "".join(f"\n    {line}" for line in outcome["pre_stop_output"].strip().splitlines())
            self.say(f"pod {'; '.join(log[name].getvalue().strip().splitlines())}{hook}")
        # Reset the RayCluster and Ray job related status (rayjob_controller.go, JobDeploymentStatusSuspending).
        self.status.job_id = self.status.job_status = self.status.message = self.status.reason = ""
        self.status.cluster_name = self.status.dashboard_url = ""
        self.status.deployment = "Suspended"
        self.write_status()
        self.say(f"jobDeploymentStatus Suspended: RayCluster and submitter deleted; jobId, jobStatus, rayClusterName "
                 f"and dashboardURL reset. Waiting for spec.suspend false: raytrain cluster unsuspend {cluster.run_id}")
        while self.suspend_requested():  # Suspended has no deadline: KubeRay checks activeDeadlineSeconds only later
            time.sleep(0.5)
        self.status.deployment = "Initializing"
        self.write_status()
        self.start_time = time.monotonic()  # initRayJobStatusIfNeed: a new StartTime, activeDeadlineSeconds anew
        self.say(f"spec.suspend false: jobDeploymentStatus New, then Initializing: a new RayCluster "
                 f"{self.cluster_name} (same addresses and shared storage, as {cluster.run_id}), then a new submission")
        cluster.restart()
        self.status.cluster_name, self.status.dashboard_url = self.cluster_name, cluster.dashboard_url

    def on_deadline(self) -> None:
        cluster = self.cluster
        info = job_info(cluster.dashboard_url, cluster.token, self.status.job_id)
        self.status.job_status = (info or {}).get("status", self.status.job_status)
        self.status.deployment, self.status.reason = "Failed", "DeadlineExceeded"
        self.status.message = (f"The RayJob has passed the activeDeadlineSeconds. "
                               f"ActiveDeadlineSeconds: {self.deadline}")
        self.say(f"activeDeadlineSeconds ({self.deadline}s) passed: the RayJob fails with DeadlineExceeded")


def emulate(rayjob_path: Path, values_path: Path | None, keep: bool, crd_dir: Path, out: IO[str] | None = None, *,
            shared_dir: Path | None = None, isolation: str = "auto", max_worker_nodes: int | None = None) -> int:
    """Run RAYJOB.yaml as KubeRay would on a local multi-node Ray cluster; print the RayJob status (to `out`, default
    the sys.stdout of the moment, not the one of import time). Returns 0 for SUCCEEDED, 1 for a job that did not
    succeed, 2 for a RayJob that cannot be emulated."""
    out = out or sys.stdout
    emulation = None
    try:
        clean_stale(out)
        job = load_rayjob(Path(rayjob_path))
        problems = check_schema(job, crd_dir)
        if problems:
            raise RayJobError("the RayJob does not match the KubeRay v1.7.0 schema:\n  " + "\n  ".join(problems))
        mode = job.spec.get("submissionMode", "K8sJobMode")
        if mode != "K8sJobMode":
            print(f"note: submissionMode {mode}: emulated with the K8sJobMode submitter", file=out)
        spec, cluster_name, owns = cluster_spec(job, Path(values_path) if values_path else None)
        spec = resolve_env(job, spec, "spec.rayClusterSpec" if owns else f"RayCluster/{cluster_name}: spec")
        emulation = Emulation(job, spec, cluster_name, owns, out, isolation=isolation, shared_dir=shared_dir,
                              keep=keep, max_worker_nodes=max_worker_nodes)
        with _interrupts_as_keyboard_interrupt():
            return emulation.run()
    except (RayJobError, ClusterError) as err:
        print(f"raytrain emulate: {err}", file=out, flush=True)
        return 2 if emulation is None or emulation.cluster is None else 1
    except KeyboardInterrupt:
        print("raytrain emulate: interrupted; tearing the cluster down", file=out, flush=True)
        return 130
    finally:
        cluster = emulation.cluster if emulation else None
        if cluster is not None:
            if keep:
                cluster.mark_keep()
                print(f"cluster kept (--keep): dashboard {cluster.dashboard_url}, token "
                      f"{cluster.token_path if cluster.token else 'none'}, shared storage {cluster.shared_dir}; "
                      f"stop it with: raytrain cluster stop {cluster.run_id}", file=out, flush=True)
            else:
                cluster.stop()
                print(f"cluster {cluster.run_id} removed; the shared storage stays at {cluster.shared_dir}",
                      file=out, flush=True)
