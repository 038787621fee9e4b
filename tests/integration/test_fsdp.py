"""FSDP2 with sharded, asynchronous checkpoints through the real CLI on embedded Ray: the gpt preset (smaller) trains
on 2 FSDP workers checkpointing every step, the whole run is SIGKILLed while a checkpoint is being written, and the
next start, on 3 workers, removes the torn one, resumes from the newest committed one (resharded from 2 workers)
and finishes; `raytrain export` then gives one file a plain model loads.

    .venv/bin/pytest -m integration tests/integration/test_fsdp.py -v --durations=0
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from raytrain import models
from raytrain.checkpoint import checkpoints
from raytrain.rundir import layout
from tests.support import checks, podloss

pytestmark = pytest.mark.integration

RAYTRAIN = [sys.executable, "-m", "raytrain.cli"]
TTL_S = 10  # the killed run's lease is taken over after this
# Small enough for seconds per epoch on 2 CPUs, big enough (4 blocks of 160: ~1.3 M parameters, ~16 MB of
# checkpoint with AdamW's state) that a write is in flight for a while; one checkpoint per step.
MODEL = {"n_layers": 4, "d_model": 160, "n_heads": 4, "block_size": 32}
SETTINGS = ["--set", "model.n_layers=4", "--set", "model.d_model=160", "--set", "model.n_heads=4",
            "--set", "model.block_size=32", "--set", "model.dropout=0.0", "--set", "data.block_size=32",
            "--set", "data.generated_bytes=60000", "--set", "data.val_fraction=0.05", "--set", "train.batch_size=12",
            "--set", "train.max_steps_per_epoch=12", "--set", "train.epochs=2", "--set", "run.checkpoint_every_steps=1",
            "--set", "run.keep_checkpoints=2"]


def command(storage: Path, *extra: str) -> list[str]:
    return [*RAYTRAIN, "run", "gpt", "--storage", str(storage), "--name", "sharded", *SETTINGS, *extra]


def kill_during_a_write(storage: Path, run_dir: Path, tries: int = 3, timeout: float = 300) -> list[str]:
    """Start the run and SIGKILL its whole process group once a checkpoint is committed and the next is being
    written (its staging directory holds shards but not yet DCP's .metadata, which is written last); returns the torn
    staging directories left. A write that committed between the look and the kill is no tear: the run is started
    again (it resumes) and killed again, up to `tries` times."""
    for _ in range(tries):
        proc = subprocess.Popen(command(storage), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True, env={**os.environ, "RAYTRAIN_LEASE_TTL_S": str(TTL_S)})
        try:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                assert proc.poll() is None, proc.stdout.read()[-3000:]
                staging = [p for p in run_dir.glob(f"{layout.STAGING_PREFIX}*")
                           if (p / "shards").is_dir() and not (p / "shards" / ".metadata").exists()]
                if staging and checkpoints.committed(run_dir):
                    break
                time.sleep(0.005)
            else:
                raise AssertionError("no checkpoint write was ever seen in flight")
        finally:
            podloss.kill_session(proc)  # a no-op for one that had ended (the assertion above says how)
        torn = [p.name for p in staging if p.exists()]
        if torn:
            return torn
    raise AssertionError(f"every one of {tries} kills came after the write it aimed at had committed")


def test_fsdp_killed_mid_write_resumes_on_another_worker_count_and_exports(tmp_path):
    run_dir = tmp_path / "sharded" / "sharded"
    torn = kill_during_a_write(tmp_path / "sharded", run_dir)
    newest_before = checkpoints.position_of(checkpoints.committed(run_dir)[0])

    resumed = subprocess.run(command(tmp_path / "sharded", "--set", "scaling.num_workers=3"), capture_output=True,
                             text=True, timeout=600, env={**os.environ, "RAYTRAIN_LEASE_TTL_S": str(TTL_S)})
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "3 workers" in resumed.stdout
    checks.assert_run_completed(run_dir, 2)
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    # the torn write was never loaded: removed as never committed, and the resume came from a committed one
    removed = " ".join(e.get("message", "") for e in events if e["event"] == "warning")
    assert all(f"{name} was never committed" in removed for name in torn), removed
    restored = [e for e in events if e["event"] == "restored"][-1]  # the last start's (a retried kill resumes too)
    assert restored["resharded_from"] == 2
    assert checkpoints.Position(restored["epoch"], restored["step"]) >= newest_before
    assert not list(run_dir.glob(f"{layout.STAGING_PREFIX}*"))
    newest = checkpoints.committed(run_dir)[0]
    meta = json.loads((newest / checkpoints.META_FILE).read_text())
    assert meta["kind"] == "sharded" and meta["world_size"] == 3
    assert sum(1 for name in meta["files"] if name.startswith("shards/__")) == 3  # every worker wrote its shards
    # each hashed by the worker that wrote it, as it wrote it, the hashes gathered into rank 0's manifest (issue 40)
    assert all(len(meta["files"][name].get("sha256", "")) == 64 for name in meta["files"] if name.startswith("shards/"))
    checkpoints.verify_hash(newest)

    exported = subprocess.run([*RAYTRAIN, "export", str(run_dir), "--out", str(tmp_path / "model.pt")],
                              capture_output=True, text=True, timeout=120)
    assert exported.returncode == 0, exported.stderr[-2000:]
    payload = torch.load(tmp_path / "model.pt", weights_only=True)
    model = models.gpt(**MODEL)
    model.load_state_dict(payload["model"])  # the model's own parameter names, full tensors
    assert payload["epoch"] == 2 and payload["checkpoint"] == newest.name
