"""One attempt of a run (raytrain.driver.attempt), the path `raytrain run`, `local` and each tune trial take, driven in
one process through `raytrain local`: nothing that was saved is lost to damaged sidecars or a truncated metrics
file, a full disk ends in one paragraph with the lease released, the run directory being a file is named, and a
SIGTERM stops at the next step with the result saying so (a real signal, in a fresh interpreter)."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from raytrain.checkpoint import checkpoints
from raytrain.checkpoint.resume import ResumeRefused
from raytrain.driver.localtrainer import train_local
from raytrain.errors import ConfigError, RaytrainError
from raytrain.rundir import layout, runrecords
from raytrain.rundir import lease as leases
from raytrain.spec.config import load_config
from tests.support.disk import small_disk


def linear(storage, *sets):
    return load_config("linear", [f"run.storage_path={storage}", "run.name=r", "train.batch_size=12",
                                  "data.num_samples=96", "run.checkpoint_every=1", "run.keep_checkpoints=4", *sets])


def test_damaged_manifests_of_every_checkpoint_cost_no_intact_weights(tmp_path):
    first = train_local(linear(tmp_path, "train.epochs=4"), out=io.StringIO())
    for path in first.run_dir.glob("checkpoint_*"):
        (path / checkpoints.META_FILE).write_bytes(os.urandom(20))
    second = train_local(linear(tmp_path, "train.epochs=6"), out=io.StringIO())
    assert second.ok and second.result["resumed_from_epoch"] == 4  # resumed, not retrained from epoch 1
    assert [r["epoch"] for r in runrecords.read_metrics(second.run_dir)] == [1, 2, 3, 4, 5, 6]


def test_checkpoints_none_of_which_loads_refuse_the_start_and_are_kept(tmp_path):
    first = train_local(linear(tmp_path, "train.epochs=2"), out=io.StringIO())
    kept = sorted(first.run_dir.glob("checkpoint_*"))
    for path in kept:
        state = path / checkpoints.STATE_FILE
        state.write_bytes(state.read_bytes()[:50])  # shorter than the manifest says
    with pytest.raises(ResumeRefused, match="none of them loads"):
        train_local(linear(tmp_path, "train.epochs=4"), out=io.StringIO())
    assert sorted(first.run_dir.glob("checkpoint_*")) == kept
    assert [r["epoch"] for r in runrecords.read_metrics(first.run_dir)] == [1, 2]  # nothing truncated either


def test_a_truncated_metrics_file_is_named_on_resume(tmp_path, capsys):
    first = train_local(linear(tmp_path, "train.epochs=4"), out=io.StringIO())
    rows = (first.run_dir / layout.METRICS_FILE).read_text().splitlines()
    (first.run_dir / layout.METRICS_FILE).write_text("\n".join(rows[2:]) + "\n")  # epochs 1-2 gone
    train_local(linear(tmp_path, "train.epochs=5"), out=io.StringIO())
    warnings = [e["message"] for e in runrecords.read_events(first.run_dir) if e["event"] == "warning"]
    assert any("lacks the rows of epoch(s) 1-2" in w for w in warnings), warnings


def test_a_full_disk_ends_in_one_paragraph_and_releases_the_lease(tmp_path):
    with small_disk(tmp_path / "disk", "300k") as disk:  # the config and rows fit; no checkpoint does
        with pytest.raises(RaytrainError) as failed:
            train_local(linear(disk, "train.epochs=3", "model.hidden=512", "model.layers=2"), out=io.StringIO())
        message = str(failed.value)
        assert "No space left on device" in message and "\n" not in message, message
        assert message.startswith(f"the disk is full at {disk} ("), message  # issue 40, item 14
        holder = leases.current_holder(disk / "r")
        assert holder is not None and holder.released  # the next start need not wait out the TTL


def test_a_run_directory_that_is_a_file_is_named(tmp_path):
    (tmp_path / "r").write_text("not a directory")
    with pytest.raises(RaytrainError, match="run directory .*/r .* is a file, not a directory.*another --name"):
        train_local(linear(tmp_path), out=io.StringIO())


def test_a_model_that_does_not_fit_its_data_is_refused_before_training_with_a_failed_result(tmp_path):
    with pytest.raises(ConfigError, match="cannot take a batch"):
        train_local(linear(tmp_path, "model.in_features=3"), out=io.StringIO())  # the data has one feature
    result = runrecords.read_result(tmp_path / "r")
    assert result["status"] == "failed" and "in_features" in result["error"]
    assert leases.current_holder(tmp_path / "r").released


def test_sigterm_stops_at_the_next_step_with_a_checkpoint_and_says_so(tmp_path):
    """A real SIGTERM to a real `raytrain local` (a fresh interpreter; the unit tier's only fork of the CLI)."""
    cmd = [sys.executable, "-m", "raytrain.cli", "local", "linear", "--storage", str(tmp_path), "--name", "r",
           "--set", "train.epochs=10000", "--set", "train.batch_size=12", "--set", "data.num_samples=96",
           "--set", "run.checkpoint_every=1000"]
    process = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 120
    while not runrecords.read_metrics(tmp_path / "r"):  # a few epochs in
        assert time.monotonic() < deadline and process.poll() is None, process.stdout.read()
        time.sleep(0.2)
    process.send_signal(signal.SIGTERM)
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 128 + signal.SIGTERM, output
    result = runrecords.read_result(tmp_path / "r")
    assert result["status"] == "stopped" and result["signal"] == "SIGTERM", result
    meta = json.loads((checkpoints.newest_complete(tmp_path / "r") / checkpoints.META_FILE).read_text())
    assert meta["step"] > 0 or meta["epoch"] >= 1  # the stop's own checkpoint, at the step it came
    assert "checkpoint at their next step" in output
    assert leases.current_holder(tmp_path / "r").released


# ------------------------------------------------------------------------------------ nothing left to train (issue 42)

LINEAR_SETS = ["--set", "train.batch_size=12", "--set", "data.num_samples=96", "--set", "run.checkpoint_every=1",
               "--set", "run.keep_checkpoints=4"]


@pytest.fixture
def no_ray(monkeypatch):
    """`raytrain run` that must not get as far as Ray: its trainer fails the test if it trains."""
    from raytrain.driver import raytrainer

    def train(self, records):
        raise AssertionError("Ray Train was started for a run with nothing left to train")

    monkeypatch.setattr(raytrainer.RayTrainer, "train", train)


def test_a_finished_run_started_again_ends_before_ray_keeping_its_records_and_its_lease_honest(
        tmp_path, raytrain, no_ray, monkeypatch):
    first = train_local(linear(tmp_path, "train.epochs=2"), out=io.StringIO())
    run_dir = first.run_dir
    result, history = (run_dir / layout.RESULT_FILE).read_text(), (run_dir / layout.RESULTS_HISTORY_FILE).read_text()
    config = (run_dir / layout.CONFIG_FILE).read_text()

    done = raytrain("run", "linear", "--storage", str(tmp_path), "--name", "r", "--set", "train.epochs=2",
                    "--set", "train.lr=0.5", *LINEAR_SETS)  # a changed lr: nothing trains, nothing applies it
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[-1].startswith("raytrain: nothing to train: r already finished 2 epochs (checkpoint "
                                "checkpoint_epoch000002_"), done.stdout
    assert "raise train.epochs to train on" in lines[-1] and "resume applies" not in done.stdout
    # The attempt that trained stays the run's result; config.yaml is still the one it trained with.
    assert (run_dir / layout.RESULT_FILE).read_text() == result and (run_dir / layout.CONFIG_FILE).read_text() == config
    assert (run_dir / layout.RESULTS_HISTORY_FILE).read_text() == history
    [event] = [e for e in runrecords.read_events(run_dir) if e["event"] == "nothing_to_train"]
    assert (event["epoch"], event["epochs"], event["attempt"]) == (2, 2, 2)
    holder = leases.current_holder(run_dir)
    assert holder.token == 2 and holder.released

    # A run still held by a live attempt is refused, as any start is.
    monkeypatch.setenv("RAYTRAIN_LEASE_TTL_S", "3")
    held = leases.Lease(run_dir, ttl_s=3).acquire()
    try:
        refused = raytrain("run", "linear", "--storage", str(tmp_path), "--name", "r", "--set", "train.epochs=2",
                           *LINEAR_SETS)
    finally:
        held.release()
    assert refused.returncode != 0 and "so it is running" in refused.stderr, refused
    assert len([e for e in runrecords.read_events(run_dir) if e["event"] == "nothing_to_train"]) == 1

    # A run that was stopped after its last checkpoint committed is finished: its result now says so.
    stopped = json.loads(result) | {"status": "stopped", "error": "stopped by SIGTERM after 2 epoch(s)"}
    (run_dir / layout.RESULT_FILE).write_text(json.dumps(stopped))
    again = raytrain("local", "linear", "--storage", str(tmp_path), "--name", "r", "--set", "train.epochs=2",
                     *LINEAR_SETS)
    assert again.returncode == 0 and "nothing to train" in again.stdout, again
    now = runrecords.read_result(run_dir)
    assert now["status"] == "succeeded" and now["epochs_completed"] == 2 and "error" not in now, now
    assert now["nothing_to_train"].startswith("nothing to train: r already finished 2 epochs") and now["attempt"] == 4
    assert now["checkpoint"] == json.loads(result)["checkpoint"]
    report = raytrain("report", str(run_dir), "--out", str(tmp_path / "report.png"))
    assert report.returncode == 0 and (tmp_path / "report.png").stat().st_size, report


def test_a_newest_checkpoint_that_only_its_hash_shows_damaged_trains_on_from_the_one_before(tmp_path, raytrain):
    """The look before the lease reads no checkpoint state; the check under it does, and the start goes on in full."""
    first = train_local(linear(tmp_path, "train.epochs=3"), out=io.StringIO())
    newest = min(first.run_dir.glob("checkpoint_epoch000003_*"))
    state = newest / checkpoints.STATE_FILE
    data = bytearray(state.read_bytes())
    data[len(data) // 2] ^= 0xFF
    state.write_bytes(bytes(data))
    done = raytrain("local", "linear", "--storage", str(tmp_path), "--name", "r", "--set", "train.epochs=3",
                    *LINEAR_SETS)
    assert done.returncode == 0, done.stderr
    assert "nothing to train" not in done.stdout
    result = runrecords.read_result(first.run_dir)
    assert result["status"] == "succeeded" and result["resumed_from_epoch"] == 2, result
    assert result["attempt"] == 3  # attempt 2 took the lease, found something to train and gave it back unwritten
    assert [r["epoch"] for r in runrecords.read_metrics(first.run_dir)] == [1, 2, 3]


def test_a_finished_run_on_object_storage_ends_before_ray_the_same_way(s3_prefix, raytrain, no_ray):
    first = train_local(linear(s3_prefix, "train.epochs=2"), out=io.StringIO())
    done = raytrain("run", "linear", "--storage", s3_prefix, "--name", "r", "--set", "train.epochs=2",
                    *LINEAR_SETS)
    assert done.returncode == 0, done.stderr
    assert "nothing to train: r already finished 2 epochs" in done.stdout, done.stdout
    assert runrecords.read_result(first.run_dir)["attempt"] == 1  # the result of the attempt that trained
    holder = leases.current_holder(first.run_dir)
    assert holder.token == 2 and holder.released
