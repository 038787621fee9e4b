"""The built-in training loop (`loop._component_: raytrain.loop.train_loop`, the default), written against the same
public `raytrain.Session` API a user's own loop gets: it builds the config's model, optimizer and loss, restores,
trains an epoch, evaluates, and reports. It reads no argv and no environment. torch is imported when it runs.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Optional

from raytrain.config import RunConfig
from raytrain.session import Session

if TYPE_CHECKING:
    import torch
    from torch import nn


def train_loop(session: Session) -> None:
    """Runs on every worker (or once, locally): one metrics row per epoch, checkpoints as configured."""
    import torch

    cfg = session.config
    model = session.prepare_model(session.build_model())
    optimizer = build_optimizer(cfg, model)
    # This worker's running sums of the epoch: a mid-epoch checkpoint saves them (rank 0's), so that the epoch's one
    # row counts the steps trained before a resume too.
    running = EpochStats()
    start_epoch = session.restore(model, optimizer, epoch_stats=running)
    loss_fn = session.loss_fn
    amp_dtype = autocast_dtype(cfg, session.device)
    scaler = torch.amp.GradScaler("cuda") if amp_dtype == torch.float16 else None
    for epoch in range(start_epoch, cfg.train.epochs + 1):
        began = time.perf_counter()
        train_epoch(model, session.batches("train", epoch), optimizer, loss_fn, grad_clip=cfg.train.grad_clip,
                    amp_dtype=amp_dtype, scaler=scaler, stats=running)
        seconds = time.perf_counter() - began
        train = EpochStats(*session.all_reduce(running.as_list()))
        running.reset()  # before report: an epoch-end checkpoint starts the next epoch from zero
        val_batches = session.batches("val")
        val = None
        if val_batches is not None:
            val = evaluate(model, val_batches, loss_fn, cfg.classification, amp_dtype)
            val = EpochStats(*session.all_reduce(val.as_list()))
        row = metrics_row(train, val, seconds, cfg.classification)
        row["peak_rss_mb"] = peak_rss_mb(session)  # memory stays bounded while data streams through
        session.report(epoch, row, model=model, optimizer=optimizer)


# ----------------------------------------------------------------------------------------------------------
# pieces of the loop


def build_optimizer(cfg: RunConfig, model: "nn.Module") -> "torch.optim.Optimizer":
    import torch

    t = cfg.train
    if t.optimizer == "sgd":
        return torch.optim.SGD(model.parameters(), lr=t.lr, momentum=t.momentum, weight_decay=t.weight_decay)
    optimizer_cls = torch.optim.Adam if t.optimizer == "adam" else torch.optim.AdamW
    return optimizer_cls(model.parameters(), lr=t.lr, weight_decay=t.weight_decay)


def autocast_dtype(cfg: RunConfig, device: "torch.device") -> Optional["torch.dtype"]:
    import torch

    if device.type != "cuda" or cfg.train.mixed_precision == "off":
        return None
    return torch.float16 if cfg.train.mixed_precision == "fp16" else torch.bfloat16


@dataclass
class EpochStats:
    loss_sum: float = 0.0
    correct: float = 0.0
    samples: float = 0.0

    def as_list(self) -> list[float]:
        return [self.loss_sum, self.correct, self.samples]

    def reset(self) -> None:
        self.loss_sum = self.correct = self.samples = 0.0

    # A stateful object for session.restore()/report(): saved in checkpoints, mid-epoch ones included.
    def state_dict(self) -> dict:
        return {"loss_sum": self.loss_sum, "correct": self.correct, "samples": self.samples}

    def load_state_dict(self, state: dict) -> None:
        self.loss_sum, self.correct, self.samples = state["loss_sum"], state["correct"], state["samples"]


def train_epoch(
    model: "nn.Module",
    batches: Iterable[tuple["torch.Tensor", "torch.Tensor"]],
    optimizer: "torch.optim.Optimizer",
    loss_fn: Callable,
    *,
    max_steps: int = 0,
    grad_clip: float = 0.0,
    amp_dtype: Optional["torch.dtype"] = None,
    scaler: Optional["torch.amp.GradScaler"] = None,
    stats: Optional[EpochStats] = None,
) -> EpochStats:
    """One pass over `batches`, summed into `stats` (a new EpochStats if None), which it returns."""
    from torch import nn

    model.train()
    stats = stats if stats is not None else EpochStats()
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
        if max_steps and step >= max_steps:
            break
    return stats


def evaluate(model: "nn.Module", batches: Iterable, loss_fn: Callable, classification: bool,
             amp_dtype: Optional["torch.dtype"] = None) -> EpochStats:
    import torch

    model.eval()
    stats = EpochStats()
    with torch.no_grad():
        for x, y in batches:
            with _autocast(x.device, amp_dtype):
                out = model(x)
            # The loss as configured (a mean over the batch), weighted by the batch: any loss works here.
            stats.loss_sum += float(loss_fn(out.float(), y)) * len(y)
            stats.samples += len(y)
            if classification:
                stats.correct += (out.argmax(dim=1) == y).sum().item()
    return stats


def _autocast(device: "torch.device", dtype: Optional["torch.dtype"]):
    import torch

    return torch.autocast(device.type, dtype=dtype) if dtype is not None else contextlib.nullcontext()


def metrics_row(train: EpochStats, val: Optional[EpochStats], seconds: float, classification: bool) -> dict:
    row = {
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
    parts = [f"epoch {row['epoch']}/{epochs}"]
    for key in ("train_loss", "val_loss", "val_accuracy"):
        if isinstance(row.get(key), (int, float)):
            parts.append(f"{key} {row[key]:.4f}")
    shown = {"epoch", "train_loss", "val_loss", "val_accuracy", "samples_per_s", "peak_rss_mb", "samples", "epoch_s",
             "resumed_from_epoch", "attempt"}
    for key, value in row.items():  # a custom loop's own metrics
        if key not in shown and isinstance(value, (int, float)) and not isinstance(value, bool):
            parts.append(f"{key} {value:.4g}")
    if isinstance(row.get("samples_per_s"), (int, float)):
        parts.append(f"{row['samples_per_s']:.0f} samples/s")
    if "peak_rss_mb" in row:
        parts.append(f"peak worker RSS {row['peak_rss_mb']:.0f} MiB")
    return "  ".join(parts)


def peak_rss_mb(session: Session) -> float:
    """The highest peak resident memory of any worker process so far, in MiB (the max over the workers)."""
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux reports KiB
    return round(session.all_reduce([peak], op="max")[0], 1)
