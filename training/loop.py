"""The code that runs on every worker: train_loop_per_worker(config), plus the epoch and evaluation steps that
the plain-PyTorch `raytrain local` loop shares with it.

The worker builds its own model, optimizer and data from the resolved run config it is given; it reads no argv
and no environment. Rank 0 alone writes files (metrics rows, events, checkpoints).
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator, Optional

import torch
import torch.distributed as dist
from torch import nn

from raytrain import checkpoints, runs
from raytrain.config import RunConfig, config_from_dict
from raytrain.data import DATASETS, DatasetSpec, data_context
from raytrain.models import build_model
from raytrain.telemetry import RunTelemetry

# ----------------------------------------------------------------------------------------------------------
# pieces shared with the local loop


def build_optimizer(cfg: RunConfig, model: nn.Module) -> torch.optim.Optimizer:
    t = cfg.train
    if t.optimizer == "sgd":
        return torch.optim.SGD(model.parameters(), lr=t.lr, momentum=t.momentum, weight_decay=t.weight_decay)
    optimizer_cls = torch.optim.Adam if t.optimizer == "adam" else torch.optim.AdamW
    return optimizer_cls(model.parameters(), lr=t.lr, weight_decay=t.weight_decay)


def loss_function(task: str) -> Callable:
    return nn.functional.mse_loss if task == "regression" else nn.functional.cross_entropy


def autocast_dtype(cfg: RunConfig, device: torch.device) -> Optional[torch.dtype]:
    if device.type != "cuda" or cfg.train.mixed_precision == "off":
        return None
    return torch.float16 if cfg.train.mixed_precision == "fp16" else torch.bfloat16


def torch_threads(cfg: RunConfig, cpus_per_worker: float) -> int:
    return cfg.train.torch_threads or max(1, int(cpus_per_worker))


@dataclass
class EpochStats:
    loss_sum: float = 0.0
    correct: float = 0.0
    samples: float = 0.0

    def reduced(self, device: torch.device) -> "EpochStats":
        """Summed over all workers (a no-op outside a process group)."""
        if not (dist.is_available() and dist.is_initialized()):
            return self
        totals = torch.tensor([self.loss_sum, self.correct, self.samples], dtype=torch.float64, device=device)
        dist.all_reduce(totals)
        return EpochStats(*totals.tolist())


def train_epoch(
    model: nn.Module,
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    optimizer: torch.optim.Optimizer,
    loss_fn: Callable,
    *,
    max_steps: int = 0,
    grad_clip: float = 0.0,
    amp_dtype: Optional[torch.dtype] = None,
    scaler: Optional["torch.amp.GradScaler"] = None,
    on_step: Optional[Callable[[int], None]] = None,
) -> EpochStats:
    model.train()
    stats = EpochStats()
    for step, (x, y) in enumerate(batches, start=1):
        optimizer.zero_grad(set_to_none=True)
        with _autocast(x.device, amp_dtype):
            loss = loss_fn(model(x), y)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
        else:
            loss.backward()
        if grad_clip > 0:
            nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        stats.loss_sum += loss.item() * len(y)
        stats.samples += len(y)
        if on_step is not None:
            on_step(step)
        if max_steps and step >= max_steps:
            break
    return stats


@torch.no_grad()
def evaluate(model: nn.Module, batches: Iterable, loss_fn: Callable, classification: bool,
             amp_dtype: Optional[torch.dtype] = None) -> EpochStats:
    model.eval()
    stats = EpochStats()
    for x, y in batches:
        with _autocast(x.device, amp_dtype):
            out = model(x)
        stats.loss_sum += loss_fn(out.float(), y, reduction="sum").item()
        stats.samples += len(y)
        if classification:
            stats.correct += (out.argmax(dim=1) == y).sum().item()
    return stats


def _autocast(device: torch.device, dtype: Optional[torch.dtype]):
    return torch.autocast(device.type, dtype=dtype) if dtype is not None else contextlib.nullcontext()


def metrics_row(epoch: int, train: EpochStats, val: Optional[EpochStats], seconds: float, classification: bool) -> dict:
    row = {
        "epoch": epoch,
        "train_loss": train.loss_sum / max(train.samples, 1),
        "samples": int(train.samples),
        "samples_per_s": train.samples / max(seconds, 1e-9),
        "epoch_s": seconds,
    }
    if val is not None and val.samples:
        row["val_loss"] = val.loss_sum / val.samples
        if classification:
            row["val_accuracy"] = val.correct / val.samples
    return row


def format_row(row: dict, epochs: int) -> str:
    parts = [f"epoch {row['epoch']}/{epochs}", f"train_loss {row['train_loss']:.4f}"]
    for key in ("val_loss", "val_accuracy"):
        if key in row:
            parts.append(f"{key} {row[key]:.4f}")
    parts.append(f"{row['samples_per_s']:.0f} samples/s")
    if "peak_rss_mb" in row:
        parts.append(f"peak worker RSS {row['peak_rss_mb']:.0f} MiB")
    return "  ".join(parts)


def peak_rss_mb(device: torch.device) -> float:
    """The highest peak resident memory of any worker process so far, in MiB (the max over a process group)."""
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux reports KiB
    if dist.is_available() and dist.is_initialized():
        value = torch.tensor([peak], dtype=torch.float64, device=device)
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
        peak = value.item()
    return round(peak, 1)


# ----------------------------------------------------------------------------------------------------------
# data on a worker


def _xy(spec: DatasetSpec, batch, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    if isinstance(batch, dict):  # Ray Data: columns x and y
        x, y = spec.ray_batch(batch) if spec.ray_batch else (batch["x"], batch["y"])
    else:
        x, y = batch
    return x.to(device, non_blocking=True), y.to(device, non_blocking=True)


class WorkerData:
    """Train/val batches for this worker, from Ray Data shards or a map-style dataset."""

    def __init__(self, cfg: RunConfig, device: torch.device):
        import ray.train
        import ray.train.torch

        self.spec = DATASETS[cfg.data.name]
        self.device = device
        self.batch_size = cfg.per_worker_batch_size
        if cfg.data.loader == "ray":
            self.train_shard = ray.train.get_dataset_shard("train")
            try:
                self.val_shard = ray.train.get_dataset_shard("val")
            except KeyError:  # the dataset has no validation split
                self.val_shard = None
            self.train_loader = self.val_loader = None
        else:
            from torch.utils.data import DataLoader

            train_ds, val_ds = self.spec.torch_datasets(cfg.data.params, data_context(cfg))
            self.train_loader = ray.train.torch.prepare_data_loader(
                DataLoader(train_ds, batch_size=self.batch_size, shuffle=True), move_to_device=False
            )
            self.val_loader = (
                ray.train.torch.prepare_data_loader(DataLoader(val_ds, batch_size=self.batch_size), move_to_device=False)
                if val_ds is not None
                else None
            )

    def train_batches(self, epoch: int) -> Iterator:
        if self.train_loader is None:
            source = self.train_shard.iter_torch_batches(batch_size=self.batch_size, local_shuffle_buffer_size=None)
        else:
            sampler = getattr(self.train_loader, "sampler", None)
            if hasattr(sampler, "set_epoch"):
                sampler.set_epoch(epoch)  # a different shuffle each epoch, the same on every worker
            source = self.train_loader
        return (_xy(self.spec, b, self.device) for b in source)

    def val_batches(self) -> Optional[Iterator]:
        if self.train_loader is None:
            if self.val_shard is None:
                return None
            source = self.val_shard.iter_torch_batches(batch_size=self.batch_size)
        elif self.val_loader is None:
            return None
        else:
            source = self.val_loader
        return (_xy(self.spec, b, self.device) for b in source)


# ----------------------------------------------------------------------------------------------------------
# the per-worker loop


def train_loop_per_worker(loop_config: dict) -> None:
    """Runs on every Ray Train worker. loop_config: {"config": resolved run config, "run_dir": str,
    "cpus_per_worker": float}."""
    import ray.train
    import ray.train.torch

    quiet_report_logs()
    cfg = config_from_dict(loop_config["config"])
    run_dir = Path(loop_config["run_dir"])
    context = ray.train.get_context()
    is_rank_zero = context.get_world_rank() == 0
    device = ray.train.torch.get_device()
    torch.set_num_threads(torch_threads(cfg, loop_config["cpus_per_worker"]))
    torch.manual_seed(cfg.train.seed + context.get_world_rank())

    model = ray.train.torch.prepare_model(build_model(cfg.model))
    optimizer = build_optimizer(cfg, model)
    start_epoch, resumed_from = restore(model, optimizer, run_dir, is_rank_zero)
    if is_rank_zero:
        if resumed_from is not None:
            runs.truncate_metrics(run_dir, resumed_from)
        runs.append_event(run_dir, "start", start_epoch=start_epoch, resumed_from_epoch=resumed_from,
                          world_size=context.get_world_size())

    spec = DATASETS[cfg.data.name]
    classification = spec.task == "classification"
    loss_fn = loss_function(spec.task)
    amp_dtype = autocast_dtype(cfg, device)
    scaler = torch.amp.GradScaler("cuda") if amp_dtype == torch.float16 else None
    data = WorkerData(cfg, device)
    telemetry = RunTelemetry(cfg.run.name, context.get_world_rank(), cfg.per_worker_batch_size)  # [telemetry]
    telemetry.started(run_dir, start_epoch)  # [telemetry]
    # Rank 0 records this worker group's first optimizer step (after a start or a resume): the time from
    # submission, or from a failure, to training again is read off events.jsonl (raytrain bench p3, p4).
    def record_first_step(step: int) -> None:
        if step == 1:
            runs.append_event(run_dir, "first_step", epoch=start_epoch)

    for epoch in range(start_epoch, cfg.train.epochs + 1):
        began = time.perf_counter()
        local_stats = train_epoch(
            model, data.train_batches(epoch), optimizer, loss_fn,
            max_steps=cfg.train.max_steps_per_epoch, grad_clip=cfg.train.grad_clip,
            amp_dtype=amp_dtype, scaler=scaler,
            on_step=record_first_step if is_rank_zero and epoch == start_epoch else None,
        )
        train_stats = local_stats.reduced(device)
        seconds = time.perf_counter() - began
        val_batches = data.val_batches()
        val_stats = evaluate(model, val_batches, loss_fn, classification, amp_dtype).reduced(device) if val_batches else None
        row = metrics_row(epoch, train_stats, val_stats, seconds, classification)
        row["resumed_from_epoch"] = resumed_from
        row["peak_rss_mb"] = peak_rss_mb(device)  # memory stays bounded while data streams through
        if is_rank_zero:
            # The row goes first: if the checkpoint below never lands, resume drops this row and retrains.
            runs.append_metrics(run_dir, row)
        telemetry.epoch_end(row, local_stats.samples, seconds)  # [telemetry]
        # Ray Train V2 hands a report to its controller through a one-slot queue that is drained every couple of
        # seconds, so reporting every epoch would cost more than a small epoch. Report at checkpoints only; the
        # per-epoch rows reach the user through metrics.jsonl.
        if epoch % cfg.run.checkpoint_every == 0 or epoch == cfg.train.epochs:
            report_checkpoint(model, optimizer, epoch, cfg, row, is_rank_zero)
            telemetry.checkpointed()  # [telemetry]


def report_checkpoint(model: nn.Module, optimizer: torch.optim.Optimizer, epoch: int, cfg: RunConfig, row: dict,
                      is_rank_zero: bool) -> None:
    """Every worker calls this at the same epochs (ray.train.report is a barrier); rank 0 writes the files."""
    import ray.train

    with tempfile.TemporaryDirectory(prefix="raytrain-ckpt-") as tmp:
        checkpoint = None
        if is_rank_zero:
            checkpoints.write_checkpoint(
                Path(tmp), model_state=_unwrap(model).state_dict(), optimizer_state=optimizer.state_dict(),
                epoch=epoch, config=cfg.to_dict(),
            )
            checkpoint = ray.train.Checkpoint.from_directory(tmp)
        ray.train.report(row, checkpoint=checkpoint, checkpoint_dir_name=checkpoints.checkpoint_dir_name(epoch))


def quiet_report_logs() -> None:
    """Ray Train logs every report at INFO on each worker (from a logger named after its module file); the
    per-epoch lines that rank 0 writes already say the same, so keep the user's console readable."""
    try:
        from ray.train.v2._internal.execution import context as train_context
    except ImportError:  # a Ray version that moved it: the lines are noise, not a failure
        return
    logging.getLogger(train_context.__file__).setLevel(logging.WARNING)


def _unwrap(model: nn.Module) -> nn.Module:
    return model.module if hasattr(model, "module") else model


def restore(model: nn.Module, optimizer: torch.optim.Optimizer, run_dir: Path, is_rank_zero: bool) -> tuple[int, Optional[int]]:
    """Load the newest readable checkpoint of the run directory (Ray Train's latest among them).
    Returns (first epoch to train, epoch restored or None)."""
    import ray.train

    latest = ray.train.get_checkpoint()
    ray_latest = [Path(latest.path)] if latest is not None else []
    # The driver prints these events (worker output is not forwarded to it).
    warn = (lambda msg: runs.append_event(run_dir, "warning", message=msg)) if is_rank_zero else (lambda msg: None)
    found = checkpoints.load_newest(checkpoints.candidates(run_dir, ray_latest), warn)
    if found is None:
        return 1, None
    path, state = found
    _unwrap(model).load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    if is_rank_zero:
        runs.append_event(run_dir, "restored", checkpoint=path.name, epoch=int(state["epoch"]))
    return int(state["epoch"]) + 1, int(state["epoch"])


