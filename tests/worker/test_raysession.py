"""training/raytrain/worker/raysession.py's `run_worker`, the part of every Ray Train worker's entry that keeps its
records: what the rank prints copied to worker-logs/attempt-<N>-rank<R>.log, and its first failure recorded in
worker-logs/attempt-<N>-rank<R>.error.json before the exception reaches Ray Train. Run here with a LocalSession
standing in for rank 2 of 3 (no Ray); the real runs are tests/integration/test_run.py's failing rank and
test_ray_train_scripts.py's S3 run."""

from __future__ import annotations

import json

import pytest

from raytrain.rundir import workerlogs
from raytrain.spec.config import load_config
from raytrain.worker.drain import NodeDraining
from raytrain.worker.localsession import LocalSession
from raytrain.worker.raysession import run_worker

from tests.support.project import user_module

LOOPS = """
    import sys
    from raytrain.lifecycle.endings import AttemptEnded, Ending

    def fails(session):
        print(f"rank {session.rank} begins")
        print("a warning on stderr", file=sys.stderr)
        raise ValueError("rank two's data is bad \\udcff")

    def diverges(session):
        raise AttemptEnded(Ending.FAILED, "training diverged at epoch 3")

    def drained(session):
        raise AttemptEnded(Ending.DRAINING, "node n1 is draining")

    def exits(session):
        sys.exit(0)

    def returns(session):
        print("done")
"""


class RankTwo(LocalSession):
    rank, world_size = 2, 3


@pytest.fixture
def project(tmp_path):
    yield from user_module(tmp_path, "rs_loops", LOOPS)


def session(project, loop: str) -> RankTwo:
    path = project / "job.yaml"
    path.write_text(f"model: {{_component_: mlp}}\ndata: {{_component_: raytrain.data.linear.Linear}}\n"
                    f"loop: {{_component_: rs_loops.{loop}}}\ntrain: {{epochs: 1, batch_size: 18}}\n"
                    f"scaling: {{num_workers: 3}}\nrun: {{storage_path: {project / 'runs'}}}\n")
    cfg = load_config(str(path))
    return RankTwo(cfg, project / "runs" / "job", 1)


def test_a_rank_that_raises_records_its_failure_and_its_output_before_it_propagates(project, capsys):
    worker = session(project, "fails")
    with pytest.raises(ValueError, match="rank two's data is bad"):
        run_worker(worker.config, worker, False, 4, node_ip="10.1.2.3")
    run_dir = worker.run_dir
    record = json.loads(workerlogs.failure_path(run_dir, 4, 2).read_text())
    assert record["attempt"] == 4 and record["rank"] == 2 and record["world_size"] == 3
    assert record["node_ip"] == "10.1.2.3" and record["hostname"] and record["pid"] > 0 and record["time"] > 0
    assert record["type"] == "ValueError" and record["message"] == "rank two's data is bad \udcff"
    assert 'raise ValueError("rank two' in record["traceback"] and "in fails" in record["traceback"]
    assert record["last_lines"] == ["rank 2 begins", "a warning on stderr"]
    # every rank's output is kept, each in its own file; still written where it went
    assert workerlogs.log_path(run_dir, 4, 2).read_text() == "rank 2 begins\na warning on stderr\n"
    assert "rank 2 begins" in capsys.readouterr().out

    # A restarted group's later failure of the same rank leaves the first record
    again = session(project, "fails")
    with pytest.raises(ValueError):
        run_worker(again.config, again, False, 4, node_ip="10.9.9.9")
    assert json.loads(workerlogs.failure_path(run_dir, 4, 2).read_text())["node_ip"] == "10.1.2.3"
    assert workerlogs.log_path(run_dir, 4, 2).read_text().count("rank 2 begins") == 2  # appended


@pytest.mark.parametrize("loop, raised, recorded", [
    ("diverges", NodeDraining, "raytrain.lifecycle.endings.AttemptEnded"),  # a failed ending: recorded
    ("drained", NodeDraining, None),  # a drain ends the group, it is no failure
    ("exits", SystemExit, None),
    ("returns", None, None),
])
def test_only_failures_are_recorded(project, loop, raised, recorded):
    worker = session(project, loop)
    if raised is None:
        run_worker(worker.config, worker, False, 1)
    else:
        with pytest.raises(raised):
            run_worker(worker.config, worker, False, 1)
    path = workerlogs.failure_path(worker.run_dir, 1, 2)
    assert (json.loads(path.read_text())["type"] if path.exists() else None) == recorded


def test_a_record_that_cannot_be_written_never_hides_the_failure(tmp_path, capfd):
    blocked = tmp_path / "run"
    blocked.mkdir()
    (blocked / "worker-logs").write_text("a file where the directory goes")
    assert workerlogs.record_failure(blocked, 1, 0, 1, RuntimeError("boom")) is None
    assert "rank 0's failure could not be recorded" in capfd.readouterr().err  # the process's own stderr


def test_a_failure_record_is_bounded(tmp_path):
    error = RuntimeError("m" * 100_000)
    path = workerlogs.record_failure(tmp_path, 1, 0, 1, error, last_lines=["x" * 10_000] * 100)
    record = json.loads(path.read_text())
    assert len(record["message"]) <= workerlogs.MAX_MESSAGE_CHARS + 3
    assert len(record["traceback"]) <= workerlogs.MAX_TRACEBACK_CHARS + 3
    assert len(record["last_lines"]) == workerlogs.TAIL_LINES
    assert all(len(line) <= workerlogs.MAX_LINE_CHARS + 3 for line in record["last_lines"])
    assert path.stat().st_size < 40_000
