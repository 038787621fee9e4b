"""raytrain.driver.workerdeaths: the controller's callback records a rank whose process died (its health check
failed, or hung) with the place Ray Train started it; a rank's own failure (a Python exception, which it records
itself) is left to it; each rank once. Ray Train's own poll-status and error classes; a fake worker group (what
after_worker_group_start reads of it). Against a real cluster: tests/integration/test_emulate.py's lost worker."""

from __future__ import annotations

import json
from types import SimpleNamespace

from ray.exceptions import ActorDiedError
from ray.train.v2._internal.exceptions import WorkerHealthCheckFailedError, WorkerHealthCheckTimeoutError
from ray.train.v2._internal.execution.worker_group.poll import WorkerGroupPollStatus, WorkerStatus

from raytrain.driver import workerdeaths
from raytrain.rundir import postmortem, workerlogs


def group(*places: tuple[str, str, int]) -> SimpleNamespace:
    workers = [SimpleNamespace(distributed_context=SimpleNamespace(world_rank=rank),
                               metadata=SimpleNamespace(node_ip=ip, hostname=host, pid=pid))
               for rank, (ip, host, pid) in enumerate(places)]
    return SimpleNamespace(get_workers=lambda: workers)


def polled(**errors: Exception) -> WorkerGroupPollStatus:
    return WorkerGroupPollStatus({rank: WorkerStatus(running=f"r{rank}" not in errors, error=errors.get(f"r{rank}"))
                                  for rank in range(3)})


def record(tmp_path, rank: int) -> dict:
    return json.loads(workerlogs.failure_path(tmp_path, 2, rank).read_text())


def test_a_dead_rank_is_recorded_once_where_it_ran_and_a_raised_error_is_left_to_its_rank(tmp_path):
    callback = workerdeaths.record_deaths_callback(tmp_path, 2)
    callback.after_worker_group_start(group(("10.0.0.1", "head", 11), ("10.0.0.2", "worker-1", 22),
                                            ("10.0.0.3", "worker-2", 33)))
    died = WorkerHealthCheckFailedError("A worker health check failed.", failure=ActorDiedError())
    callback.after_worker_group_poll_status(polled(r1=died, r2=RuntimeError("a user error")))
    found = record(tmp_path, 1)
    assert (found["died"], found["node_ip"], found["hostname"], found["pid"], found["world_size"]) == \
        (True, "10.0.0.2", "worker-1", 22, 3)
    assert found["type"].endswith("ActorDiedError") and "died unexpectedly" in found["message"], found
    assert not workerlogs.failure_path(tmp_path, 2, 2).exists()  # rank 2 records its own exception
    first = record(tmp_path, 1)
    callback.after_worker_group_poll_status(polled(r1=died))  # the next poll: once
    assert record(tmp_path, 1) == first
    [attempt] = postmortem.why(tmp_path)["attempts"]
    assert attempt["first_failure"]["rank"] == 1 and attempt["first_failure"]["died"]


def test_a_hung_rank_is_recorded_and_a_ranks_own_record_is_kept(tmp_path):
    callback = workerdeaths.record_deaths_callback(tmp_path, 2)
    callback.after_worker_group_start(group(("10.0.0.1", "head", 11), ("10.0.0.2", "worker-1", 22),
                                            ("10.0.0.3", "worker-2", 33)))
    workerlogs.record_failure(tmp_path, 2, 0, 3, MemoryError("rank 0's own"))  # it recorded itself, then died
    hung = WorkerHealthCheckTimeoutError("A worker health check has been hanging for 600.00 seconds.")
    callback.after_worker_group_poll_status(polled(r0=WorkerHealthCheckFailedError("failed", ActorDiedError()),
                                                   r2=hung))
    assert record(tmp_path, 0)["type"] == "MemoryError" and "died" not in record(tmp_path, 0)
    assert record(tmp_path, 2)["died"] and "hanging for 600.00 seconds" in record(tmp_path, 2)["message"]


def test_a_callback_never_fails_the_controller(tmp_path):
    callback = workerdeaths.record_deaths_callback(tmp_path / "file", 1)
    (tmp_path / "file").write_text("a file where the run directory should be")
    callback.after_worker_group_start(SimpleNamespace(get_workers=lambda: [object()]))  # no metadata: unknown place
    callback.after_worker_group_poll_status(polled(r1=WorkerHealthCheckFailedError("failed", ActorDiedError())))
    callback.after_worker_group_poll_status(object())  # not a poll status
