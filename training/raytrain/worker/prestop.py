"""The preStop hook of a Ray pod, `raytrain drain`: on the node it runs on, a drain notice and the GCS's drain of a
worker node, SIGTERM to the node's `raytrain run`/`tune` drivers, and a bounded wait for the training here to end,
so that kubelet's SIGTERM and SIGKILL only come after the checkpoint. Why and how: raytrain.worker.drain, which
also holds the workers' probe of the drain this sets off."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Callable, TextIO

from raytrain.platform import rayinternals
from raytrain.platform.processes import proc_table
from raytrain.platform.rayinternals import LocalRaylet
from raytrain.rundir import atomicfile

from raytrain.worker.drain import DRIVER_COMMANDS, notice_path, this_raylet

# How long the hook waits for the GCS's drain before it writes the workers' notice anyway (the GCS answers in
# milliseconds once Ray's client is imported, about a second on a busy node).
GCS_FIRST_S = 5.0


def gcs_answers(address: str, timeout_s: float = 1.0) -> bool:
    """Whether the GCS still accepts connections. On a cluster's teardown the head pod (and its GCS) can be gone
    before a worker's hook runs; Ray's GcsClient would then retry for about 35 s before giving up, all of it taken
    from the grace period, for a drain that can no longer matter."""

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


def drain_then_notice(raylet: LocalRaylet, wait_s: float, reason: str,
                      first_s: float = GCS_FIRST_S) -> tuple[bool, str]:
    """The GCS's drain first, the notice second: the workers end their group at the first of the two they see, and
    Ray Train sizes the next group at once (raytrain.worker.elastic); with the notice first, a group could end
    before the GCS marked the node DRAINING and be restarted counting this node. A GCS slower than first_s to
    answer does not hold the notice back: the grace period is the checkpoint's."""
    if not gcs_answers(raylet.gcs_address):
        write_notice(raylet, wait_s, reason)
        return False, f"the GCS at {raylet.gcs_address} does not answer: the cluster is going away"
    outcome: list[tuple[bool, str]] = []
    asking = threading.Thread(target=lambda: outcome.append(request_gcs_drain(raylet, wait_s, reason)), daemon=True)
    asking.start()
    asking.join(first_s)
    write_notice(raylet, wait_s, reason)
    asking.join(first_s)  # its answer for the console line; the drivers' SIGTERM is not held back longer
    return outcome[0] if outcome else (False, f"the GCS had not answered the drain within {2 * first_s:g}s")


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
            accepted, rejection = drain_then_notice(raylet, wait_s, reason)
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
