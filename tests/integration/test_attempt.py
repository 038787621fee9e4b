"""One writer per run and a graceful end, through the real CLI on embedded Ray: a SIGKILLed holder taken over after
the stated time by a plain start (its Ray stopped by the watchdog), a SIGSTOPped holder that writes nothing once
resumed, and one run's life: a concurrent start refused, SIGTERM mid-epoch, an honest resume at the next step.

    .venv/bin/pytest -m integration tests/integration/test_attempt.py -v --durations=0
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from raytrain.cluster import localcluster
from raytrain.rundir import lease as leases
from tests.support import checks, podloss

pytestmark = pytest.mark.integration

RAYTRAIN = [sys.executable, "-m", "raytrain.cli"]
TTL_S = 15  # long enough for a refused start to reach its check on a busy machine


def start(storage: Path, name: str, *args: str, ttl: float = TTL_S) -> subprocess.Popen:
    return subprocess.Popen([*RAYTRAIN, "run", "linear", "--storage", str(storage), "--name", name, *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            env={**os.environ, "RAYTRAIN_LEASE_TTL_S": str(ttl)})


def run(storage: Path, name: str, *args: str, timeout: float = 400) -> subprocess.CompletedProcess:
    return subprocess.run([*RAYTRAIN, "run", "linear", "--storage", str(storage), "--name", name, *args],
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "RAYTRAIN_LEASE_TTL_S": str(TTL_S)})


def wait_for_epoch(proc: subprocess.Popen, run_dir: Path, epoch: int, timeout: float = 240) -> None:
    deadline = time.time() + timeout
    while max(checks.metrics_epochs(run_dir) or [0]) < epoch:
        assert proc.poll() is None, proc.stdout.read()[-3000:]
        assert time.time() < deadline, f"epoch {epoch} not reached"
        time.sleep(0.2)


def wait_for_an_early_step_checkpoint(proc: subprocess.Popen, run_dir: Path, at_most_step: int,
                                      timeout: float = 240) -> None:
    """Until a mid-epoch checkpoint at most `at_most_step` steps into its epoch is written after this call: the rest of
    that epoch is still to run, so a stop asked for now lands mid-epoch (one asked for at an epoch's end rightly takes
    the epoch's own checkpoint). Only new ones count: an early checkpoint already there may be from an epoch that is
    nearly over (CI once found one and its SIGTERM landed at the epoch's end). Step checkpoints count steps across
    epochs, so their steps into an epoch vary."""
    deadline = time.time() + timeout
    pattern = re.compile(r"checkpoint_epoch(\d+)_step(\d+)_")
    before = {p.name for p in run_dir.glob("checkpoint_*")}
    while not any((m := pattern.match(p.name)) and p.name not in before and int(m[2]) <= at_most_step
                  for p in run_dir.glob("checkpoint_*")):
        assert proc.poll() is None, proc.stdout.read()[-3000:]
        assert time.time() < deadline, f"no new checkpoint at most {at_most_step} steps into an epoch"
        time.sleep(0.05)


def long_run_at_epoch_3(storage: Path, name: str) -> tuple[Path, subprocess.Popen]:
    """A 400-epoch run (checkpoint every 2) that has trained 3 epochs."""
    proc = start(storage, name, "--set", "train.epochs=400", "--set", "run.checkpoint_every=2")
    try:
        wait_for_epoch(proc, storage / name, 3)
    except BaseException:
        stop(proc)
        raise
    return storage / name, proc


def snapshot(run_dir: Path) -> dict:
    """Every file of the run directory with its content (checkpoints by name and size)."""
    files = {}
    for path in sorted(run_dir.rglob("*")):
        if path.is_file() and ".lease" not in path.parts and path.name != "lease.json":
            files[str(path.relative_to(run_dir))] = path.read_bytes()
    return files


def assert_stopped(pids: list[int], within_s: float = 15) -> None:
    """The processes are gone (promptly: Ray's own orphan cleanup takes minutes)."""
    assert pids
    deadline = time.monotonic() + within_s
    while (alive := [pid for pid in pids if localcluster.process_start(pid) is not None]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not alive, [localcluster._proc_table().get(pid) for pid in alive]


def driver_log(run_dir: Path, pid: int) -> Path:
    """The attempt's copy of its console lines (raytrain.rundir.console.keep_copy), named by host and driver pid."""
    (log,) = run_dir.glob(f"driver-logs/*-{pid}.log")
    return log


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        podloss.kill_session(proc)


def test_a_sigkilled_holder_is_taken_over_after_the_stated_time_and_its_ray_stops(tmp_path):
    """What a RayJob's retry meets after its driver was killed: a plain start (no --wait-for-lease) waits out the
    dead holder's TTL, then takes over and resumes."""
    run_dir, holder = long_run_at_epoch_3(tmp_path, "killed")
    try:
        ray_processes = localcluster.tree_pids(holder.pid)[1:]
        killed = time.monotonic()
        os.kill(holder.pid, signal.SIGKILL)
        epochs = max(checks.checkpoint_epochs(run_dir)) + 4
        began = time.monotonic()
        taker = run(tmp_path, "killed", "--set", f"train.epochs={epochs}")
        waited = time.monotonic() - began
    finally:
        stop(holder)
    assert taker.returncode == 0, taker.stdout[-2000:] + taker.stderr[-3000:]
    assert "attempt 2 holds run killed" in taker.stdout
    # Renewed every ttl/RENEWALS_PER_TTL: until then after the kill the lease is surely live and the taker must wait.
    if began - killed < TTL_S - TTL_S / leases.RENEWALS_PER_TTL:
        assert "if not, it has died and is taken over at" in taker.stdout and waited >= 1, (waited, taker.stdout[-2000:])
    result = json.loads((run_dir / "result.json").read_text())
    assert result["status"] == "succeeded" and result["attempt"] == 2 and result["resumed_from_epoch"] >= 2
    checks.assert_run_completed(run_dir, epochs)
    # the watchdog stopped the killed driver's embedded Ray (raylet, workers, agents)
    assert_stopped(ray_processes)


def test_a_sigstopped_holder_resumed_after_a_takeover_writes_nothing(tmp_path):
    run_dir, holder = long_run_at_epoch_3(tmp_path, "paused")
    try:
        paused = localcluster.tree_pids(holder.pid)
        for pid in paused:
            os.kill(pid, signal.SIGSTOP)
        epochs = max(checks.checkpoint_epochs(run_dir)) + 4
        taker = run(tmp_path, "paused", "--wait-for-lease", "--set", f"train.epochs={epochs}")
        assert taker.returncode == 0, taker.stderr[-3000:]
        before = snapshot(run_dir)
        for pid in paused:
            os.kill(pid, signal.SIGCONT)
        output, _ = holder.communicate(timeout=120)
    finally:
        stop(holder)
    assert holder.returncode == 1, output[-3000:]
    assert "attempt 1" in output and "stopped without writing anything more" in output, output[-3000:]
    time.sleep(2)
    after = snapshot(run_dir)
    changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
    # Its own driver log says what happened to it. Ray Train's own files are its attempt's alone
    # (.ray-train/attempt-1): nothing the new attempt reads or writes.
    own_log = str(driver_log(run_dir, holder.pid).relative_to(run_dir))
    assert own_log in changed and all(c == own_log or c.startswith(".ray-train/attempt-1/") for c in changed), changed
    assert "lost run directory" in after[own_log].decode()
    assert json.loads((run_dir / "result.json").read_text())["attempt"] == 2
    checks.assert_run_completed(run_dir, epochs)


def test_a_run_refuses_a_concurrent_start_stops_on_sigterm_at_its_next_step_and_resumes_there_honestly(tmp_path):
    """One run's life: a second start while it trains is refused before Ray; SIGTERM mid-epoch checkpoints at the
    next step and ends it with a result; a resume that changes the model is refused before Ray, and one that changes
    the learning rate applies it and loses no step."""
    run_dir = tmp_path / "graceful"
    # 40 epochs: the SIGTERM lands long before the end however long the refused start takes on a loaded machine
    # (at a load of 10 it took three ~5 s epochs, and a 4-epoch run was over before its SIGTERM); the resume then
    # asks for as many epochs as finish the stopped one and one more.
    args = ["--set", "data.num_samples=20000", "--set", "run.checkpoint_every_steps=200",  # ~830 steps an epoch
            "--set", "run.keep_checkpoints=20", "--set", "train.epochs=40"]
    driver = start(tmp_path, "graceful", *args)
    try:
        wait_for_epoch(driver, run_dir, 1)
        ray_processes = localcluster.tree_pids(driver.pid)[1:]
        second = run(tmp_path, "graceful", *args)
        assert second.returncode == 1, second.stdout + second.stderr
        assert "is in use by another attempt of this run (attempt 1 on host" in second.stderr
        assert f"pid {driver.pid}" in second.stderr and "it renewed its lease while this start watched" in second.stderr
        assert "started embedded Ray" not in second.stdout  # refused before Ray starts

        # >= 430 steps (~2 s here) of the epoch to go: well past rank 0's next read of the stop request (POLL_S)
        wait_for_an_early_step_checkpoint(driver, run_dir, 400)
        assert driver.poll() is None and max(checks.metrics_epochs(run_dir)) < 40, "the run ended before its SIGTERM"
        signalled = time.monotonic()
        driver.send_signal(signal.SIGTERM)
        output, _ = driver.communicate(timeout=120)
        stopped_in = time.monotonic() - signalled
    finally:
        stop(driver)
    assert driver.returncode == 128 + signal.SIGTERM, output[-3000:]
    assert "received SIGTERM" in output and "stopped by SIGTERM after" in output
    assert "the workers checkpoint at their next step and stop" in output and "did not stop within" not in output
    assert "Traceback" not in output and "SIGSEGV" not in output and "*** " not in output, output[-3000:]
    assert stopped_in < 30, stopped_in  # inside Kubernetes' default grace period
    result = json.loads((run_dir / "result.json").read_text())
    assert result["status"] == "stopped" and result["signal"] == "SIGTERM" and result["attempt"] == 1
    assert result["epochs_completed"] == max(checks.metrics_epochs(run_dir))  # counted after the workers stopped
    meta = json.loads((Path(result["checkpoint"]) / "meta.json").read_text())
    assert meta["epoch"] >= 1 and meta["step"] > 0, (result, meta)
    names = [p.name for p in run_dir.glob("checkpoint_epoch000000_step*")]  # checkpoint_every_steps in epoch 1
    assert all(any(f"_step{step:08d}_" in name for name in names) for step in (200, 400, 600, 800)), names
    assert "received SIGTERM" in driver_log(run_dir, driver.pid).read_text()
    assert_stopped(ray_processes)

    record = (run_dir / "result.json").read_bytes()
    refused = run(tmp_path, "graceful", *args, "--set", "model.hidden=64")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "model.hidden: 32 in the checkpoint, 64 now" in refused.stderr and "another --name" in refused.stderr
    assert "started embedded Ray" not in refused.stdout and "Traceback" not in refused.stderr
    assert (run_dir / "result.json").read_bytes() == record  # the stopped attempt's record stands
    assert "hidden: 32" in (run_dir / "config.yaml").read_text()

    final = meta["epoch"] + 2
    resumed = run(tmp_path, "graceful", *args, "--set", "train.lr=0.02", "--set", f"train.epochs={final}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resume applies train.lr=0.02 (the checkpoint trained with 0.01)" in resumed.stdout
    restored = [e for e in checks.read_jsonl(run_dir / "events.jsonl") if e["event"] == "restored"]
    assert restored[-1]["applied"] == {"train.lr": 0.02}
    assert "lr: 0.02" in (run_dir / "config.yaml").read_text()
    start_event = checks.starts(run_dir)[-1]
    assert (start_event["start_epoch"], start_event["resumed_at_step"]) == (meta["epoch"] + 1, meta["step"])
    checks.assert_run_completed(run_dir, final)  # one row per epoch, each once
    samples = [row["samples"] for row in checks.read_jsonl(run_dir / "metrics.jsonl")]
    assert samples == [samples[0]] * final, samples  # the stopped epoch counts every sample once: no step lost or redone
    history = checks.read_jsonl(run_dir / "results.jsonl")
    assert [(r["status"], r["attempt"]) for r in history] == [("stopped", 1), ("succeeded", 3)]
