"""`raytrain run` on a real embedded Ray: the linear acceptance, resume after a re-run, after a killed worker and
from a corrupted newest checkpoint, and the fail-fast paths. Each test drives the real CLI in a subprocess.

    .venv/bin/pytest -m integration tests/integration/test_run.py -v --durations=0
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support import checks
from raytrain.kube import processes

pytestmark = pytest.mark.integration

RAYTRAIN = [sys.executable, "-m", "raytrain.cli"]


def run(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([*RAYTRAIN, *args], capture_output=True, text=True, timeout=timeout)


def result_of(run_dir: Path) -> dict:
    return json.loads((run_dir / "result.json").read_text())


def test_linear_reaches_its_bound_and_a_rerun_resumes_without_retraining(tmp_path):
    done = run("run", "linear", "--storage", str(tmp_path), "--name", "lin")
    assert done.returncode == 0, done.stderr[-3000:]
    run_dir = tmp_path / "lin"
    checks.assert_run_completed(run_dir, 60)
    result = result_of(run_dir)
    assert result["metrics"]["train_loss"] <= 0.09, result
    assert result["resumed_from_epoch"] is None
    assert "epoch 60/60" in done.stdout and "succeeded: 60 epochs" in done.stdout

    again = run("run", "linear", "--storage", str(tmp_path), "--name", "lin", "--set", "train.epochs=64")
    assert again.returncode == 0, again.stderr[-3000:]
    checks.assert_run_completed(run_dir, 64)  # each epoch 1..64 exactly once
    result = result_of(run_dir)
    assert result["resumed_from_epoch"] == 60 and result["metrics"]["train_loss"] <= 0.09
    assert checks.starts(run_dir)[-1]["start_epoch"] == 61


def test_a_killed_worker_resumes_from_the_newest_checkpoint(tmp_path):
    run_dir, every = tmp_path / "kill", 4
    driver = subprocess.Popen(
        [*RAYTRAIN, "run", "linear", "--storage", str(tmp_path), "--name", "kill",
         "--set", "train.epochs=200", "--set", f"run.checkpoint_every={every}"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )
    try:
        # Wait until an epoch past the second checkpoint is recorded: the report that uploads a checkpoint returns
        # before the next epoch trains, so that checkpoint is then complete on storage.
        deadline = time.time() + 240
        while time.time() < deadline and max(checks.metrics_epochs(run_dir) or [0]) <= 2 * every:
            assert driver.poll() is None, driver.stdout.read()[-3000:]
            time.sleep(0.1)
        # The embedded Ray's raylet and workers are children of the driver; other Ray clusters may share the machine.
        workers = sorted(set(processes.tree_pids(driver.pid)) & set(processes.pids_mentioning("RayTrainWorker")))
        assert workers, "no Ray Train worker process found under the driver"
        epoch_before = max(checks.metrics_epochs(run_dir))
        newest_before = max(e for e in checks.checkpoint_epochs(run_dir) if e < epoch_before)
        os.kill(workers[-1], signal.SIGKILL)
        output, _ = driver.communicate(timeout=400)
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
    assert driver.returncode == 0, output[-3000:]
    checks.assert_run_completed(run_dir, 200)
    checks.assert_resumed(run_dir, newest_checkpoint_before=newest_before, epoch_before=epoch_before, interval=every)
    assert result_of(run_dir)["worker_group_starts"] >= 2


def test_a_corrupted_newest_checkpoint_falls_back_to_the_one_before(tmp_path):
    args = ["run", "linear", "--storage", str(tmp_path), "--name", "corrupt", "--set", "run.checkpoint_every=5"]
    first = run(*args, "--set", "train.epochs=20")
    assert first.returncode == 0, first.stderr[-3000:]
    run_dir = tmp_path / "corrupt"
    assert checks.checkpoint_epochs(run_dir) == [15, 20]
    newest = next(p for p in run_dir.glob("checkpoint_epoch000020_*"))
    (newest / "state.pt").write_bytes(b"half a checkpoint")

    second = run(*args, "--set", "train.epochs=25")
    assert second.returncode == 0, second.stderr[-3000:]
    assert "unreadable" in second.stdout + second.stderr and "falling back" in second.stdout + second.stderr
    checks.assert_run_completed(run_dir, 25)
    assert result_of(run_dir)["resumed_from_epoch"] == 15


def test_a_job_that_can_never_be_scheduled_fails_fast(tmp_path):
    began = time.time()
    done = run("run", "linear", "--storage", str(tmp_path), "--set", "scaling.cpus_per_worker=64", timeout=120)
    assert done.returncode == 1
    assert "can never be scheduled" in done.stderr and "Traceback" not in done.stderr
    assert result_of(tmp_path / "linear")["status"] == "failed"
    print(f"failed after {time.time() - began:.1f}s")


def test_digits_on_ray_data_reaches_ninety_percent(tmp_path):
    done = run("run", "digits", "--storage", str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    result = result_of(tmp_path / "digits")
    assert result["metrics"]["val_accuracy"] >= 0.90, result
    checks.assert_run_completed(tmp_path / "digits", 12)


def test_a_run_that_fails_every_retry_exits_with_one_paragraph(tmp_path):
    # A model that does not fit its data passes validation but fails in every worker: a training failure.
    done = run("run", "linear", "--storage", str(tmp_path), "--set", "model.in_features=2",
               "--set", "run.max_failures=0")
    assert done.returncode == 1
    assert "training failed after 0 allowed worker-group restarts" in done.stderr
    assert "shapes cannot be multiplied" in done.stderr and "No checkpoint was written" in done.stderr
    assert "Traceback" not in done.stdout + done.stderr, done.stderr[-3000:]
    assert result_of(tmp_path / "linear")["status"] == "failed"
