"""The failure of a Ray Train worker whose process died (SIGKILL, the OOM killer) or stopped answering,
recorded for `raytrain why`: such a rank records nothing itself (raytrain.worker.raysession records a Python
exception before it leaves the worker). Ray Train's controller finds it by its health check: the poll of the worker
fails (WorkerHealthCheckFailedError, holding Ray's ActorDiedError and its cause), or hangs past
RAY_TRAIN_WORKER_HEALTH_CHECK_TIMEOUT_S (WorkerHealthCheckTimeoutError). This worker-group callback, run by Ray
Train's controller on the driver's node, records that rank's failure in the run's worker-logs/ as the rank would
have (raytrain.rundir.workerlogs.record_failure, marked `died`), with the node, host and pid Ray Train started it
on; `raytrain why` shows it with the lines the rank printed last (its log, kept as it ran). A rank that recorded
its own failure keeps it (the first record stays). A node lost whole, its raylet with it, is not found this way:
the poll of its workers hangs until Ray marks the node dead, and the other ranks' errors (their collective's peer
gone) restart or end the group before that.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from raytrain.rundir import workerlogs

logger = logging.getLogger(__name__)


def record_deaths_callback(run_dir: Path, attempt: int) -> Any:
    """The callback for the TorchTrainer's RunConfig. Made here so that Ray Train's internals are imported only on
    the driver."""
    from ray.train.v2._internal.exceptions import WorkerHealthCheckFailedError, WorkerHealthCheckTimeoutError
    from ray.train.v2._internal.execution.callback import WorkerGroupCallback

    class RecordDeaths(WorkerGroupCallback):
        def __init__(self) -> None:
            self.workers: dict[int, dict] = {}  # world rank: where Ray Train started it
            self.recorded: set[int] = set()  # the ranks recorded, in this worker group

        def after_worker_group_start(self, worker_group: Any) -> None:
            self.workers, self.recorded = {}, set()
            try:
                for index, worker in enumerate(worker_group.get_workers()):
                    context = worker.distributed_context
                    rank = context.world_rank if context is not None else index
                    meta = worker.metadata
                    self.workers[rank] = {"node_ip": meta.node_ip, "hostname": meta.hostname, "pid": meta.pid}
            except Exception as err:  # never fail the controller over it: the record only lacks where it ran
                logger.warning("raytrain: the worker group's places are not known (%s)", err)

        def after_worker_group_poll_status(self, worker_group_status: Any) -> None:
            try:
                statuses = worker_group_status.worker_statuses
                for rank, status in statuses.items():
                    error = status.error
                    if rank in self.recorded or not isinstance(
                            error, (WorkerHealthCheckFailedError, WorkerHealthCheckTimeoutError)):
                        continue
                    self.recorded.add(rank)
                    where = self.workers.get(rank, {})
                    cause = getattr(error, "health_check_failure", None)  # Ray's error: why the process is gone
                    workerlogs.record_failure(run_dir, attempt, rank, len(statuses),
                                              cause if isinstance(cause, BaseException) else error,
                                              node_ip=where.get("node_ip"),
                                              died={"hostname": where.get("hostname"), "pid": where.get("pid")})
            except Exception as err:  # never fail the controller over it
                logger.warning("raytrain: a dead worker's failure was not recorded (%s)", err)

    return RecordDeaths()
