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

import base64
import binascii
import copy
import io
import json
import re
import os
import queue
import secrets
import signal
import string
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Iterator

import yaml

from raytrain import files, yamlfile
from raytrain.cluster.dashboard import alive_nodes, http_get
from raytrain.validator.kustomize import KustomizeError, is_kustomization, kustomize_build
from raytrain.cluster import localcluster
from raytrain.cluster.localcluster import LocalCluster, clean_stale, cluster_shape, delete_node
from raytrain.cluster.raynode import ClusterError
from raytrain.validator.problems import Doc
from raytrain.cluster.submitter import submitter_script
from raytrain.processes import process_start
from raytrain.validator.validate import check_ray_schema, target_cluster

TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")
SUBMITTER_BACKOFF_LIMIT = 2  # KubeRay's default submitterConfig.backoffLimit
TRAIN_WORKER_CLASS = "RayTrainWorker"


class RayJobError(Exception):
    """The RayJob cannot be emulated as written; the message names the file, the field and the fix."""


# --------------------------------------------------------------------------------------------------- parsing

@dataclass
class JobInput:
    path: Path
    rayjob: dict
    configmaps: dict[str, dict]
    others: list[dict] = field(default_factory=list)

    @property
    def name(self) -> str:
        return str(self.rayjob["metadata"]["name"])

    @property
    def spec(self) -> dict:
        return self.rayjob["spec"]


def load_rayjob(path: Path) -> JobInput:
    """The one RayJob of a multi-document file (or of a kustomization directory, as `kubectl apply -k` would
    apply it), plus its ConfigMaps."""
    try:  # the strict reader `raytrain validate` uses: UTF-8, no key twice, bounded depth
        if is_kustomization(path):
            docs = yamlfile.load_all(kustomize_build(path), f"{path} (kubectl kustomize)")
        else:
            docs = yamlfile.read_all(Path(path))
        docs = [d for d in docs if d is not None]
    except (KustomizeError, yamlfile.YAMLFileError) as err:
        raise RayJobError(str(err)) from None
    except OSError as err:
        raise RayJobError(f"{path}: cannot be read ({err.strerror}). Fix: check the path") from None
    jobs = [d for d in docs if isinstance(d, dict) and d.get("kind") == "RayJob"]
    if len(jobs) != 1:
        raise RayJobError(f"{path}: holds {len(jobs)} RayJob objects; emulate runs exactly one. "
                          "Fix: keep one RayJob (and its ConfigMaps) per file")
    job = jobs[0]
    if not isinstance(job.get("metadata"), dict) or not job["metadata"].get("name"):
        raise RayJobError(f"{path}: RayJob: metadata.name is missing. Fix: name the RayJob")
    if not isinstance(job.get("spec"), dict) or not str(job["spec"].get("entrypoint") or "").strip():
        raise RayJobError(f"{path}: RayJob/{job['metadata']['name']}: spec.entrypoint is missing. "
                          "Fix: set the command the job runs on the head, e.g. `raytrain run job.yaml ...`")
    configmaps = {d["metadata"]["name"]: d for d in docs
                  if isinstance(d, dict) and d.get("kind") == "ConfigMap" and (d.get("metadata") or {}).get("name")}
    others = [d for d in docs if d is not job and d not in configmaps.values()]
    return JobInput(Path(path), job, configmaps, others)


def check_schema(job: JobInput, crd_dir: Path) -> list[str]:
    """What the API server would reject: the RayJob against the KubeRay v1.7.0 CRD schema."""
    return [str(p) for p in check_ray_schema(Doc(str(job.path), job.rayjob), Path(crd_dir))]


def cluster_spec(job: JobInput, values_path: Path | None) -> tuple[dict, str, bool]:
    """(RayCluster spec, its name, whether the RayJob owns it) for the job's cluster."""
    spec = job.spec
    if spec.get("rayClusterSpec"):
        return spec["rayClusterSpec"], f"{job.name}-raycluster", True
    selector = spec.get("clusterSelector") or {}
    name = selector.get("ray.io/cluster")
    if not name:
        raise RayJobError(f"{job.path}: RayJob/{job.name}: spec has neither rayClusterSpec nor "
                          "clusterSelector['ray.io/cluster']. Fix: embed a rayClusterSpec or select a RayCluster")
    for doc in job.others:
        if isinstance(doc, dict) and doc.get("kind") == "RayCluster" and doc["metadata"].get("name") == name:
            return doc["spec"], name, False
    docs, problems = target_cluster(name, [], values_path, None)
    if problems:
        raise RayJobError("; ".join(str(p) for p in problems))
    for doc in docs:
        if doc.kind == "RayCluster" and doc.name == name:
            return doc.obj["spec"], name, False
    raise RayJobError(f"{job.path}: RayJob/{job.name}: spec.clusterSelector selects RayCluster {name!r}, which the "
                      f"chart does not render{f' with {values_path}' if values_path else ''}. Fix: pass the chart "
                      "values the cluster was installed with (--values), or select the release's RayCluster name")


# What kubelet takes from an envFrom source: keys that are C identifiers (it skips others with an event; Kubernetes
# >= 1.30 also allows any printable name, which a shell cannot read: the same keys are kept here as there by the
# older rule, the one every Ray image's shell handles).
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _source_data(job: JobInput, kind: str, name: str) -> dict[str, str] | None:
    """The data of the Secret or ConfigMap `name` in the RayJob's file, as strings (a Secret's `data` decoded from
    base64, its `stringData` over it, as the API server merges them); None when the file has no such object."""
    if kind == "ConfigMap":
        doc = job.configmaps.get(name)
    else:
        doc = next((d for d in job.others if isinstance(d, dict) and d.get("kind") == kind
                    and (d.get("metadata") or {}).get("name") == name), None)
    if doc is None:
        return None
    data: dict[str, str] = {}
    for key, value in (doc.get("data") or {}).items():
        if kind == "Secret":
            try:
                data[str(key)] = base64.b64decode(str(value), validate=True).decode()
            except (binascii.Error, UnicodeDecodeError):
                raise RayJobError(f"{job.path}: Secret/{name}: data.{key} is not base64 of UTF-8 text. Fix: encode it "
                                  "with base64, or give it as plain text under stringData") from None
        else:
            data[str(key)] = str(value)
    if kind == "Secret":
        data.update({str(k): str(v) for k, v in (doc.get("stringData") or {}).items()})
    return data


def container_env(job: JobInput, container: dict, where: str) -> list[dict]:
    """The container's environment as kubelet builds it (kubelet_pods.go makeEnvironmentVariables): every envFrom
    source in order, then env, a later name replacing an earlier one; as literal {name, value} entries. fieldRef and
    resourceFieldRef entries are left out (nothing here has a pod's fields)."""
    def missing(kind: str, name: str, field_name: str) -> RayJobError:
        return RayJobError(f"{job.path}: RayJob/{job.name}: {field_name} takes the environment from {kind} {name!r}, "
                           f"which the file does not hold: kubelet would keep the pod in CreateContainerConfigError. "
                           f"Fix: add the {kind} to the same file (emulate has no API server to read it from), e.g. "
                           f"`kubectl create {'secret generic' if kind == 'Secret' else 'configmap'} {name} --from-literal=KEY=VALUE --dry-run=client "
                           "-o yaml`, or mark the reference optional: true")

    out: list[dict] = []
    for i, source in enumerate(container.get("envFrom") or []):
        for kind, ref_key in (("Secret", "secretRef"), ("ConfigMap", "configMapRef")):
            ref = (source or {}).get(ref_key)
            if not isinstance(ref, dict):
                continue
            data = _source_data(job, kind, str(ref.get("name")))
            if data is None:
                if ref.get("optional"):
                    continue
                raise missing(kind, str(ref.get("name")), f"{where}.envFrom[{i}].{ref_key}")
            prefix = str(source.get("prefix") or "")
            out += [{"name": prefix + key, "value": value} for key, value in data.items()
                    if _ENV_NAME.match(prefix + key)]
    for i, entry in enumerate(container.get("env") or []):
        if not isinstance(entry, dict) or "name" not in entry:
            continue
        if "value" in entry or "valueFrom" not in entry:
            out.append({"name": entry["name"], "value": str(entry.get("value", ""))})
            continue
        value_from = entry.get("valueFrom") or {}
        for kind, ref_key in (("Secret", "secretKeyRef"), ("ConfigMap", "configMapKeyRef")):
            ref = value_from.get(ref_key)
            if not isinstance(ref, dict):
                continue
            field_name = f"{where}.env[{i}].valueFrom.{ref_key}"
            data = _source_data(job, kind, str(ref.get("name")))
            if data is None:
                if ref.get("optional"):
                    break
                raise missing(kind, str(ref.get("name")), field_name)
            if ref.get("key") not in data:
                if ref.get("optional"):
                    break
                raise RayJobError(f"{job.path}: RayJob/{job.name}: {field_name}: {kind} {ref.get('name')!r} has no "
                                  f"key {ref.get('key')!r} (it has: {', '.join(sorted(data)) or 'none'}): kubelet "
                                  f"would keep the pod in CreateContainerConfigError. Fix: add the key, or correct "
                                  "the reference")
            out.append({"name": entry["name"], "value": data[ref["key"]]})
    return out


def resolve_env(job: JobInput, spec: dict, where: str) -> dict:
    """A copy of a RayCluster spec whose Ray containers (the first of each group) carry their environment as literal
    values (container_env), so that every node starts with what its pod's container would have."""
    spec = copy.deepcopy(spec)
    groups = [("headGroupSpec", spec.get("headGroupSpec"))]
    groups += [(f"workerGroupSpecs[{i}]", g) for i, g in enumerate(spec.get("workerGroupSpecs") or [])]
    for path, group in groups:
        containers = ((group or {}).get("template") or {}).get("spec", {}).get("containers") or []
        if containers and isinstance(containers[0], dict):
            containers[0]["env"] = container_env(job, containers[0], f"{where}.{path}.template.spec.containers[0]")
            containers[0].pop("envFrom", None)
    return spec


def submitter_mounts(job: JobInput) -> dict[str, tuple[str, dict]]:
    """mountPath -> (ConfigMap name, volume) for the ConfigMap volumes of the submitter pod's first container."""
    template = job.spec.get("submitterPodTemplate") or {}
    pod = template.get("spec") or {}
    volumes = {v.get("name"): v for v in pod.get("volumes") or [] if isinstance(v, dict)}
    containers = pod.get("containers") or [{}]
    mounts = {}
    for mount in containers[0].get("volumeMounts") or []:
        volume = volumes.get(mount.get("name"))
        if volume and "configMap" in volume:
            mounts[mount["mountPath"].rstrip("/") or "/"] = (volume["configMap"].get("name"), volume["configMap"])
    return mounts


def materialise_configmaps(job: JobInput, dest: Path) -> dict[str, Path]:
    """Write every ConfigMap the submitter mounts into dest; returns mountPath -> local directory."""
    result = {}
    for i, (mount_path, (cm_name, source)) in enumerate(sorted(submitter_mounts(job).items())):
        configmap = job.configmaps.get(cm_name)
        if configmap is None:
            if source.get("optional"):
                continue
            raise RayJobError(f"{job.path}: RayJob/{job.name}: spec.submitterPodTemplate mounts ConfigMap "
                              f"{cm_name!r} at {mount_path}, but the file has no such ConfigMap. Fix: add the "
                              "ConfigMap to the same file (emulate has no API server to fetch it from)")
        data = {**(configmap.get("data") or {})}
        items = source.get("items")
        files = {item["path"]: data[item["key"]] for item in items if item["key"] in data} if items else data
        local = dest / f"cm{i}"
        for rel, text in files.items():
            target = local / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(str(text))
        local.mkdir(parents=True, exist_ok=True)
        result[mount_path] = local
    return result


def local_runtime_env(job: JobInput, mounts: dict[str, Path]) -> dict:
    """runtimeEnvYAML with submitter-side paths (working_dir, py_modules) mapped onto the materialised mounts."""
    text = job.spec.get("runtimeEnvYAML")
    if not text:
        return {}
    try:
        env = yamlfile.load(str(text), "spec.runtimeEnvYAML") or {}
    except yamlfile.YAMLFileError as err:
        raise RayJobError(f"{job.path}: RayJob/{job.name}: spec.runtimeEnvYAML is not valid YAML ({err.message}). "
                          "Fix: write it as a YAML block, e.g. `runtimeEnvYAML: |` then `working_dir: ...`") from None
    if not isinstance(env, dict):
        raise RayJobError(f"{job.path}: RayJob/{job.name}: spec.runtimeEnvYAML must be a mapping (working_dir, "
                          "pip, env_vars, ...). Fix: write `key: value` lines")

    def local(path: str, key: str) -> str:
        if "://" in path:  # a remote URI (gs://, https://...) is fetched by Ray itself
            return path
        for mount_path, directory in sorted(mounts.items(), key=lambda kv: -len(kv[0])):
            if path == mount_path or path.startswith(mount_path + "/"):
                return str(directory / path[len(mount_path):].lstrip("/"))
        if Path(path).exists():
            return path
        raise RayJobError(f"{job.path}: RayJob/{job.name}: spec.runtimeEnvYAML {key} {path} is not mounted into "
                          f"the submitter pod (mounted: {sorted(mounts) or 'nothing'}). Fix: mount the ConfigMap "
                          "there with spec.submitterPodTemplate volumes and volumeMounts")

    if isinstance(env.get("working_dir"), str):
        env["working_dir"] = local(env["working_dir"], "working_dir")
    if isinstance(env.get("py_modules"), list):
        env["py_modules"] = [local(p, "py_modules") if isinstance(p, str) else p for p in env["py_modules"]]
    return env


def new_job_id(job: JobInput) -> str:
    """KubeRay's JobId: spec.jobId, else the RayJob's name and 5 random lowercase letters or digits."""
    if job.spec.get("jobId"):
        return str(job.spec["jobId"])
    alphabet = string.ascii_lowercase + string.digits
    return f"{job.name}-{''.join(secrets.choice(alphabet) for _ in range(5))}"


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


# --------------------------------------------------------------------------------------------------- suspend
# `kubectl patch rayjob NAME --type merge -p '{"spec":{"suspend":true}}'` for an emulated RayJob: spec.suspend lives
# in a file of the cluster's run dir, written by `raytrain cluster suspend|unsuspend RUN_ID` and polled by the
# emulation, which reads it as a level (KubeRay's reconciler compares spec and status, it sees no events). The
# emulation writes the RayJob's status next to it, for the command's checks.
SUSPEND_FILE = "rayjob-suspend"  # "true" or "false"
STATUS_FILE = "rayjob-status.json"  # {"name", "jobDeploymentStatus", "suspendRefused"}
# rayjob_controller.go updateStatusToSuspendingIfNeeded: only Initializing and Running go to Suspending, and New or
# Retrying get there through Initializing; a finished RayJob never does, so a request then is refused.
FINISHED = ("Complete", "Failed", "ValidationFailed")


def suspend_refusal(spec: dict, owns_cluster: bool) -> str:
    """Why KubeRay v1.7.0 would not suspend this RayJob ("" when it would): utils/validation.go ValidateRayJobSpec
    fails a RayJob whose spec.suspend is true in these cases (jobDeploymentStatus ValidationFailed)."""
    if not owns_cluster:
        return ("KubeRay v1.7.0 marks a clusterSelector RayJob ValidationFailed when spec.suspend is true (\"the "
                "ClusterSelector mode doesn't support the suspend operation\", utils/validation.go "
                "ValidateRayJobSpec). Fix: suspend a RayJob with its own rayClusterSpec (manifests/rayjob-standalone.yaml)")
    if not spec.get("shutdownAfterJobFinishes"):
        return ("KubeRay v1.7.0 marks a RayJob with shutdownAfterJobFinishes false ValidationFailed when spec.suspend "
                "is true (utils/validation.go ValidateRayJobSpec). Fix: set spec.shutdownAfterJobFinishes: true")
    return ""


def parse_suspend(text: str, where: str) -> bool:
    value = text.strip()
    if value not in ("true", "false"):
        raise RayJobError(f"{where}: holds {value[:40]!r}, not true or false (the RayJob's spec.suspend). Fix: let "
                          "`raytrain cluster suspend|unsuspend RUN_ID` write it")
    return value == "true"


def write_suspend(run_dir: Path, suspend: bool) -> None:
    files.write_atomic(Path(run_dir) / SUSPEND_FILE, "true\n" if suspend else "false\n")


def write_status(run_dir: Path, name: str, deployment: str, refusal: str) -> None:
    status = {"name": name, "jobDeploymentStatus": deployment, "suspendRefused": refusal}
    files.write_atomic(Path(run_dir) / STATUS_FILE, json.dumps(status) + "\n")


def set_suspend(run_id: str, suspend: bool) -> str:
    """`raytrain cluster suspend|unsuspend RUN_ID`: set spec.suspend of the RayJob a running `raytrain emulate`
    runs. Returns what was done; raises RayJobError (one line, naming the fix) for what cannot be done."""
    fix = "Fix: pass the run id of a running `raytrain emulate` (its line `cluster rte<id>: ...`)"
    if not localcluster.is_run_id(run_id):
        raise RayJobError(f"{run_id!r} is not an emulated cluster's run id (rte and 6 hex digits). {fix}")
    run_dir = localcluster.RUN_ROOT / run_id
    try:
        state = json.loads((run_dir / "state.json").read_text())
    except (OSError, ValueError):
        raise RayJobError(f"no emulated cluster {run_id} ({run_dir / 'state.json'} is missing or unreadable): its "
                          f"`raytrain emulate` has ended, or the id is mistyped. {fix}") from None
    try:
        status = json.loads((run_dir / STATUS_FILE).read_text())
        name, deployment = status["name"], status["jobDeploymentStatus"]
    except (OSError, ValueError, KeyError, TypeError):
        raise RayJobError(f"{run_id} runs no RayJob ({run_dir / STATUS_FILE} is missing or unreadable): only "
                          f"`raytrain emulate` acts on spec.suspend. {fix}") from None
    if process_start(state.get("owner_pid", -1)) != state.get("owner_started") or state.get("owner_started") is None:
        raise RayJobError(f"the `raytrain emulate` of {run_id} is not running (a --keep cluster, or a killed run): "
                          f"nothing would act on spec.suspend. {fix}")
    if status.get("suspendRefused"):
        raise RayJobError(f"RayJob {name}: {status['suspendRefused']}")
    try:
        current = parse_suspend((run_dir / SUSPEND_FILE).read_text(), str(run_dir / SUSPEND_FILE))
    except FileNotFoundError:
        current = False
    except OSError as err:
        raise RayJobError(f"{run_dir / SUSPEND_FILE}: cannot be read ({err.strerror}). {fix}") from None
    if current == suspend:
        other = "unsuspend" if suspend else "suspend"
        raise RayJobError(f"RayJob {name}: spec.suspend is already {str(suspend).lower()} (jobDeploymentStatus "
                          f"{deployment}). Fix: `raytrain cluster {other} {run_id}`"
                          + (" to resume it" if suspend else " first"))
    if suspend and deployment in FINISHED:
        raise RayJobError(f"RayJob {name} is {deployment}: KubeRay v1.7.0 suspends only an Initializing or Running "
                          "RayJob (rayjob_controller.go updateStatusToSuspendingIfNeeded). Fix: nothing to "
                          "suspend; `raytrain emulate` it again")
    write_suspend(run_dir, suspend)
    then = ("Suspending: its pods are deleted (preStop hooks, SIGTERM), then Suspended" if suspend
            else "New, then Initializing: a new cluster and a new submission")
    return f"RayJob {name}: spec.suspend set to {str(suspend).lower()}; the emulation goes {then} (its [emulate] lines)"


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
