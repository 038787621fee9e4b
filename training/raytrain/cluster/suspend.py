"""spec.suspend for an emulated RayJob (Kueue's preemption and readmission): `raytrain cluster suspend|unsuspend
RUN_ID` writes the request beside the emulated cluster, and the emulation reads it and writes the RayJob's status."""

from __future__ import annotations

import json
from pathlib import Path


from raytrain.cluster import localcluster
from raytrain.platform.processes import process_start
from raytrain.rundir import atomicfile

from raytrain.cluster.rayjobfile import RayJobError
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
    atomicfile.write_atomic(Path(run_dir) / SUSPEND_FILE, "true\n" if suspend else "false\n")


def write_status(run_dir: Path, name: str, deployment: str, refusal: str) -> None:
    status = {"name": name, "jobDeploymentStatus": deployment, "suspendRefused": refusal}
    atomicfile.write_atomic(Path(run_dir) / STATUS_FILE, json.dumps(status) + "\n")


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
