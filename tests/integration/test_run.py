"""`raytrain run` through the real CLI in a subprocess: the linear acceptance, resume after a re-run and from a
corrupted newest checkpoint, and the fail-fast paths (a killed worker is tests/integration/test_emulate.py's lost
worker node). The acceptance and digits runs join the session's shared Ray head (tests/integration/conftest.py),
which saves each one Ray's start; the fail-fast runs start their embedded Ray (the failing model's imports the model
from its working directory), as every other driver test does (test_attempt, test_fsdp, test_object_storage).

    .venv/bin/pytest -m integration tests/integration/test_run.py -v --durations=0
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from raytrain.rundir import goodput, runrecords
from tests.support import checks

pytestmark = pytest.mark.integration

RAYTRAIN = [sys.executable, "-m", "raytrain.cli"]


def run(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([*RAYTRAIN, *args], capture_output=True, text=True, timeout=timeout)


def result_of(run_dir: Path) -> dict:
    return json.loads((run_dir / "result.json").read_text())


def test_linear_reaches_its_bound_and_a_rerun_resumes_from_the_newest_checkpoint_that_loads(ray_head, tmp_path):
    done = run("run", "linear", "--storage", str(tmp_path), "--name", "lin", "--address", ray_head.address)
    assert done.returncode == 0, done.stderr[-3000:]
    run_dir = tmp_path / "lin"
    checks.assert_run_completed(run_dir, 60)
    result = result_of(run_dir)
    assert result["metrics"]["train_loss"] <= 0.09, result
    assert result["resumed_from_epoch"] is None
    assert "epoch 60/60" in done.stdout and "succeeded: 60 epochs" in done.stdout

    # The same command again: nothing left to train, so it ends before Ray (no join, no worker group), in one line,
    # exit 0, with the lease taken and released and the result of the attempt that trained kept (issue 42).
    began = time.monotonic()
    finished = run("run", "linear", "--storage", str(tmp_path), "--name", "lin", "--address", ray_head.address)
    seconds = time.monotonic() - began
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert "nothing to train: lin already finished 60 epochs" in finished.stdout, finished.stdout
    assert "joined Ray cluster" not in finished.stdout and "training lin" not in finished.stdout, finished.stdout
    assert len(checks.starts(run_dir)) == 1 and result_of(run_dir) == result  # no worker group; the result stands
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    skipped = [e for e in events if e["event"] == "nothing_to_train"]
    assert [(e["epoch"], e["attempt"]) for e in skipped] == [(60, 2)], skipped
    lease = json.loads((run_dir / "lease.json").read_text())
    assert lease["token"] == 2 and lease["released"], lease  # taken, then given back
    print(f"finished run started again: {seconds:.1f}s")

    # A re-run resumes; here the newest checkpoint (60) is damaged, so it says so and resumes from the one before
    # (55). (A re-run from an intact newest checkpoint is what every other resume test meets.)
    assert checks.checkpoint_epochs(run_dir)[-2:] == [55, 60]
    trained_at = {r["epoch"]: r["timing"]["time"] for r in runrecords.read_metrics(run_dir)}  # epochs 56-60 are trained again
    newest = next(run_dir.glob("checkpoint_epoch000060_*"))
    (newest / "state.pt").write_bytes(b"half a checkpoint")
    again = run("run", "linear", "--storage", str(tmp_path), "--name", "lin", "--set", "train.epochs=62",
                "--address", ray_head.address)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "unreadable" in again.stdout + again.stderr and "falling back" in again.stdout + again.stderr
    checks.assert_run_completed(run_dir, 62)  # the redone epochs 56-60 are recorded once
    result = result_of(run_dir)
    assert result["resumed_from_epoch"] == 55 and result["metrics"]["train_loss"] <= 0.09
    assert checks.starts(run_dir)[-1]["start_epoch"] == 56

    # Goodput (issue 38): the parts sum to the wall time; the progress lost is epochs 56-60 as attempt 1 trained
    # them (its rows' times, dropped by the rerun), the restore of epoch 55's checkpoint is attempt 3's.
    found = goodput.read(run_dir, epochs=62)
    statuses = [(a.attempt, a.status) for a in found.attempts]
    assert statuses == [(1, "succeeded"), (2, "nothing to train"), (3, "succeeded")], found
    assert sum(found.seconds.values()) == pytest.approx(found.wall_s)
    assert found.seconds["lost"] == pytest.approx(trained_at[60] - trained_at[55], abs=0.01), found.seconds
    assert found.attempts[0].seconds["lost"] == pytest.approx(found.seconds["lost"])
    assert 0 < found.attempts[2].seconds["restore"] < 10 and found.seconds["other"] == 0, found.seconds
    assert found.seconds["training"] > found.seconds["lost"] and found.seconds["waiting"] > 0, found.seconds
    # Each trained attempt's start-up by phase, from the driver's launch mark and rank 0's session start: each took
    # time on a real Ray, and they sum to the start-up
    for attempt in (found.attempts[0], found.attempts[2]):
        assert all(seconds > 0 for seconds in attempt.startup.values()), attempt.startup
        assert sum(attempt.startup.values()) == pytest.approx(attempt.seconds["startup"]), attempt


SAVE_S = 0.5  # the delay a slow checkpoint injects into each save
SLOW_TO_SAVE = f"""import time

from torch import nn


class SlowToSave(nn.Module):
    \"\"\"The linear preset's model, whose state takes {SAVE_S} s longer to gather: a large model's stand-in.\"\"\"

    def __init__(self, in_features: int, hidden: int, out_features: int):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(in_features, hidden), nn.ReLU(), nn.Linear(hidden, out_features))

    def forward(self, x):
        return self.net(x)

    def state_dict(self, *args, **kwargs):
        time.sleep({SAVE_S})
        return super().state_dict(*args, **kwargs)
"""


def test_a_slow_checkpoint_shows_as_checkpoint_blocking_by_the_delay_injected(tmp_path):
    """Issue 38: a checkpoint made SAVE_S slower (its model's state_dict sleeps), saved every epoch, shows in goodput
    as checkpoint blocking of at least the delays injected, and at most those plus 0.5 s a save for the write
    itself (a few KB here); the rest of the epochs stays training. `raytrain local`: the same session and
    checkpointer as a Ray Train worker's, without Ray's start."""
    epochs = 4
    (tmp_path / "slow_to_save.py").write_text(SLOW_TO_SAVE)
    done = subprocess.run([*RAYTRAIN, "local", "linear", "--storage", str(tmp_path / "runs"), "--set",
                           "model._component_=slow_to_save.SlowToSave", "--set", f"train.epochs={epochs}",
                           "--set", "run.checkpoint_every=1"], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    found = goodput.read(tmp_path / "runs" / "linear", epochs=epochs)
    assert sum(found.seconds.values()) == pytest.approx(found.wall_s) and found.seconds["other"] == 0, found.seconds
    assert epochs * SAVE_S - 0.01 <= found.seconds["checkpoint"] <= epochs * (SAVE_S + 0.5), found.seconds  # rounded to ms
    assert found.seconds["training"] > 0 and found.seconds["lost"] == found.seconds["recovery"] == 0, found.seconds
    print(f"slow checkpoint: {found.seconds['checkpoint']:.2f} s checkpoint blocking for {epochs} saves "
          f"{SAVE_S} s slower")


def test_a_job_that_can_never_be_scheduled_fails_fast(tmp_path):
    # Embedded, as before the shared head: the one failure-path test here that needs no cluster of its own.
    began = time.time()
    done = run("run", "linear", "--storage", str(tmp_path), "--set", "scaling.cpus_per_worker=64", timeout=120)
    assert done.returncode == 1
    assert "can never be scheduled" in done.stderr and "Traceback" not in done.stderr
    assert result_of(tmp_path / "linear")["status"] == "failed"
    print(f"failed after {time.time() - began:.1f}s")


def test_digits_takes_a_dataloader_for_its_small_data_and_reaches_ninety_percent(ray_head, tmp_path):
    """The preset's data.loader: auto takes torch for its 0.5 MB and says so (Ray Data's path of the built-in loop:
    test_workloads' vit-ray and streaming runs)."""
    done = run("run", "digits", "--storage", str(tmp_path), "--address", ray_head.address)
    assert done.returncode == 0, done.stderr[-3000:]
    result = result_of(tmp_path / "digits")
    assert result["metrics"]["val_accuracy"] >= 0.90, result
    checks.assert_run_completed(tmp_path / "digits", 12)
    [launch] = [e for e in checks.read_jsonl(tmp_path / "digits" / "events.jsonl") if e["event"] == "launch"]
    assert launch["loader"] == "torch" and launch["loader_reason"].startswith("auto: torch, the data is 0.5 MB"), launch


def test_a_run_that_fails_every_retry_exits_with_one_paragraph_and_why_names_the_rank(tmp_path):
    # A model that fails on real values only (preflight's meta-device batch cannot ask for one, so it passes
    # validation), on rank 1 of the three workers: a training failure, not a config error. Issue 38: once the run
    # (and its embedded Ray) is gone, `raytrain why` names that rank, its exception and what it printed last.
    (tmp_path / "failing_model.py").write_text(
        "import ray.train\nimport torch\nfrom torch import nn\n\n\n"
        "class FailsOnRealData(nn.Module):\n"
        "    def __init__(self, in_features: int, hidden: int, out_features: int):\n"
        "        super().__init__()\n"
        "        self.linear = nn.Linear(in_features, out_features)\n\n"
        "    def forward(self, x):\n"
        "        if x.abs().max().item() >= 0 and ray.train.get_context().get_world_rank() == 1:\n"
        "            print('rank 1 is about to fail')\n"
        "            raise RuntimeError('this model fails on rank 1 of 3')\n"
        "        return self.linear(x)\n")
    done = subprocess.run([*RAYTRAIN, "run", "linear", "--storage", str(tmp_path / "runs"),
                           "--set", "model._component_=failing_model.FailsOnRealData", "--set", "run.max_failures=0"],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 1, done.stderr[-3000:]
    assert "training failed after 0 worker-group restart(s) (0 allowed)" in done.stderr
    assert "this model fails on rank 1 of 3" in done.stderr and "No checkpoint was written" in done.stderr
    assert f"Which rank failed first, and why: raytrain why {tmp_path / 'runs' / 'linear'}" in done.stderr
    assert "Traceback" not in done.stdout + done.stderr, done.stderr[-3000:]
    assert result_of(tmp_path / "runs" / "linear")["status"] == "failed"
    why = run("why", str(tmp_path / "runs" / "linear"), timeout=120)
    assert why.returncode == 0, why.stderr
    assert "attempt 1: failed" in why.stdout and "first failure: rank 1 of 3 (node " in why.stdout, why.stdout
    assert "RuntimeError: this model fails on rank 1 of 3" in why.stdout and "in forward" in why.stdout
    assert "| rank 1 is about to fail" in why.stdout, why.stdout
    first = json.loads(run("why", str(tmp_path / "runs" / "linear"), "--json").stdout)["attempts"][0]
    assert first["first_failure"]["rank"] == 1 and first["first_failure"]["node_ip"]
    assert all(f["rank"] != 1 for f in first["later_failures"])


def test_a_rank_killed_by_a_signal_is_named_by_why_from_the_drivers_record(ray_head, tmp_path):
    """Rank 1's process is SIGKILLed at its first batch, as the OOM killer kills one, and the run has no retry. The
    rank records nothing; Ray Train's health check finds its process dead and the driver records it
    (raytrain.driver.workerdeaths): `raytrain why` names rank 1 first, with Ray's cause and where it ran, and the
    ranks whose collectives broke with it after it."""
    (tmp_path / "killed_model.py").write_text(
        "import os\nimport signal\n\nimport ray.train\nfrom torch import nn\n\n\n"
        "class KilledOnRank1(nn.Module):\n"
        "    def __init__(self, in_features: int, hidden: int, out_features: int):\n"
        "        super().__init__()\n"
        "        self.linear = nn.Linear(in_features, out_features)\n\n"
        "    def forward(self, x):\n"
        "        if x.abs().max().item() >= 0 and ray.train.get_context().get_world_rank() == 1:\n"
        "            print('rank 1 is about to be killed', flush=True)\n"
        "            os.kill(os.getpid(), signal.SIGKILL)\n"
        "        return self.linear(x)\n")
    run_dir = tmp_path / "runs" / "linear"
    done = subprocess.run([*RAYTRAIN, "run", "linear", "--storage", str(tmp_path / "runs"), "--address",
                           ray_head.address, "--set", "model._component_=killed_model.KilledOnRank1",
                           "--set", "run.max_failures=0"], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    from raytrain.rundir import postmortem  # `raytrain why`'s own (its CLI: the test above)

    found = postmortem.why(run_dir)
    text = postmortem.render(found)
    assert "first failure: rank 1 of 3 (node " in text and "its process died or stopped answering" in text and \
        "The actor is dead because its worker process has died" in text, text
    first = found["attempts"][0]["first_failure"]
    assert first["died"] and first["node_ip"] and first["pid"] and "ActorDiedError" in first["type"], first
    print(text)
