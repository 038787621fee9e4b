"""Nothing lost when Kubernetes deletes a Ray pod: why the pod's preStop hook (`raytrain drain`, raytrain.worker.prestop)
works, and the worker-side probe
(`node_draining`) that the training step decision reads.

What happens on a pod deletion (KubeRay v1.7.0 and Ray 2.60.0):
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
1. on a worker node: asks the GCS to drain the node, with the deadline the pod's grace period leaves, then writes a
   drain notice into the node's Ray session directory (read by `node_draining` as well, should the GCS not answer).
   In that order: the node is DRAINING before any worker ends its group for it, so that the next group is sized
   without it (raytrain.worker.elastic); a GCS slower than 5 s to answer does not hold the notice back
   (prestop.drain_then_notice);
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

import os
import socket
import time
from pathlib import Path
from typing import Callable

from raytrain.errors import RaytrainError
from raytrain.platform import rayinternals
from raytrain.platform.processes import proc_table
from raytrain.platform.rayinternals import LocalRaylet

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




def notice_path(raylet: LocalRaylet) -> Path:
    """Where `raytrain drain` leaves its notice for the node's workers: the node's Ray session directory."""
    return Path(raylet.session_dir) / NOTICE_NAME


def _is_local_address(ip: str) -> bool:

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
    raylets = rayinternals.local_raylets(table if table is not None else proc_table())
    if temp_dir:  # said explicitly: never another node's raylet, even the only one in sight
        raylets = [r for r in raylets if os.path.realpath(r.temp_dir) == os.path.realpath(temp_dir)]
    if len(raylets) > 1:
        raylets = [r for r in raylets if _is_local_address(r.node_ip)] or raylets
    if len(raylets) > 1:
        raise DrainError(f"{len(raylets)} Ray nodes run on this machine ("
                         + ", ".join(f"{r.node_ip} in {r.temp_dir}" for r in raylets)
                         + "); say which one this is with --temp-dir DIR (its `ray start --temp-dir`) or RAY_TMPDIR")
    return raylets[0] if raylets else None


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
