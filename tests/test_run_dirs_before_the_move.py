"""Run directories written before the house move (raytrain at b5c662d, flat modules) resume after it: the files a
run directory holds (config.yaml, metrics, events, results, the lease, single-file and sharded checkpoints) are the
layout users have on their volumes and buckets, and a move of code must not strand them. The fixtures were written
by `raytrain local linear --set train.epochs=2` at b5c662d (once with run.checkpointer=sharded) and are copied
before use, since a resume writes into them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from raytrain.rundir import layout, runrecords
from tests.support.cli import in_forked_child

FIXTURES = Path(__file__).parent / "fixtures" / "runs-b5c662d"


@pytest.mark.parametrize("name, checkpointer", [("before-the-move", "file"), ("sharded-before-the-move", "sharded")])
def test_a_run_written_before_the_move_resumes_from_its_checkpoint(tmp_path, name, checkpointer):
    shutil.copytree(FIXTURES, tmp_path / "runs")
    run_dir = tmp_path / "runs" / name
    done = in_forked_child(["local", "linear", "--storage", str(tmp_path / "runs"), "--name", name,
                    "--set", "train.epochs=3", "--set", f"run.checkpointer={checkpointer}"])
    assert done.returncode == 0, done.output
    assert [row["epoch"] for row in runrecords.read_metrics(run_dir)] == [1, 2, 3]  # epochs 1-2 not trained again
    restored = [e for e in runrecords.read_events(run_dir) if e["event"] == "restored"]
    assert [e["epoch"] for e in restored] == [2], restored
    assert json.loads((run_dir / layout.RESULT_FILE).read_text())["status"] == "succeeded"
