"""What happens to one pod of a running local cluster, found by the cluster's state file: `kill_node` loses it at
once (a node crash), `delete_node` deletes it as kubelet deletes a pod (the preStop exec from the spec, SIGTERM,
SIGKILL after the grace period), `pending_path` keeps a recreated pod Pending, and `node_processes` lists a node's
processes. Used by `raytrain emulate`, `raytrain cluster` and the tests that kill or drain nodes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import IO

from raytrain.platform.processes import (
    is_zombie, netns_pids, pids_mentioning, proc_table, tree_pids)
from raytrain.cluster.localcluster import node_env, pending_path
from raytrain.cluster.raynode import ClusterError, bare_environ
from raytrain.rundir import atomicfile

def _state_node(state_file: Path, name: str) -> tuple[dict, dict]:
    state = json.loads(Path(state_file).read_text())
    node = next((n for n in state["nodes"] if n["name"] == name), None)
    if node is None:
        raise ClusterError(f"no node {name!r} in {state_file} (nodes: {[n['name'] for n in state['nodes']]})")
    return state, node


def _all_node_pids(node: dict) -> list[int]:
    pids = (tree_pids(node["pid"]) if node.get("pid") else []) + pids_mentioning(node["temp_dir"])
    if node.get("netns"):
        pids += netns_pids(node["netns"])
    # An exited `ray start` stays a zombie until the process that started the cluster reaps it: it is gone.
    return [pid for pid in dict.fromkeys(pids) if not is_zombie(pid)]


def kill_node(state_file: Path, name: str) -> list[int]:
    """SIGKILL every process of one node of a running local cluster (a pod lost with its raylet and workers).
    Returns the PIDs killed."""
    _, node = _state_node(state_file, name)
    pids = _all_node_pids(node)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return pids


# Kubernetes: a preStop hook still running when the grace period ends gets one extension of 2 s before SIGTERM.
PRESTOP_EXTENSION_S = 2.0


def delete_node(state_file: Path, name: str, grace: float | None = None, out: IO[str] | None = None,
                pending_s: float = 0.0) -> dict:
    """Delete one node as kubelet deletes its pod: run the Ray container's preStop exec (from the RayCluster spec the
    cluster was built from) in the node's environment and network namespace, then SIGTERM the container's main
    process (KubeRay's `ray start --block`), then SIGKILL whatever is left once the grace period (the pod's
    terminationGracePeriodSeconds, or `grace` as `kubectl delete pod --grace-period`) has passed since the start.
    pending_s: the pod the RayCluster controller recreates stays Pending this long (no node has room for it, as
    while a cloud's autoscaler brings a new VM up); `raytrain emulate` starts it after that.
    Returns what happened: the hook's exit status and output, and when the node's processes ended."""
    state, node = _state_node(state_file, name)
    if pending_s > 0:  # before the node ends: the emulation must not recreate it at once
        atomicfile.write_atomic(pending_path(Path(state_file).parent, name), json.dumps({"until": time.time() + pending_s}))
    grace = float(node.get("grace_seconds", 30) if grace is None else grace)
    started = time.monotonic()
    outcome: dict = {"node": name, "grace_seconds": grace, "pre_stop": node.get("pre_stop") or [],
                     "pre_stop_rc": None, "pre_stop_output": "", "pre_stop_s": 0.0, "killed": [], "ended_s": None}
    if outcome["pre_stop"]:
        env = node_env(bare_environ(os.environ), node.get("env") or {}, state.get("token_path"), node.get("netns"))
        # Ray's temp dir of this node, as Ray itself reads it: in a pod it is the pod's own /tmp/ray.
        env["RAY_TMPDIR"] = node["temp_dir"]
        cmd = outcome["pre_stop"]
        if node.get("netns"):
            cmd = ["ip", "netns", "exec", node["netns"], *cmd]
        try:
            hook = subprocess.run(cmd, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                                  timeout=grace + PRESTOP_EXTENSION_S, cwd=Path(state_file).parent)
            outcome["pre_stop_rc"], outcome["pre_stop_output"] = hook.returncode, hook.stdout + hook.stderr
        except subprocess.TimeoutExpired as err:
            outcome["pre_stop_rc"] = "timeout"
            outcome["pre_stop_output"] = (err.stdout or b"").decode(errors="replace") if isinstance(err.stdout, bytes) \
                else (err.stdout or "")
        except OSError as err:  # kubelet records a failed hook (FailedPreStopHook) and goes on with SIGTERM
            outcome["pre_stop_rc"], outcome["pre_stop_output"] = "failed", str(err)
        outcome["pre_stop_s"] = round(time.monotonic() - started, 1)
        if out:
            print(f"{name}: preStop {' '.join(outcome['pre_stop'])} -> {outcome['pre_stop_rc']} after "
                  f"{outcome['pre_stop_s']:g}s", file=out)
    if node.get("pid"):
        try:
            os.kill(node["pid"], signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = started + max(grace, outcome["pre_stop_s"] + PRESTOP_EXTENSION_S)
    while time.monotonic() < deadline and _all_node_pids(node):
        try:  # our own child when this process started the cluster: reap it
            os.waitpid(node["pid"], os.WNOHANG)
        except (ChildProcessError, TypeError):
            pass
        time.sleep(0.2)
    if _all_node_pids(node):
        outcome["killed"] = kill_node(state_file, name)
    else:
        outcome["ended_s"] = round(time.monotonic() - started, 1)
    if out:
        print(f"{name}: " + (f"ended {outcome['ended_s']:g}s after the deletion" if outcome["ended_s"] is not None
                             else f"SIGKILL to {len(outcome['killed'])} processes after {grace:g}s"), file=out)
    return outcome


def node_processes(state_file: Path, name: str, contains: str = "") -> list[int]:
    """PIDs of one node's processes whose command line contains `contains` (e.g. a job's entrypoint)."""
    _, node = _state_node(state_file, name)
    table = proc_table()
    return sorted(pid for pid in _all_node_pids(node) if pid in table and contains in " ".join(table[pid][2]))
