"""raytrain.Session on a Ray Train worker (`RayTrainSession`), and `worker_entry`, the function every Ray Train
worker runs: it rebuilds the run config, makes the session and calls the config's loop (a Session loop or a Ray
Train function) with it, ending as the loop's Ending says."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

from raytrain.checkpoint import checkpoints
from raytrain.lifecycle.endings import REACTIONS, AttemptEnded, Ending
from raytrain.parallel import collectives, sharding
from raytrain.rundir import storage, workerlogs
from raytrain.rundir.runcontrol import UNFENCED, WorkerControl
from raytrain.spec import components, loops
from raytrain.spec.config import config_from_dict
from raytrain.spec.sections import RunConfig
from raytrain.worker import elastic, raytrain_function, replicas
from raytrain.worker.telemetry import RunTelemetry

if TYPE_CHECKING:
    import torch
    from torch import nn

from raytrain.platform.rayinternals import quiet_report_logs
from raytrain.spec import workdir
from raytrain.worker.drain import NodeDraining, node_draining
from raytrain.worker.session import Session, torch_threads


class RayTrainSession(Session):
    def __init__(self, config: RunConfig, run_dir: Path, cpus_per_worker: float, lease_token: Optional[int] = None):
        import ray.train
        import ray.train.torch
        import torch

        context = ray.train.get_context()
        self.rank = context.get_world_rank()
        self.world_size = context.get_world_size()
        self.local_rank = context.get_local_rank()
        # This worker's commits stop once its attempt's lease is taken over.
        super().__init__(config, run_dir, WorkerControl(run_dir, lease_token) if lease_token else UNFENCED)
        self.local_batch_size = config.batch_share(self.world_size)  # the global batch is fixed (elastic runs too)
        self._device = ray.train.torch.get_device()
        torch.set_num_threads(torch_threads(config, cpus_per_worker))
        # torchft's replicas start from the same weights without a copy (raytrain.worker.replicas: init_sync off)
        torch.manual_seed(config.train.seed + (0 if config.scaling.torchft else self.rank))
        if config.scaling.torchft and not loops.is_ray_train_loop(config):  # a function runs its own Manager
            self.replicas = replicas.Replicas(self.rank, self._device, replicas.replica_hostname(),
                                              on_event=self._replica_event)
        self.telemetry = RunTelemetry(config.run.name, self.rank, self.local_batch_size, config.train.epochs,
                                      self.world_size)

        self._node_draining = node_draining  # a deleted pod's preStop hook drains its node: see raytrain.worker.drain
        if config.scaling.elastic and lease_token:
            self._resize_requested = functools.partial(elastic.pending, self.run_dir, lease_token, self.world_size)
        self._telemetry_linger = False  # a joined cluster, whose Prometheus scrapes the workers' metrics

    def _started(self, start_epoch: int) -> None:
        self.telemetry.started(self.run_dir, start_epoch)

    def _ft_group_barrier(self) -> None:
        import ray.train.collective

        ray.train.collective.barrier()

    def _replica_event(self, event: str, **fields) -> None:
        """A change in the torchft quorum's size, recorded by the quorum's writer (raytrain.worker.replicas)."""
        if self.replicas is not None and self.replicas.writer:
            self.records.append_event(event, rank=self.rank, attempt=self.records.token, **fields)

    def _epoch_done(self, row: dict, local_samples: int, local_seconds: float) -> None:
        self.telemetry.epoch_end(row, local_samples, local_seconds)
        if self.replicas is not None:
            # Ray Train's report is a barrier over every worker, which a replica being replaced would hold; the
            # row is in the run's records and metrics already
            return
        import ray.train

        ray.train.report(row)  # every worker: Ray Train's (and Ray Tune's) view of the epoch; no checkpoint

    def _checkpointed(self) -> None:
        self.telemetry.checkpointed()

    def finished(self) -> None:
        """The loop returned: on a cluster, rank 0 lingers until the last values were exported (telemetry)."""
        if self.replicas is not None:
            self.replicas.shutdown()
        if self._telemetry_linger:
            self.telemetry.linger()

    @property
    def device(self) -> "torch.device":
        return self._device

    def prepare_model(self, model: "nn.Module") -> "nn.Module":
        import ray.train.torch

        if self.config.scaling.strategy == "fsdp":
            return sharding.fully_shard_model(model, self.config, self.device, self.world_size)
        if self.replicas is not None:  # no DDP: the replicas share gradients through torchft (sync_gradients)
            return sharding.wrap_activation_checkpointing(model, self.config).to(self.device)
        return ray.train.torch.prepare_model(sharding.wrap_activation_checkpointing(model, self.config))

    def _load_datasets(self) -> dict:
        if self.config.data is None or self.config.data.loader != "ray":
            return super()._load_datasets()
        import ray.train

        shards = {"train": ray.train.get_dataset_shard("train")}
        try:
            shards["val"] = ray.train.get_dataset_shard("val")
        except KeyError:  # the dataset has no validation split
            pass
        return shards

    def all_reduce(self, values: list[float], op: str = "sum") -> list[float]:
        if self.replicas is not None:
            reduced, complete = self.replicas.all_reduce(values, op)
            self._ft_partial = self._ft_partial or not complete
            return reduced
        return collectives.all_reduce(values, op, self.device)

    def _load_newest(self, warn: Callable[[str], None]) -> Optional[checkpoints.Loaded]:
        """Rank 0 reads the checkpoint once (its hash checked on the bytes read) and hands it to the others: N
        workers do not read it N times."""
        if not collectives.in_group():
            return super()._load_newest(warn)
        warnings: list[str] = []
        mine = super()._load_newest(warnings.append) if self.is_rank_zero else None
        loaded, warnings = collectives.broadcast_from_rank0((mine, warnings), self.rank)
        for message in warnings:
            warn(message)
        return loaded


def worker_entry(loop_config: dict) -> None:
    """Ray Train's train_loop_per_worker: {"config": resolved run config, "run_dir", "cpus_per_worker",
    "working_dir", "lease_token", "telemetry_linger"}. Builds the session, starts it and calls the config's loop."""

    quiet_report_logs()
    if loop_config.get("working_dir"):  # the same import path as the driver, where the directory is reachable
        try:
            workdir.use(loop_config["working_dir"])
        except workdir.WorkingDirError:
            pass  # another node: the code came with Ray's runtime env (working_dir) instead
    ray_train_function = loops.TRAIN_LOOP_CONFIG in (loop_config["config"].get("loop") or {})
    if ray_train_function:  # before the function's module is imported: `from ray.train import report` gets ours
        raytrain_function.install()
    cfg = config_from_dict(loop_config["config"])
    session = RayTrainSession(cfg, storage.as_path(loop_config["run_dir"]), loop_config["cpus_per_worker"],
                              loop_config.get("lease_token"))
    session._telemetry_linger = bool(loop_config.get("telemetry_linger"))
    run_worker(cfg, session, ray_train_function, loop_config.get("lease_token"), node_ip=_node_ip())


def run_worker(cfg: RunConfig, session: Session, ray_train_function: bool, attempt: Optional[int],
               node_ip: Optional[str] = None) -> None:
    """One worker's loop with its records in the run directory (raytrain.rundir.workerlogs): what it prints copied
    to worker-logs/attempt-<N>-rank<R>.log (rank 0's followed onto the driver's console), and its first failure
    recorded beside it before the exception reaches Ray Train (then its log is flushed), so that `raytrain why`
    names the rank that failed first after the pods are gone."""
    output = workerlogs.RankOutput(session.run_dir, attempt, session.rank).start()

    def failed(error: BaseException) -> None:
        workerlogs.record_failure(session.run_dir, attempt, session.rank, session.world_size, error,
                                  node_ip=node_ip, last_lines=output.last_lines())

    try:
        _run_loop(cfg, session, ray_train_function, failed)
    except (AttemptEnded, NodeDraining):  # an ending, not a failure (a failed one was recorded by _run_loop)
        raise
    except BaseException as error:
        if isinstance(error, Exception) or (isinstance(error, SystemExit) and error.code not in (0, None)):
            failed(error)
        raise
    finally:
        output.stop()


def _node_ip() -> Optional[str]:
    try:
        import ray.util

        return ray.util.get_node_ip_address()
    except Exception:  # noqa: BLE001 - only a field of a failure record
        return None


def _run_loop(cfg: RunConfig, session: Session, ray_train_function: bool,
              failed: Callable[[BaseException], None]) -> None:
    session.start()
    try:
        if ray_train_function:
            raytrain_function.run(cfg, session)
        else:
            try:
                components.instantiate(cfg.loop, session)
            except Exception:
                session.announce_failed_start()
                raise
    except AttemptEnded as ended:
        reaction = REACTIONS[ended.ending]  # what each ending does: raytrain.lifecycle.endings
        if ended.ending is Ending.FAILED:  # a diverged loss: the rank's failure, though no exception of the loop's
            failed(ended)
        if reaction.commits:
            session.wait_for_checkpoint()
        if reaction.answers_resize:
            session.answer_resize(ended.ending.value)
        if reaction.group == "restarts":
            # A worker failure for Ray Train, which starts a new group on the nodes left; it resumes from the
            # checkpoint just taken.
            raise NodeDraining(ended.reason) from None
        if reaction.group == "holds":
            elastic.hold()  # until Ray Train's controller replaces the group (raytrain.worker.elastic)
        return  # checkpointed (unless the lease was lost); the driver writes the result
    session.wait_for_checkpoint()
    session.answer_resize(elastic.FINISHED)
    session.trained()
    session.finished()
