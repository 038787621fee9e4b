"""Assertions about a finished RayJob and its training run, shared by the emulate integration tests and the kind
e2e tier: both read a RayJob status (emulate prints it; `kubectl get rayjob NAME -o yaml` returns it) and the run
directory on the shared volume (STORAGE/NAME: config.yaml, metrics.jsonl, events.jsonl, result.json, checkpoints).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from raytrain.rundir.runrecords import read_jsonl
from raytrain.rundir.storage import as_path  # a directory, or a run on an object store

CHECKPOINT_PREFIX = "checkpoint_"


# --------------------------------------------------------------------------------------------------- RayJob status

def rayjob_from_emulate_output(output: str) -> dict:
    """The RayJob object (kind, metadata, status) that `raytrain emulate` prints last."""
    start = output.rfind("\nkind: RayJob\n")
    if start < 0:
        raise AssertionError(f"no RayJob status in the output; its end was:\n{output[-3000:]}")
    block = output[start + 1:].split("\n# ", 1)[0]
    return yaml.safe_load(block)


def train_worker_nodes(output: str) -> list[str]:
    """The nodes emulate saw Ray Train workers on (its '# Ray Train workers ran on:' line)."""
    match = re.search(r"^# Ray Train workers ran on: (.*)$", output, re.MULTILINE)
    if not match or match.group(1) == "none seen":
        return []
    return [name.strip() for name in match.group(1).split(",")]


def assert_job_succeeded(rayjob: dict) -> None:
    status = rayjob.get("status") or {}
    assert status.get("jobStatus") == "SUCCEEDED" and status.get("jobDeploymentStatus") == "Complete", \
        f"RayJob did not succeed: {status}"


def assert_job_failed(rayjob: dict, reason: str = "AppFailed") -> None:
    status = rayjob.get("status") or {}
    assert status.get("jobDeploymentStatus") == "Failed" and status.get("reason") == reason, \
        f"RayJob is not Failed with reason {reason}: {status}"
    if reason == "AppFailed":
        assert status.get("jobStatus") == "FAILED", f"jobStatus is not FAILED: {status}"


# --------------------------------------------------------------------------------------------------- run directory

def metrics_epochs(run_dir: Path) -> list[int]:
    return [row["epoch"] for row in read_jsonl(as_path(run_dir) / "metrics.jsonl")]


def starts(run_dir: Path) -> list[dict]:
    """The worker-group starts the run recorded (one per start or resume of training)."""
    return [e for e in read_jsonl(as_path(run_dir) / "events.jsonl") if e.get("event") == "start"]


def checkpoint_epochs(run_dir: Path) -> list[int]:
    """Epochs of the checkpoint directories present (names carry the epoch: checkpoint_epoch000035_...)."""
    epochs = []
    for path in as_path(run_dir).glob(f"{CHECKPOINT_PREFIX}*"):
        match = re.search(r"(\d+)", path.name[len(CHECKPOINT_PREFIX):])
        if path.is_dir() and match:
            epochs.append(int(match.group(1)))
    return sorted(epochs)


def assert_run_files(run_dir: Path) -> None:
    """The run left its files on the shared volume."""
    run_dir = as_path(run_dir)
    missing = [name for name in ("config.yaml", "metrics.jsonl", "events.jsonl", "result.json")
               if not (run_dir / name).is_file()]
    assert not missing, f"{run_dir} lacks {missing} (has {sorted(p.name for p in run_dir.iterdir())})" \
        if run_dir.is_dir() else f"no run directory {run_dir}"
    assert checkpoint_epochs(run_dir), f"{run_dir} holds no checkpoint directory"


def assert_run_completed(run_dir: Path, epochs: int) -> None:
    """result.json says succeeded after `epochs` epochs, and metrics.jsonl has each epoch 1..epochs exactly once."""
    run_dir = as_path(run_dir)
    assert_run_files(run_dir)
    result = json.loads((run_dir / "result.json").read_text())
    assert result.get("status") == "succeeded", f"run did not succeed: {result}"
    assert result.get("epochs_completed") == epochs, f"run completed {result.get('epochs_completed')} of {epochs} epochs"
    seen = metrics_epochs(run_dir)
    twice = sorted({e for e in seen if seen.count(e) > 1})
    assert not twice, f"epochs recorded more than once in metrics.jsonl: {twice}"
    assert seen == list(range(1, epochs + 1)), f"metrics.jsonl epochs are {seen}, expected 1..{epochs}"
    assert max(checkpoint_epochs(run_dir)) == epochs, f"newest checkpoint is not epoch {epochs}: {checkpoint_epochs(run_dir)}"


def assert_resumed(run_dir: Path, *, newest_checkpoint_before: int | None = None,
                   epoch_before: int | None = None, interval: int | None = None) -> dict:
    """The run restarted at least once from a checkpoint (not from scratch). With what the test saw just before
    the failure: it resumed from the newest checkpoint then present (or a newer one) and lost at most one
    checkpoint interval of epochs. Returns the first resume event."""
    resumes = [s for s in starts(run_dir) if s.get("resumed_from_epoch")]
    assert resumes, f"the run never resumed from a checkpoint; its starts were {starts(run_dir)}"
    first = resumes[0]
    resumed_from = first["resumed_from_epoch"]
    if newest_checkpoint_before is not None:
        assert resumed_from >= newest_checkpoint_before, \
            f"resumed from epoch {resumed_from}, older than the newest checkpoint {newest_checkpoint_before}"
    if epoch_before is not None and interval is not None:
        lost = epoch_before - resumed_from
        assert lost <= interval, f"lost {lost} epochs (was at {epoch_before}, resumed from {resumed_from}); " \
                                 f"at most one checkpoint interval ({interval}) may be lost"
    return first
