"""What a run's scaling settings cannot go with, each refused when the config loads (before Ray starts) with the key
and the fix: an elastic worker count (Ray Train's elasticity, raytrain.worker.elastic) and torchft's per-step fault
tolerance (raytrain.worker.replicas). config.py calls them from its rules across keys."""

from __future__ import annotations

from typing import Callable

from raytrain.spec.sections import RunConfig


def check_torchft(cfg: RunConfig, fail: Callable) -> None:
    """What scaling.fault_tolerance torchft cannot go with (raytrain.worker.replicas): refused here, before Ray starts."""
    s, key = cfg.scaling, "scaling.fault_tolerance"
    if s.elastic:
        fail(key, f"torchft with an elastic scaling.num_workers ({s.describe_workers()}) is not supported: Ray Train "
                  f"replaces a lost replica group only while the worker count stays the same", "give scaling.num_workers "
                  f"one count (e.g. {s.max_workers}), or use fault_tolerance: restart for an elastic run")
    if s.strategy != "ddp":
        fail(key, f"torchft with scaling.strategy {s.strategy} is not supported: every worker is a whole replica of "
                  f"the model, healed from a peer's full state", "use scaling.strategy: ddp, or fault_tolerance: restart")
    if cfg.data is not None and cfg.data.loader == "ray":
        fail(key, "torchft with data.loader ray (Ray Data) is not supported: a replacement's shard must start at the "
                  "step its peers are at, which raytrain positions only in its own DataLoader", "set data.loader: "
                  "torch (or auto), or fault_tolerance: restart")
    if cfg.train.mixed_precision == "fp16":
        fail(key, "torchft with train.mixed_precision fp16 is not supported: its gradient scaler checks each replica's "
                  "own gradients for overflow before they are shared", "use bf16 (or auto), or fault_tolerance: restart")
    if cfg.checkpointer == "sharded":
        fail(key, "torchft with run.checkpointer sharded is not supported: a replica that is being replaced would "
                  "hold back every worker's shard of a checkpoint", "set run.checkpointer: file (or auto), or "
                  "fault_tolerance: restart")


def check_elastic(cfg: RunConfig, fail: Callable) -> None:
    """What Ray Train's elasticity cannot do as raytrain sizes it (ray/train/v2/.../scaling_policy/elastic.py)."""
    s = cfg.scaling
    # Ray's AutoscalingCoordinator rounds each worker's request up to whole units and counts workers per rounded
    # bundle: a fraction of a GPU, or 1.5 CPUs, would count fewer workers than fit, and a run raytrain sized as
    # fitting would wait forever below min.
    if s.use_gpu and s.gpus_per_worker != int(s.gpus_per_worker):
        fail("scaling.gpus_per_worker", f"{s.gpus_per_worker:g} GPU per worker: an elastic run's workers count in "
             f"whole GPUs (Ray Train's elastic policy rounds each up)", "use whole GPUs per worker, or a fixed "
             "scaling.num_workers")
    if s.cpus_per_worker != "auto" and float(s.cpus_per_worker) > 1 and float(s.cpus_per_worker) % 1:
        fail("scaling.cpus_per_worker", f"{s.cpus_per_worker:g} CPUs per worker: above one CPU, an elastic run's "
             f"workers count in whole CPUs (Ray Train's elastic policy rounds each up)", "use a whole number of "
             "CPUs (or a share of 1 or less), or a fixed scaling.num_workers")
    if cfg.data is not None and cfg.data.loader == "ray":
        # Ray Data's tasks need CPUs beside the workers; raytrain keeps one free only for min workers, and a grow to
        # max would take it.
        fail("data.loader", "ray (Ray Data) with an elastic scaling.num_workers is not supported: the CPU its tasks "
             "need is not kept once the run grows", "use data.loader: torch, or a fixed scaling.num_workers")
