"""raytrain.rundir.postmortem, behind `raytrain why RUN_DIR`: the join of a run's records (lease claims, results,
events, every rank's log and failure record) into why each attempt ended, over fabricated run directories written
through the storage API, on a directory and on the real S3 server (tests/support/objectstore.py). The records'
writer on a worker: tests/worker/test_raysession.py; a real failing rank of three, its cluster gone:
tests/integration/test_run.py."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from raytrain.rundir import atomicfile, layout, postmortem, storage, workerlogs

T0 = time.time() - 3600  # an hour ago: a lease renewed then has long expired


def write(path: Path, data: bytes | str) -> None:
    storage.makedirs(path.parent)
    atomicfile.write_atomic(path, data)


def append(path: Path, row: dict | bytes) -> None:
    try:
        old = storage.read_bytes(path)
    except FileNotFoundError:
        old = b""
    write(path, old + (row if isinstance(row, bytes) else (json.dumps(row) + "\n").encode()))


def claim(run_dir: Path, token: int, since: float) -> None:
    write(run_dir / layout.CLAIMS_DIR / f"{token}.json", json.dumps(
        {"token": token, "host": "driver-pod", "pid": 100 + token, "since": since, "renewed": since, "ttl_s": 30.0}))


def lease(run_dir: Path, token: int, renewed: float, released: bool = False) -> None:
    write(run_dir / layout.LEASE_FILE, json.dumps({"token": token, "host": "driver-pod", "pid": 100 + token,
                                                   "since": T0, "renewed": renewed, "ttl_s": 30.0,
                                                   "released": released}))


def result(run_dir: Path, attempt: int, status: str, **fields) -> None:
    append(run_dir / layout.RESULTS_HISTORY_FILE, {"time": T0, "status": status, "attempt": attempt,
                                                   "duration_s": 42.0, **fields})


def event(run_dir: Path, name: str, at: float, **fields) -> None:
    append(run_dir / layout.EVENTS_FILE, {"event": name, "time": at, **fields})


def log(run_dir: Path, attempt: int, rank: int, data: bytes | str) -> None:
    write(workerlogs.log_path(run_dir, attempt, rank), data)


def failure(run_dir: Path, attempt: int, rank: int, at: float, error: Exception,
            last_lines: tuple[str, ...] = ()) -> None:
    try:  # raised for real: its traceback
        raise error
    except type(error) as raised:
        record = workerlogs.failure_record(attempt, rank, 3, raised, node_ip=f"10.0.0.{rank + 1}",
                                           last_lines=last_lines)
    write(workerlogs.failure_path(run_dir, attempt, rank), json.dumps({**record, "time": at}))


def one_rank_of_three_raises(run_dir: Path) -> None:
    claim(run_dir, 1, T0)
    event(run_dir, "start", T0 + 1, attempt=1, world_size=3)
    for rank in range(3):
        log(run_dir, 1, rank, f"rank {rank} epoch 1\n")
    failure(run_dir, 1, 1, T0 + 5, RuntimeError("rank 1 fails"), ("rank 1 epoch 1", "rank 1 about to fail"))
    result(run_dir, 1, "failed", error="training failed after 0 worker-group restart(s) (0 allowed): rank 1 fails")
    lease(run_dir, 1, T0 + 6, released=True)


def two_ranks_raise_at_different_times(run_dir: Path) -> None:
    claim(run_dir, 1, T0)
    failure(run_dir, 1, 0, T0 + 7, RuntimeError("the collective broke"))
    failure(run_dir, 1, 2, T0 + 3, ValueError("a bad batch"))
    log(run_dir, 1, 2, "".join(f"line {n}\n" for n in range(100)))
    result(run_dir, 1, "failed", error="training failed")


def a_rank_killed_and_found_by_the_health_check(run_dir: Path) -> None:
    """Rank 1's process SIGKILLed at T0 + 10: the others' collectives fail at once (their own records), the driver's
    health check finds it 1.5 s later (raytrain.driver.workerdeaths: Ray's error, the place Ray Train started it)."""
    claim(run_dir, 1, T0)
    event(run_dir, "start", T0 + 1, attempt=1, world_size=3)
    log(run_dir, 1, 1, "rank 1 epoch 1\nrank 1 loading a huge batch\n")
    failure(run_dir, 1, 0, T0 + 10.1, RuntimeError("Connection closed by peer [10.0.0.2]:5000"))
    failure(run_dir, 1, 2, T0 + 10.2, RuntimeError("Connection closed by peer [10.0.0.2]:5000"))
    died = workerlogs.failure_record(
        1, 1, 3, RuntimeError("The actor died unexpectedly before finishing this task.\n\tclass_name: "
                              "RayTrainWorker\nThe actor is dead because its worker process has died. Worker exit "
                              "type: SYSTEM_ERROR Worker exit detail: killed by SIGKILL"),
        node_ip="10.0.0.2", died={"hostname": "worker-1", "pid": 4242})
    write(workerlogs.failure_path(run_dir, 1, 1), json.dumps({**died, "time": T0 + 11.5}))
    result(run_dir, 1, "failed", error="training failed")


def driver_killed_mid_attempt(run_dir: Path) -> None:
    claim(run_dir, 1, T0)
    event(run_dir, "start", T0 + 1, attempt=1, world_size=3)
    log(run_dir, 1, 0, "epoch 1\nepoch 2\n")
    lease(run_dir, 1, T0 + 20)  # renewed last an hour ago, never released: its driver died


def running(run_dir: Path) -> None:
    claim(run_dir, 1, T0)
    lease(run_dir, 1, time.time())


def succeeded_after_a_failed_attempt(run_dir: Path) -> None:
    claim(run_dir, 1, T0)
    failure(run_dir, 1, 0, T0 + 2, MemoryError("out of memory"))
    result(run_dir, 1, "failed", error="training failed")
    claim(run_dir, 2, T0 + 100)
    event(run_dir, "drain", T0 + 110, message="node n1 is draining")  # names no attempt: attempt 2 held the run
    event(run_dir, "start", T0 + 101, attempt=2, world_size=3)
    event(run_dir, "start", T0 + 120, attempt=2, world_size=3)
    result(run_dir, 2, "succeeded", epochs_completed=5)
    lease(run_dir, 2, T0 + 130, released=True)


def damaged_records(run_dir: Path) -> None:
    claim(run_dir, 1, T0)
    result(run_dir, 1, "stopped", error="stopped by SIGTERM after 2 epoch(s)", signal="SIGTERM")
    append(run_dir / layout.RESULTS_HISTORY_FILE, b"\xff\xfe{not json\n")  # a damaged line, not the last
    append(run_dir / layout.EVENTS_FILE, b'{"event": "start", "time": "x", "attempt": 1}\n{cut')
    write(workerlogs.failure_path(run_dir, 1, 0), b"\xff\xfe\x00 not a record")
    write(workerlogs.failure_path(run_dir, 1, 1), json.dumps({"rank": "one", "time": "yesterday", "message": 5,
                                                              "last_lines": "not a list"}))
    log(run_dir, 1, 1, b"fine\n\xff\xfe broken \xc3\x28\n")
    write(workerlogs.log_path(run_dir, 1, 0).with_name("attempt-x-rank0.log"), b"not an attempt's")


def summary(report: dict) -> list[tuple]:
    """(attempt, ending, first rank, later ranks) per attempt."""
    return [(a["attempt"], a["ending"], a["first_failure"] and a["first_failure"]["rank"],
             [f["rank"] for f in a["later_failures"]]) for a in report["attempts"]]


CASES: list[tuple[Callable[[Path], None], list[tuple], list[str]]] = [
    (one_rank_of_three_raises, [(1, "failed", 1, [])],
     ["first failure: rank 1 of 3 (node 10.0.0.2, host ", "RuntimeError: rank 1 fails", "| rank 1 about to fail",
      "from its failure record", 'raise error', "attempt-1-rank1.log", "(driver on driver-pod, pid 101)"]),
    (two_ranks_raise_at_different_times, [(1, "failed", 2, [0])],
     ["first failure: rank 2 of 3 (node 10.0.0.3", "ValueError: a bad batch", "then rank 0 of 3 (node 10.0.0.1",
      "+4.0 s: RuntimeError: the collective broke", "| line 99", "its last 20 line(s)"]),
    (a_rank_killed_and_found_by_the_health_check, [(1, "failed", 1, [0, 2])],
     ["first failure: rank 1 of 3 (node 10.0.0.2, host worker-1, pid 4242): its process died or stopped answering "
      "(found by Ray Train's health check at", "RuntimeError: The actor died unexpectedly before finishing",
      "\n    The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR Worker exit "
      "detail: killed by SIGKILL\n", "| rank 1 loading a huge batch",
      "then rank 0 of 3 (node 10.0.0.1", "as it died: RuntimeError: Connection closed by peer"]),
    (driver_killed_mid_attempt, [(1, "no result", None, [])],
     ["attempt 1: no result", "the driver was killed", "its lease has expired"]),
    (running, [(1, "running", None, [])], ["attempt 1: running", "renewed its lease"]),
    (succeeded_after_a_failed_attempt, [(1, "failed", 0, []), (2, "succeeded", None, [])],
     ["2 attempt(s); the last: succeeded", "MemoryError: out of memory", "trained to epoch 5",
      "drained: node n1 is draining", "2 worker groups started"]),
    (damaged_records, [(1, "stopped", 1, [])],
     ["SIGTERM (the pod was deleted or preempted", "attempt-1-rank0.error.json is damaged",
      "results.jsonl line 2 is damaged (not UTF-8)", " broken \ufffd(", "first failure: rank 1 at an unknown time",
      "an unknown exception: 5"]),
]


@pytest.fixture(params=["directory", "s3"])
def storage_root(request, tmp_path) -> str:
    return str(tmp_path) if request.param == "directory" else request.getfixturevalue("s3_prefix")


@pytest.mark.parametrize("build, attempts, fragments", CASES, ids=[c[0].__name__ for c in CASES])
def test_why_each_attempt_ended(storage_root, build, attempts, fragments):
    run_dir = storage.as_path(storage_root) / "run"
    build(run_dir)
    found = postmortem.why(run_dir)
    assert summary(found) == attempts
    text = postmortem.render(found)
    for fragment in fragments:
        assert fragment in text, f"{fragment!r} not in:\n{text}"
    assert json.loads(json.dumps(found)) == found  # --json's output is this, whole


def test_the_first_failure_is_the_earliest_and_carries_the_log(tmp_path):
    two_ranks_raise_at_different_times(tmp_path)
    first = postmortem.why(tmp_path)["attempts"][0]["first_failure"]
    assert first["time"] == T0 + 3 and first["node_ip"] == "10.0.0.3" and first["type"] == "ValueError"
    assert first["last_lines"] == [f"line {n}" for n in range(80, 100)]  # no lines in its record: its log's end
    assert first["log"] == str(workerlogs.log_path(tmp_path, 1, 2))


def test_a_long_log_is_read_from_its_end(tmp_path):
    log(tmp_path, 1, 0, "x" * 300_000 + "\n" + "".join(f"line {n}\n" for n in range(30)))
    assert postmortem.log_tail(workerlogs.log_path(tmp_path, 1, 0)) == [f"line {n}" for n in range(10, 30)]
    assert postmortem.log_tail(workerlogs.log_path(tmp_path, 1, 9)) == []


@pytest.mark.parametrize("make, fragment", [
    (lambda root: root / "missing", "does not exist"),
    (lambda root: root, "holds no raytrain records"),
])
def test_a_path_that_holds_no_run_is_named_with_the_fix(storage_root, make, fragment):
    path = make(storage.as_path(storage_root))
    if fragment == "holds no raytrain records":
        write(path / "notes.txt", "not a run")
    with pytest.raises(postmortem.NoRecords) as refused:
        postmortem.why(path)
    assert fragment in str(refused.value) and str(path) in str(refused.value) and "Fix:" in str(refused.value)


def test_a_file_is_not_a_run_directory(tmp_path):
    (tmp_path / "result.json").write_text("{}")
    with pytest.raises(postmortem.NoRecords, match="is a file, not a run directory"):
        postmortem.why(tmp_path / "result.json")


def test_a_run_written_before_the_records_of_failures_is_read_too():
    """A run directory of raytrain at b5c662d (tests/fixtures/runs-b5c662d): no worker-logs/, read as it is."""
    run_dir = Path(__file__).parents[1] / "fixtures" / "runs-b5c662d" / "before-the-move"
    [attempt] = postmortem.why(run_dir)["attempts"]
    assert (attempt["attempt"], attempt["ending"], attempt["first_failure"]) == (1, "succeeded", None)
    assert attempt["driver"]["host"] and attempt["explanation"] == "trained to epoch 2"
