"""A run on object storage through the real CLI on embedded Ray, against a real S3-compatible server (moto's
standalone server over HTTP, found through AWS_ENDPOINT_URL as MinIO would be): a second start refused while the
first trains, the first killed by SIGKILL with step checkpoints in flight, and a plain restart that takes the dead
holder's lease over, removes any torn upload and resumes from the newest complete checkpoint, losing no epoch row.

    .venv/bin/pytest -m integration tests/integration/test_object_storage.py -v --durations=0
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from raytrain.checkpoint import checkpoints
from raytrain.rundir import layout, runrecords, storage
from tests.support import checks, podloss

pytestmark = pytest.mark.integration

RAYTRAIN = [sys.executable, "-m", "raytrain.cli"]
TTL_S = 10
EPOCHS = 4  # the kill comes in the second or third: a refused second start takes seconds, an epoch 2-3 s alone
ARGS = ["--set", "data.num_samples=12000", "--set", "run.checkpoint_every_steps=100",  # ~500 steps an epoch
        "--set", "run.keep_checkpoints=3", "--set", f"train.epochs={EPOCHS}"]


def raytrain(storage_url: str, *args: str) -> list[str]:
    return [*RAYTRAIN, "run", "linear", "--storage", storage_url, "--name", "s3run", *ARGS, *args]


# Alone: it kills the run mid-epoch after a refused second start, a race another test's load decides (on two xdist
# workers the run once finished its epochs before the kill).
@pytest.mark.serial
def test_a_run_on_s3_refuses_a_second_start_survives_sigkill_mid_checkpoint_and_resumes(s3_server, s3_prefix):
    env = {**os.environ, "RAYTRAIN_LEASE_TTL_S": str(TTL_S)}
    run_dir = storage.as_path(s3_prefix) / "s3run"
    driver = subprocess.Popen(raytrain(s3_prefix), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              start_new_session=True, env=env)
    try:
        deadline = time.monotonic() + 240
        while not checks.metrics_epochs(run_dir):
            assert driver.poll() is None, driver.stdout.read()[-3000:]
            assert time.monotonic() < deadline, "epoch 1 not reached"
            time.sleep(0.5)
        second = subprocess.run(raytrain(s3_prefix), capture_output=True, text=True, timeout=120, env=env)
        assert second.returncode == 1, second.stdout + second.stderr
        assert "is in use by another attempt of this run (attempt 1 on host" in second.stderr
        assert "started embedded Ray" not in second.stdout  # refused before Ray starts
        # mid-epoch, with a checkpoint every ~100 steps in flight (staged locally, then uploaded, manifest last)
        time.sleep(1.5)
        assert driver.poll() is None and max(checks.metrics_epochs(run_dir)) < EPOCHS, "the run ended before its kill"
        newest_before = checkpoints.position_of(checkpoints.newest_complete(run_dir))
        podloss.kill_session(driver)  # the driver and its embedded Ray: a lost head pod
    finally:
        if driver.poll() is None:
            podloss.kill_session(driver)
    bucket = s3_prefix.split("/")[2]
    torn_before = [p.name for p in checkpoints.staging_dirs(run_dir)]

    resumed = subprocess.run(raytrain(s3_prefix), capture_output=True, text=True, timeout=400, env=env)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-3000:]
    assert "attempt 2 holds run s3run" in resumed.stdout
    result = runrecords.read_result(run_dir)
    assert result["status"] == "succeeded" and result["attempt"] == 2
    start = checks.starts(run_dir)[-1]
    assert (start["resumed_from_epoch"], start.get("resumed_at_step") or 0) >= (newest_before.epoch,
                                                                                 newest_before.step), start
    checks.assert_run_completed(run_dir, EPOCHS)  # each epoch's row once: rows past the restored step were dropped
    samples = [row["samples"] for row in runrecords.read_metrics(run_dir)]
    assert samples == [samples[0]] * EPOCHS, samples  # no step lost or trained twice across the kill
    # nothing torn or staged is left in the bucket, and what the kill left torn (if anything) was named and removed
    assert checkpoints.staging_dirs(run_dir) == []
    keys = s3_server.keys(bucket)
    assert not any(".staging" in key or ".tmp" in key for key in keys), keys
    removed = [e for e in runrecords.read_events(run_dir) if "never committed" in str(e.get("message", ""))]
    assert len(removed) == len(torn_before), (removed, torn_before)
    for name in ("config.yaml", "metrics.jsonl", "events.jsonl", "result.json", "results.jsonl", "lease.json"):
        assert f"runs/s3run/{name}" in keys
    assert any(key.startswith("runs/s3run/driver-logs/") for key in keys)  # the resumed driver's log, uploaded
    history = [(r["status"], r["attempt"]) for r in runrecords.read_jsonl(run_dir / layout.RESULTS_HISTORY_FILE)]
    assert history == [("succeeded", 2)]
    assert json.loads((checkpoints.newest_complete(run_dir) / checkpoints.META_FILE).read_text())["epoch"] == EPOCHS
