"""What p3, p4 and scaling share: a real local multi-node cluster shaped like the chart's (a head with num-cpus 0,
worker nodes), jobs submitted with `ray job submit` as KubeRay's submitter does, and when a run reached an
optimizer step, read from what the run, Ray and the bench's own probe write, never from raytrain's console lines.

Every use of raytrain's local cluster (raytrain.cluster) is in this module."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Iterable, Optional, TextIO

from bench.harness import BENCH_ROOT

# Ray Train's own controller log lines (not raytrain's): when it asks for a worker group, when the group is up,
# and when it decided what to do about a failed worker.
WORKER_GROUP_REQUESTED = "Attempting to start training worker group"
WORKER_GROUP_STARTED = "Started training worker group"
FAILURE_DECIDED = "[FailurePolicy]"
# The class of Ray Train's controller actor: the driver creates it when the trainer's fit() starts.
TRAIN_CONTROLLER_CLASS = "TrainController"


def bench_cluster(shared_dir: Path, worker_nodes: int = 2, cpus_per_node: float = 2.0,
                  out: Optional[TextIO] = None):
    """A head (num-cpus 0 and failure detection, as the chart sets them) plus worker nodes, token auth on, every node
    with the chart's preStop hook and grace period (what a pod deletion runs). Nodes on their own loopback addresses:
    what is timed here is Ray and raytrain, not the network namespaces."""
    from raytrain.cluster.localcluster import FAILURE_DETECTION_ENV, ClusterShape, LocalCluster, NodeSpec

    pre_stop, grace = chart_pre_stop()
    shape = ClusterShape(
        head=NodeSpec("head", "head", True, num_cpus=0, memory=2 * 2**30, env=dict(FAILURE_DETECTION_ENV),
                      pre_stop=list(pre_stop), grace_seconds=grace),
        workers=[NodeSpec(f"worker-{i}", "worker", False, num_cpus=cpus_per_node, memory=3 * 2**30,
                          pre_stop=list(pre_stop), grace_seconds=grace)
                 for i in range(worker_nodes)],
        auth_token=True)
    cluster = LocalCluster(shape, out=out or sys.stderr, isolation="loopback", shared_dir=shared_dir)
    try:
        cluster.start(timeout=300)  # generous: the machine may be shared and busy
    except BaseException:
        cluster.stop()
        raise
    return cluster


def chart_pre_stop(values_file: Optional[Path] = None) -> tuple[list[str], int]:
    """The Ray containers' preStop command and the pods' terminationGracePeriodSeconds as the chart's default values
    make them (helm/raytrain-cluster/templates/_helpers.tpl: `raytrain drain --wait <grace - marginSeconds>`); no
    hook where the values turn it off."""
    import yaml
    from raytrain.validator.render import default_chart_dir

    values = yaml.safe_load((values_file or default_chart_dir() / "values.yaml").read_text())
    grace = int(values["terminationGracePeriodSeconds"])
    drain = values.get("preStopDrain") or {}
    if not drain.get("enabled"):
        return [], grace
    return ["raytrain", "drain", "--wait", str(grace - int(drain["marginSeconds"]))], grace


def training_node(cluster):
    """The worker node that holds a training worker (Ray packs both onto one node when they fit)."""
    from raytrain.cluster.pods import node_processes

    state_file = cluster.run_dir / "state.json"
    hosts = [n for n in cluster.nodes[1:] if node_processes(state_file, n.spec.name, "RayTrainWorker")]
    return hosts[0] if hosts else cluster.nodes[-1]


def kill_training_node(cluster) -> tuple[object, float]:
    """SIGKILL every process of the worker node that holds a training worker, as a lost pod; returns that node and
    when the kill began."""
    from raytrain.cluster.pods import kill_node

    victim = training_node(cluster)
    killed_at = time.time()
    kill_node(cluster.run_dir / "state.json", victim.spec.name)
    return victim, killed_at


class NodeDeletion:
    """Delete the worker node that holds a training worker as kubelet deletes its pod (its preStop hook, SIGTERM,
    SIGKILL after the grace period: raytrain.cluster.pods.delete_node), in the background: the deletion waits
    for the training there to checkpoint, and the next step is timed meanwhile."""

    def __init__(self, cluster):
        from raytrain.cluster.pods import delete_node

        self.node = training_node(cluster)
        self.outcome: Optional[dict] = None
        self.error: Optional[BaseException] = None
        self.began = time.time()

        def delete() -> None:
            try:
                self.outcome = delete_node(cluster.run_dir / "state.json", self.node.spec.name)
            except BaseException as err:  # noqa: BLE001 - handed to whoever waits
                self.error = err

        self.thread = threading.Thread(target=delete, daemon=True)
        self.thread.start()

    def wait(self, timeout: float = 300) -> dict:
        """What delete_node returned (its hook's status and output, when the node ended, what was SIGKILLed)."""
        self.thread.join(timeout)
        if self.error is not None:
            raise self.error
        if self.outcome is None:
            raise RuntimeError(f"deleting node {self.node.spec.name} did not end within {timeout:g}s")
        return self.outcome


# ----------------------------------------------------------------------------------------------------------
# jobs


def job_dir(work: Path, name: str, config: Optional[Path | dict] = None, ship_bench: bool = False) -> Path:
    """The submitter's working dir: the run config as job.yaml, as the RayJob's ConfigMap carries it, and the
    bench package itself where the job runs bench code (Ray ships the working dir to the driver and workers)."""
    import yaml

    path = work / "jobs" / name
    path.mkdir(parents=True, exist_ok=True)
    if isinstance(config, dict):
        (path / "job.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    elif config is not None:
        shutil.copy(config, path / "job.yaml")
    if ship_bench:
        shutil.copytree(BENCH_ROOT / "bench", path / "bench", ignore=shutil.ignore_patterns("__pycache__"),
                        dirs_exist_ok=True)
    return path


class FollowedJob:
    """A job submitted like KubeRay's submitter does, its log followed (for its status and its tail)."""

    def __init__(self, cluster, entrypoint: str, working_dir: Path, job_id: str,
                 runtime_env_vars: Optional[dict[str, str]] = None):
        """runtime_env_vars: the job's runtime env's env_vars (its driver and every task and actor of it get them)."""
        self.cluster, self.job_id = cluster, job_id
        runtime_env: dict = {"working_dir": str(working_dir)}
        if runtime_env_vars:
            runtime_env["env_vars"] = runtime_env_vars
        self.env = cluster.client_env()
        address = ["--address", cluster.dashboard_url]
        self.submitted = time.time()
        subprocess.run([ray_cli(), "job", "submit", *address, "--no-wait", "--submission-id", job_id,
                        "--runtime-env-json", json.dumps(runtime_env), "--",
                        *shlex.split(entrypoint)], env=self.env, check=True, capture_output=True, text=True)
        self.submit_returned = time.time()
        self.lines: list[str] = []
        self.ended: Optional[float] = None  # when the log follower saw the job end
        self.follower = subprocess.Popen([ray_cli(), "job", "logs", *address, "--follow", job_id], env=self.env,
                                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.follower.stdout:
            self.lines.append(line.rstrip())
        self.ended = time.time()

    def alive(self) -> bool:
        return self.follower.poll() is None

    def wait(self, timeout: float = 600) -> str:
        try:
            self.follower.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.follower.kill()
        self.reader.join(timeout=5)
        status = subprocess.run([ray_cli(), "job", "status", "--address", self.cluster.dashboard_url, self.job_id],
                                env=self.env, capture_output=True, text=True)
        text = (status.stdout + status.stderr + "\n".join(self.lines[-5:])).upper()
        for state in ("SUCCEEDED", "FAILED", "STOPPED"):
            if state in text:
                return state
        return "UNKNOWN"

    def ended_at(self) -> Optional[float]:
        """When Ray's job record says the job ended (its end_time: the moment the supervisor saw the entrypoint
        exit, what KubeRay's RayJob status reads), or None."""
        from raytrain.cluster.dashboard import http_get

        try:
            status, body = http_get(f"{self.cluster.dashboard_url}/api/jobs/{self.job_id}", self.cluster.token)
            end = json.loads(body).get("end_time") if status == 200 else None
        except (OSError, ValueError):
            return None
        return end / 1000.0 if isinstance(end, (int, float)) and end > 0 else None

    def tail(self, n: int = 15) -> str:
        return "\n".join(self.lines[-n:])


def ray_cli() -> str:
    return str(Path(sys.executable).parent / "ray")


# ----------------------------------------------------------------------------------------------------------
# when things happened


def wait_row(read_rows: Callable[[], list[dict]], after: float, timeout: float,
             alive: Callable[[], bool]) -> Optional[dict]:
    """The first row (a dict with an epoch-seconds "time") at or after `after`, polled until `timeout` passes or
    `alive()` says the job has ended. Workers run on this machine, so their clock is this clock."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        row = next((r for r in read_rows() if r.get("time", -1) >= after), None)
        if row is not None or not alive():
            return row
        time.sleep(0.05)
    return None


def run_started(run_dir: Path, after: float, timeout: float, alive: Callable[[], bool]) -> Optional[dict]:
    """The run's `start` row in events.jsonl (rank 0 ready: model built, checkpoint restored) at or after
    `after`, with its resumed_from_epoch."""
    from raytrain.rundir import runrecords

    return wait_row(lambda: [r for r in runrecords.read_events(run_dir) if r.get("event") == "start"], after, timeout,
                    alive)


def timed_job_dir(work: Path, name: str, preset: str, probe_path: str, every_step: bool = False) -> Path:
    """The working dir of a job whose first step p3 or p4 times: `preset` (a preset name or a run config file),
    resolved, as job.yaml with its model wrapped in bench.probes.FirstStepProbe, which appends to `probe_path`
    (where the probe's file is as the job sees it), and the bench package beside it for the driver and workers to
    import. With first_step_time, the one place that knows how the first step is observed."""
    return job_dir(work, name, probed_config(resolved_preset(preset), probe_path, every_step), ship_bench=True)


def resolved_preset(preset: str) -> dict:
    """The preset as one self-contained run config: its sections resolved (include: files layered in, short names
    spelled out) and, as its smoke block, the dotted keys that --smoke-test changes."""
    from raytrain.spec.config import load_config

    full, smoke = (_dotted(load_config(preset, smoke=smoke).to_dict()) for smoke in (False, True))
    config = load_config(preset).to_dict()
    config["smoke"] = {key: value for key, value in smoke.items() if full.get(key, object()) != value}
    return config


def _dotted(config: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in config.items():
        if isinstance(value, dict):
            out.update(_dotted(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def first_step_time(run_dir: Path, after: float, timeout: float, alive: Callable[[], bool]) -> Optional[float]:
    """When rank 0 of the run in `run_dir` finished its first optimizer step at or after `after` (epoch seconds),
    or None if the job ended or `timeout` passed first. The one place that knows how this is read: the
    FirstStepProbe's STEP_DONE rows in probe_file(run_dir) (a restarted worker group writes its own)."""
    from bench.probes import STEP_DONE
    from raytrain.rundir import runrecords

    row = wait_row(lambda: [r for r in runrecords.read_jsonl(probe_file(run_dir)) if r.get("event") == STEP_DONE], after,
                   timeout, alive)
    return row["time"] if row else None


def trained_steps(run_dir: Path, at: float) -> tuple[list[tuple[int, int]], Optional[int]]:
    """The steps, as (epoch, step in that epoch), that the worker group training at `at` (epoch seconds) is known to
    have completed by then, and the steps of one whole epoch as that group trained them (None before it finished
    one). Read from the FirstStepProbe's FORWARD rows (every_step) and the run's `start` events: a step is known
    completed once rank 0's next forward pass (of either kind) began, since a loop steps the optimizer first."""
    from bench.probes import FORWARD
    from raytrain.rundir import runrecords

    rows = [r for r in runrecords.read_jsonl(probe_file(run_dir)) if r.get("event") == FORWARD]
    before = [r for r in rows if r["time"] <= at]
    if not before:
        return [], None
    group = [r for r in rows if r["group"] == before[-1]["group"]]
    starts = [e for e in runrecords.read_events(run_dir) if e.get("event") == "start" and e["time"] <= group[0]["time"]]
    start = starts[-1] if starts else {}
    first_epoch, skipped = int(start.get("start_epoch") or 1), int(start.get("resumed_at_step") or 0)
    done = []
    for row, after in zip(group, group[1:]):
        if row["train"] and after["time"] <= at:
            done.append((first_epoch + row["phase"] - 1, (skipped if row["phase"] == 1 else 0) + row["step"]))
    last_phase = max(r["phase"] for r in group if r["train"]) if any(r["train"] for r in group) else 0
    whole = (r["step"] for r in group if r["train"] and r["phase"] < last_phase and (r["phase"] > 1 or not skipped))
    return done, max(whole, default=None)


def steps_lost(done: list[tuple[int, int]], resumed_from_epoch: Optional[int], resumed_at_step: Optional[int]) -> int:
    """Of the completed steps `done` ((epoch, step) pairs), those a run resumed after `resumed_from_epoch` whole
    epochs and `resumed_at_step` steps of the next one trains again."""
    resume = ((resumed_from_epoch or 0) + 1, resumed_at_step or 0)
    return sum(1 for position in done if position > resume)


def probe_file(run_dir: Path) -> Path:
    """Where FirstStepProbe writes for the run in `run_dir`: beside the run directory, never inside what the run
    itself owns."""
    return run_dir.with_name(f"{run_dir.name}.first-step.jsonl")


def probed_config(config: dict, probe_path: str, every_step: bool = False) -> dict:
    """A run config (plain data, as read from YAML) whose model is wrapped in bench.probes.FirstStepProbe, which
    appends rank 0's first forward passes to `probe_path` (as the workers see it), and every one with `every_step`.
    The smoke block's model keys follow the model into `inner`, so that --smoke-test shrinks the real model."""
    from bench.probes import FirstStepProbe
    from raytrain.spec.components import COMPONENT_KEY, LEGACY_NAME_KEY, canonical_path

    inner = config.get("model")
    if not isinstance(inner, dict):
        raise ValueError(f"the run config has no model section to wrap (model: {inner!r})")
    inner = dict(inner)
    reference = inner.pop(COMPONENT_KEY, None) or inner.pop(LEGACY_NAME_KEY, None)
    if isinstance(reference, str):  # the probe builds it by import path: a built-in's short name spelled out
        inner = {COMPONENT_KEY: canonical_path(reference, "model"), **inner}
    probe = f"{FirstStepProbe.__module__}.{FirstStepProbe.__name__}"
    probed = {**config, "model": {"_component_": probe, "inner": inner, "path": probe_path,
                                  **({"every_step": True} if every_step else {})}}
    if isinstance(config.get("smoke"), dict):
        probed["smoke"] = {(f"model.inner.{key[len('model.'):]}" if str(key).startswith("model.") else key): value
                           for key, value in config["smoke"].items()}
    return probed


def controller_log_time(temp_dirs: Iterable[Path], marker: str, after: float) -> Optional[float]:
    """When Ray Train's controller first logged `marker` at or after `after` (epoch seconds), read from its JSON
    log files in the nodes' session directories. The driver does not receive the controller's output (raytrain
    runs Ray with log_to_driver=False), but Ray keeps it in logs/train/ray-train-*-controller-*.log."""
    times = []
    for temp_dir in temp_dirs:
        for log in Path(temp_dir).glob("session_*/logs/train/ray-train-*-controller-*.log"):
            for line in log.read_text(errors="replace").splitlines():
                if marker not in line:
                    continue
                try:
                    stamp = json.loads(line)["asctime"]  # "2026-11-21 11:23:33,411", the node's local time
                    seconds, millis = stamp.split(",")
                    at = time.mktime(time.strptime(seconds, "%Y-%m-%d %H:%M:%S")) + int(millis) / 1000
                except (ValueError, KeyError):
                    continue
                if at >= after:
                    times.append(at)
    return min(times, default=None)


def actor_created_time(dashboard_url: str, env: dict, class_name: str, after: float,
                       before: float) -> Optional[float]:
    """When a driver asked Ray for an actor of `class_name` (the creation time of its creation task in Ray's task
    events) within [after, before], or None when Ray's state API cannot say. Asked from a child process with the
    cluster's client environment (its auth token)."""
    code = ("import json, sys; from ray.util.state import list_tasks; "
            "tasks = list_tasks(address=sys.argv[1], filters=[('name', '=', sys.argv[2] + '.__init__')], "
            "detail=True, limit=10000, raise_on_missing_output=False); "
            "print(json.dumps([t.creation_time_ms for t in tasks if t.creation_time_ms]))")
    proc = subprocess.run([sys.executable, "-c", code, dashboard_url, class_name], env=env, capture_output=True,
                          text=True)
    try:
        times = [ms / 1000 for ms in json.loads(proc.stdout.strip().splitlines()[-1])]
    except (ValueError, IndexError, TypeError):
        return None
    return min((t for t in times if after <= t <= before), default=None)
