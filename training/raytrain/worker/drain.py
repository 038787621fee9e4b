"""Nothing lost when Kubernetes deletes a Ray pod: the pod's preStop hook (`raytrain drain`) and the worker-side probe
(`node_draining`) that the training step decision reads.

What happens on a pod deletion (KubeRay v1.7.0 and Ray 2.55.1):
- kubelet runs the Ray container's preStop hook, then sends SIGTERM to the container's PID 1, then SIGKILL once
  terminationGracePeriodSeconds have passed since the deletion (the hook's time counts against it).
- PID 1 is KubeRay's generated `/bin/bash -c -- "ulimit -n 65536; ray start ... --block"` (common/pod.go BuildPod,
  utils.GetContainerCommand; `--block` since kuberay#675). `ray start --block` answers SIGTERM by stopping the
  node's Ray processes; the Ray Train worker actors themselves never see kubelet's SIGTERM and nothing checkpoints.
  KubeRay sets no preStop hook of its own: "If users want to stop the Ray job by SIGTERM, users need to set the
  Pod's preStop hook by themselves" (controllers/ray/rayjob_controller.go, Suspending/Retrying).
- Ray's node drain (GcsClient.drain_node, the hidden `ray drain-node` of ray/scripts/scripts.py, which the autoscaler
  uses too) marks a node DRAINING: the GCS places no new work there, the autoscaler state
  (GetClusterResourceState, ray.autoscaler.v2.sdk) shows the node as DRAINING within about a second, and once the
  node is idle its raylet exits on its own. Draining an idle node (or the head) ends its raylet at once: the head is
  never drained, or the GCS and every driver would go with it (tried here: the driver's node "crashed").

So the preStop hook, on the node it runs on:
1. on a worker node: writes a drain notice into the node's Ray session directory (read by `node_draining` as well,
   should the GCS not answer) and asks the GCS to drain the node, with the deadline the pod's grace period leaves;
2. sends SIGTERM to the `raytrain run`/`raytrain tune` drivers this node's Ray started (on the head pod: the
   RayJob's driver, which Ray's job supervisor runs), which stop their run gracefully;
3. waits, at most --wait seconds, until the training on this node has ended (no drivers, no Ray Train worker
   actors, or the raylet gone), so that kubelet's SIGTERM and SIGKILL only come after the checkpoint.
The Ray Train workers, at their synced step decision, see `node_draining()` on one of them: all checkpoint at that
step and end the worker group with `NodeDraining`; Ray Train starts a new group on the nodes left (not the draining
one) and it resumes from that checkpoint.

Token auth: a preStop exec hook runs with the container's environment, where KubeRay's authOptions put
RAY_AUTH_MODE=token and RAY_AUTH_TOKEN from the cluster's Secret (common/pod.go SetContainerTokenAuthEnvVars); Ray's
GcsClient reads both from there. Torch-free; Ray is imported only where it is used.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Callable, TextIO

from raytrain.errors import RaytrainError
from raytrain.platform import rayinternals
from raytrain.platform.processes import proc_table
from raytrain.rundir import atomicfile

NOTICE_NAME = "raytrain-drain.json"
# How often a worker asks the GCS at most; between asks node_draining() answers from its last look.
PROBE_INTERVAL_S = 0.5
DRIVER_COMMANDS = ("run", "tune")


class DrainError(RaytrainError):
    """`raytrain drain` cannot tell which Ray node it runs on; the message names the candidates and the fix."""


# The line a worker logs when it ends its group for a drain.
DRAIN_MESSAGE = ("this Ray node is being drained (its pod is being deleted): checkpointed at this step; the run goes "
                 "on on the other nodes from that checkpoint")


class NodeDraining(RuntimeError):
    """Raised by every worker of a group after the checkpoint of a step at which some worker's node was draining:
    the group ends, and Ray Train starts a new one (on the nodes left) that resumes from that checkpoint."""


# ----------------------------------------------------------------------------------------- the node we are on

LocalRaylet = rayinternals.LocalRaylet
local_raylets = rayinternals.local_raylets


def notice_path(raylet: LocalRaylet) -> Path:
    """Where `raytrain drain` leaves its notice for the node's workers: the node's Ray session directory."""
    return Path(raylet.session_dir) / NOTICE_NAME


def _is_local_address(ip: str) -> bool:
    import socket

    try:
        with socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET) as sock:
            sock.bind((ip, 0))
        return True
    except OSError:
        return False


def this_raylet(temp_dir: str | None = None, table: dict | None = None) -> LocalRaylet | None:
    """The raylet of the node this process runs on, or None when no Ray node runs here. Where several are visible
    (nodes sharing one machine), the one whose address belongs to this network namespace. temp_dir (`raytrain
    drain --temp-dir`, else $RAY_TMPDIR as Ray reads it: cli.py) keeps only the node started with that `--temp-dir`."""
    raylets = local_raylets(table if table is not None else proc_table())
    if temp_dir:  # said explicitly: never another node's raylet, even the only one in sight
        raylets = [r for r in raylets if os.path.realpath(r.temp_dir) == os.path.realpath(temp_dir)]
    if len(raylets) > 1:
        raylets = [r for r in raylets if _is_local_address(r.node_ip)] or raylets
    if len(raylets) > 1:
        raise DrainError(f"{len(raylets)} Ray nodes run on this machine ("
                         + ", ".join(f"{r.node_ip} in {r.temp_dir}" for r in raylets)
                         + "); say which one this is with --temp-dir DIR (its `ray start --temp-dir`) or RAY_TMPDIR")
    return raylets[0] if raylets else None


# ----------------------------------------------------------------------------------------- the preStop hook

def gcs_answers(address: str, timeout_s: float = 1.0) -> bool:
    """Whether the GCS still accepts connections. On a cluster's teardown the head pod (and its GCS) can be gone
    before a worker's hook runs; Ray's GcsClient would then retry for about 35 s before giving up, all of it taken
    from the grace period, for a drain that can no longer matter."""
    import socket

    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            return True
    except (OSError, ValueError):
        return False


def container_log(pid: int = 1) -> TextIO | None:
    """The Ray container's own stdout, where `kubectl logs` reads: kubelet discards what an exec hook prints (a
    failing hook shows only as a FailedPreStopHook event), so the hook writes there too. That is PID 1's stdout
    when PID 1 is KubeRay's `ray start ... --block` (common/pod.go); None anywhere else (a laptop, a VM, a test)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        if pid == os.getpid() or "ray start" not in argv:
            return None
        return open(f"/proc/{pid}/fd/1", "a", buffering=1)
    except OSError:
        return None


def request_gcs_drain(raylet: LocalRaylet, deadline_s: float, message: str) -> tuple[bool, str]:
    """Mark the node DRAINING in the GCS, as `ray drain-node --reason DRAIN_NODE_REASON_PREEMPTION` does
    (ray/scripts/scripts.py drain_node): no new work goes there; the deadline says when it is force-stopped."""
    deadline_ms = int((time.time() + deadline_s) * 1000)
    try:
        accepted, rejection = rayinternals.drain_node(raylet.gcs_address, raylet.node_id, message, deadline_ms)
    except Exception as err:  # the GCS unreachable or refusing our token: the notice file still tells the workers
        return False, f"{type(err).__name__}: {err}"
    return bool(accepted), rejection or ""


def write_notice(raylet: LocalRaylet, deadline_s: float, reason: str) -> None:
    notice = {"node_id": raylet.node_id, "since": time.time(), "deadline": time.time() + deadline_s, "reason": reason}
    atomicfile.write_atomic(notice_path(raylet), json.dumps(notice))


def _descends_from(pid: int, ancestor: int, table: dict) -> bool:
    seen = set()
    while pid in table and pid not in seen:
        if pid == ancestor:
            return True
        seen.add(pid)
        pid = table[pid][0]
    return False


def _is_driver(cmd: list[str]) -> bool:
    """`raytrain run|tune ...` as a console script or `python -m raytrain.cli`; options may come before the command."""
    for i, part in enumerate(cmd):
        if os.path.basename(part) == "raytrain" or (part == "raytrain.cli" and i and cmd[i - 1] == "-m"):
            rest = iter(cmd[i + 1:])
            for arg in rest:
                if arg == "--log-format":  # raytrain's one option before the command that takes a value
                    next(rest, None)
                elif not arg.startswith("-"):
                    return arg in DRIVER_COMMANDS
            return False
    return False


def local_drivers(raylet: LocalRaylet | None, table: dict) -> list[int]:
    """raytrain drivers that this node's Ray started: a submitted job's entrypoint (a RayJob's `raytrain run`)
    descends from the raylet through Ray's job supervisor. Never a process outside the node's Ray, so that on a
    machine shared with other Ray nodes nobody else's run is stopped."""
    if raylet is None:
        return []
    return sorted(pid for pid, (_, _, cmd) in table.items()
                  if pid != os.getpid() and _is_driver(cmd) and _descends_from(pid, raylet.pid, table))


def training_processes(raylet: LocalRaylet | None, table: dict | None = None) -> dict[str, list[int]]:
    """What still trains on this node: raytrain drivers and Ray Train worker actors."""
    table = table if table is not None else proc_table()
    workers = sorted(pid for pid, (_, _, cmd) in table.items()
                     if raylet is not None and cmd and cmd[0].startswith(rayinternals.TRAIN_WORKER_TITLES)
                     and _descends_from(pid, raylet.pid, table))
    return {"drivers": local_drivers(raylet, table), "workers": workers}


def drain(wait_s: float, *, temp_dir: str | None = None, say: Callable[[str], None] = print,
          poll_s: float = 0.5) -> dict:
    """`raytrain drain`: the preStop hook of a Ray pod. Returns what it did (for the console line and tests)."""
    started = time.monotonic()
    raylet = this_raylet(temp_dir)
    reason = f"pod preStop: raytrain drain (stop within {wait_s:g}s)"
    outcome = {"node_ip": raylet.node_ip if raylet else None, "head": bool(raylet and raylet.is_head),
               "gcs_drain": None, "drivers_signalled": [], "ended": False, "waited_s": 0.0}
    if raylet is None:
        say("no Ray node runs here; nothing to drain")
    else:
        if raylet.is_head:
            # Draining the head would end the GCS with it before the driver's checkpoint (see the module's notes);
            # its workers stop with the driver's stop request, not a drain (no notice: no restart elsewhere).
            say(f"head node {raylet.node_ip}: not drained in the GCS (the cluster ends with it); its drivers stop")
        else:
            write_notice(raylet, wait_s, reason)
            if gcs_answers(raylet.gcs_address):
                accepted, rejection = request_gcs_drain(raylet, wait_s, reason)
            else:
                accepted, rejection = False, f"the GCS at {raylet.gcs_address} does not answer: the cluster is going away"
            outcome["gcs_drain"] = accepted
            say(f"node {raylet.node_ip} ({raylet.node_id[:8]}) "
                + ("marked DRAINING in the GCS: no new work goes there" if accepted else
                   f"not drained by the GCS ({rejection}); the workers read the drain notice {notice_path(raylet)}"))
    table = proc_table()
    for pid in local_drivers(raylet, table):
        try:
            os.kill(pid, signal.SIGTERM)
            outcome["drivers_signalled"].append(pid)
        except (ProcessLookupError, PermissionError):
            pass
    if outcome["drivers_signalled"]:
        say(f"SIGTERM to the raytrain driver(s) {outcome['drivers_signalled']}: they checkpoint and stop")
    said = False
    while True:
        table = proc_table()
        left = training_processes(raylet, table)
        raylet_gone = raylet is not None and raylet.pid not in table
        if raylet_gone or not (left["drivers"] or left["workers"]):
            outcome["ended"] = True
            break
        if not said:
            say(f"waiting for {len(left['workers'])} Ray Train worker(s) and {len(left['drivers'])} "
                f"driver(s) on this node to checkpoint and end (at most {wait_s:g}s)")
            said = True
        if time.monotonic() - started >= wait_s:
            break
        time.sleep(poll_s)
    outcome["waited_s"] = round(time.monotonic() - started, 1)
    say(f"training on this node {'ended' if outcome['ended'] else 'still running'} after "
        f"{outcome['waited_s']:g}s" + ("" if outcome["ended"] else f" (--wait {wait_s:g}s is up): kubelet stops it now"))
    return outcome


# ----------------------------------------------------------------------------------------- the workers' probe

class _Probe:
    """node_draining()'s state in one worker process: its node, and its last look at the GCS."""

    def __init__(self) -> None:
        self.node_id: str | None = None
        self.notice: Path | None = None
        self.checked = 0.0
        self.draining = False


_probe = _Probe()


def node_draining(interval_s: float = PROBE_INTERVAL_S, clock: Callable[[], float] = time.monotonic) -> bool:
    """Whether the Ray node this worker runs on is being drained (its pod is being deleted): the node's DRAINING
    state in the GCS (asked about this node only), or the drain notice `raytrain drain` wrote into the node's
    session directory. Cheap enough for every step: at most one small GCS call per interval_s, a stat between.
    Once True it stays True. False outside a Ray worker."""
    probe = _probe
    if probe.draining:
        return True
    now = clock()
    if probe.checked and now - probe.checked < interval_s:
        return False
    probe.checked = now
    try:
        if probe.node_id is None:
            node = rayinternals.this_node()
            if node is None:
                return False
            probe.node_id, probe.notice = node[0], node[1] / NOTICE_NAME
    except Exception:  # not a Ray worker after all
        return False
    try:
        if probe.notice is not None and probe.notice.exists():
            probe.draining = True
            return True
        probe.draining = rayinternals.node_is_draining(probe.node_id)
    except Exception:  # a GCS hiccup must never fail a training step; the next look asks again
        return False
    return probe.draining
