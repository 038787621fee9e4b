"""scaling.fault_tolerance: torchft on a real local multi-node Ray cluster (raytrain.worker.replicas).

A worker pod SIGKILLed mid-epoch (`raytrain cluster kill-node` under `raytrain emulate`, whose operator recreates the
pod): the other replica trains on at the next step without it, its step count never goes back, no completed step is
trained again, the replacement heals from the live peer (no restart of the group, nothing restored from storage)
and holds the same parameters afterwards, and every epoch's row says how many samples its committed steps trained.
The whole job killed instead (its driver and embedded Ray) resumes from its newest checkpoint as any run does.

    .venv/bin/python -m pytest -m integration tests/integration/test_replicas.py -v -s
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
SAMPLES = 8000
BATCH = 64  # 32 per worker a step: 125 steps an epoch
# A model whose step takes about 30 ms on one core (Adam over 3.1M parameters), so that the survivor is still training
# when the replacement joins: Ray Train starts it on the recreated pod 20-30 s after the kill on this machine when
# nothing else runs (the serial pass). About 4 s an epoch alone, 6 s together.
MODEL = {"hidden": 1024, "layers": 4}
EPOCHS = 14


def _steps(directory: Path) -> list[tuple[int, int]]:
    from tests.support import checks

    return [(row["epoch"], row["step"]) for row in checks.read_jsonl(directory / "steps.jsonl")]


@pytest.mark.serial  # alone: the replacement must start while the survivor still trains
def test_a_killed_worker_pod_is_healed_from_its_peer_and_no_step_goes_back(tmp_path, monkeypatch):
    from tests.integration.test_emulate import Emulation, assert_torn_down, run_dir, variant
    from tests.support import checks

    monkeypatch.setenv("RAYTRAIN_EMULATE_MAX_WORKER_NODES", "2")
    job = variant(REPO / "manifests" / "rayjob-standalone.yaml", tmp_path / "rayjob.yaml",
                  job={"train": {"epochs": EPOCHS, "batch_size": BATCH}, "data": {"num_samples": SAMPLES},
                       "model": MODEL,
                       "scaling": {"num_workers": 2, "fault_tolerance": "torchft"},
                       "run": {"checkpoint_every": 1, "log_every_steps": 1}})
    run = Emulation(str(job))
    run_id = run.run_id()
    directory = run_dir(run_id, "linear-standalone")
    run.wait_for(lambda: len(checks.metrics_epochs(directory)) >= 1, 400, "epoch 1")
    run.wait_for(lambda: any(epoch == 2 and step >= 60 for epoch, step in _steps(directory)), 120, "epoch 2, step 60")
    killed_at = time.time()
    # worker-1: whichever replica it holds, the other one trains on (rank 0's steps.jsonl shows the survivor's
    # steps when rank 0 survives, and the replacement's from where it joined when rank 0 is the one lost)
    done = subprocess.run([sys.executable, "-m", "raytrain.cli", "cluster", "kill-node", run_id, "worker-1"],
                          capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode == 0 and "killed" in done.stdout, done.stdout + done.stderr
    code, output, seconds = run.finish()
    assert code == 0, output[-4000:]
    checks.assert_job_succeeded(checks.rayjob_from_emulate_output(output))

    events = checks.read_jsonl(directory / "events.jsonl")
    # One worker group for the whole run: the lost replica was replaced alone, not the group restarted ...
    assert [e["world_size"] for e in events if e["event"] == "start"] == [2], events
    assert not [e for e in events if e["event"] == "restored"], events  # ... and nothing was read from storage
    [healed] = [e for e in events if e["event"] == "healed"]
    assert healed["time"] > killed_at and healed["from_step"] > 0, healed
    # The survivors' steps never went back, and no completed step was trained again
    steps = _steps(directory)
    assert all(a < b for a, b in zip(steps, steps[1:])), [p for p in zip(steps, steps[1:]) if p[0] >= p[1]][:5]
    rows = checks.read_jsonl(directory / "metrics.jsonl")
    assert [row["epoch"] for row in rows] == list(range(1, EPOCHS + 1)), rows
    # Every epoch's row counts what its committed steps trained: all of it while both replicas ran, less in the
    # epoch a replica was missing for a while (its shard's steps in between were not trained), said by the row
    for row in rows:
        if row["replicas_min"] == 2:
            assert row["samples"] == SAMPLES and row["replica_steps"] == SAMPLES // BATCH, row
        else:
            assert row["replicas_min"] == 1 and SAMPLES // 2 <= row["samples"] < SAMPLES, row
    assert [row["replicas_min"] for row in rows].count(1) >= 1 and rows[-1]["replicas_min"] == 2, rows
    # The replacement holds the survivor's parameters from its heal on (every epoch's end compares them)
    assert all(row["replicas_in_sync"] is True for row in rows), [row.get("replicas_in_sync") for row in rows]
    checks.assert_run_completed(directory, EPOCHS)
    print(f"torchft: healed {healed['time'] - killed_at:.1f} s after the kill (heal {healed['heal_s']} s), "
          f"{seconds:.0f} s in all; rows {[(r['samples'], r['replicas_min']) for r in rows]}")
    assert_torn_down(run_id)


def test_a_killed_torchft_job_resumes_from_its_newest_checkpoint(tmp_path):
    """The whole job lost (its driver and the embedded Ray SIGKILLed): running it again resumes from the newest
    checkpoint, as without torchft."""
    from tests.support import checks, podloss

    storage = tmp_path / "runs"
    epochs = 6  # the kill comes after the second: 4 left to resume (the default model: seconds an epoch)
    command = [sys.executable, "-m", "raytrain.cli", "run", "linear", "--name", "ft", "--storage", str(storage),
               "--set", "scaling.fault_tolerance=torchft", "--set", "scaling.num_workers=2",
               "--set", f"train.epochs={epochs}", "--set", "data.num_samples=2048",
               "--set", "run.checkpoint_every=1"]
    directory = storage / "ft"
    first = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             start_new_session=True)
    try:
        deadline = time.monotonic() + 400
        while len(checks.metrics_epochs(directory)) < 2:
            assert first.poll() is None and time.monotonic() < deadline, (first.stdout.read() if first.stdout else "")
            time.sleep(0.2)
    finally:
        podloss.kill_session(first)  # the driver and the Ray it started: the whole job at once
    kept = sorted(p.name for p in directory.glob("checkpoint_*"))
    assert kept, "no checkpoint was committed before the kill"
    again = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    events = checks.read_jsonl(directory / "events.jsonl")
    restored = [e for e in events if e["event"] == "restored"]
    assert restored and restored[-1]["checkpoint"] == kept[-1] and restored[-1]["epoch"] >= 2, (restored, kept)
    checks.assert_run_completed(directory, epochs)
    assert all(row["replicas_in_sync"] is True for row in checks.read_jsonl(directory / "metrics.jsonl"))


def test_ray_trains_own_torchft_example_runs_under_raytrain_with_its_checkpoints_committed(tmp_path):
    """A Ray Train function that uses torchft itself: Ray 2.60's torchft_linear_example (its Manager, torchft's DDP
    and optimizer), with one change, the model's state written into the directory it reports (the example reports
    an empty one, which raytrain refuses: nothing would be restored from it). Under scaling.fault_tolerance torchft
    raytrain gives Ray Train the TorchftConfig, and the writer commits the reported checkpoint alone."""
    import torch
    from ray.train.v2.examples.pytorch import torchft_linear_example as example

    from tests.support import checks

    source = Path(example.__file__).read_text()
    reported = "                with tempfile.TemporaryDirectory() as temp_checkpoint_dir:\n"
    assert source.count(reported) == 1, "Ray's example changed: update this test"
    saved = (reported + '                    torch.save({"model": model.module.state_dict(), "step": step}, '
             'Path(temp_checkpoint_dir) / "state.pt")\n')
    (tmp_path / "ftexample.py").write_text(source.replace(reported, saved))
    (tmp_path / "job.yaml").write_text(
        "loop:\n  _component_: ftexample.train_func\n  train_loop_config: {num_steps: 40, report_interval: 20}\n"
        "scaling: {num_workers: 2, fault_tolerance: torchft}\n")
    done = subprocess.run([sys.executable, "-m", "raytrain.cli", "run", "job.yaml", "--name", "ftex", "--storage",
                           str(tmp_path / "runs")], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    directory = tmp_path / "runs" / "ftex"
    rows = checks.read_jsonl(directory / "metrics.jsonl")
    # The example reports where its own replica's torchft step count is a multiple of 20, and at the end. A replica
    # healed from its peer past step 20 (a quorum that came late on a loaded machine) never sees 20, so rank 0, the
    # writer, may hold the last report alone: its rows are what it reported, numbered on
    assert [row["step"] for row in rows] in ([20, 40], [40]), rows
    assert [row["epoch"] for row in rows] == list(range(1, len(rows) + 1)), rows
    newest = sorted(directory.glob("checkpoint_*"))[-1]
    assert (newest / "data" / "state.pt").is_file(), sorted(p.name for p in newest.rglob("*"))
    assert torch.load(newest / "data" / "state.pt", weights_only=True)["step"] == 40  # the last report's model
