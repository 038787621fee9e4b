"""The built-in training loop (`loop._component_: raytrain.loop.train_loop`, the default), written against the same
public `raytrain.Session` API a user's own loop gets: it builds the config's model, optimizer, LR scheduler and
loss, restores, trains an epoch (with gradient accumulation), evaluates, and reports. It reads no argv and no
environment. torch is imported when it runs.

The loss is summed on the device and read once per epoch (and once per `run.log_every_steps` steps when asked):
no host sync per step. What a resume may change is declared on train_loop (raytrain.checkpoint.resume).

May import: errors, rundir, spec, worker
"""

from __future__ import annotations

import contextlib
import resource
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Optional

from raytrain.rundir import console, goodput
from raytrain.spec import components
from raytrain.spec.sections import RunConfig
from raytrain.worker.session import Session

if TYPE_CHECKING:
    import torch
    from torch import nn


def train_loop(session: Session) -> None:
    """Runs on every worker (or once, locally): one metrics row per epoch, checkpoints as configured."""
    import torch

    cfg = session.config
    model = session.prepare_model(session.build_model())
    optimizer = build_optimizer(cfg, model)
    scheduler = build_scheduler(cfg, optimizer)
    # This worker's running sums of the epoch: a mid-epoch checkpoint saves them (rank 0's), so that the epoch's one
    # row counts the steps trained before a resume too (rescaled when an elastic run resumes on another count).
    running = EpochStats(workers=session.world_size)
    stateful = {"epoch_stats": running, **({"scheduler": scheduler} if scheduler is not None else {})}
    start_epoch = session.restore(model, optimizer, **stateful)
    loss_fn = session.loss_fn
    amp_dtype = autocast_dtype(cfg, session.device)
    scaler = torch.amp.GradScaler("cuda") if amp_dtype == torch.float16 else None
    per_step = scheduler if cfg.scheduler_interval == "step" else None
    for epoch in range(start_epoch, cfg.train.epochs + 1):
        began = time.perf_counter()
        carried = float(running.samples)  # restored from a mid-epoch checkpoint: trained by an earlier attempt
        log = None
        if cfg.run.log_every_steps:
            # Steps counted in the epoch, after those an earlier group trained (a resume mid-epoch)
            def log(step: int, loss: "torch.Tensor", epoch: int = epoch,
                    before: int = session.steps_before(epoch)) -> None:
                if (before + step) % cfg.run.log_every_steps == 0:
                    session.log_step(epoch, before + step, {"train_loss": loss,
                                                            "lr": optimizer.param_groups[0]["lr"]})
        train_epoch(model, session.batches("train", epoch), optimizer, loss_fn, grad_clip=cfg.train.grad_clip,
                    amp_dtype=amp_dtype, scaler=scaler, stats=running, accum_steps=cfg.train.grad_accum_steps,
                    scheduler=per_step, on_step=log, sync=session.sync_gradients)
        if scheduler is not None and per_step is None:
            scheduler.step()
        seconds = time.perf_counter() - began
        *sums, carried = session.all_reduce([*running.as_list(), carried])
        train = EpochStats(*sums)
        running.reset()  # before report: an epoch-end checkpoint starts the next epoch from zero
        val_batches = session.batches("val")
        val = None
        if val_batches is not None:
            val = evaluate(model, val_batches, loss_fn, cfg.classification, amp_dtype)
            val = EpochStats(*session.all_reduce(val.as_list()))
        row = metrics_row(train, val, seconds, cfg.classification, trained=train.samples - carried)
        row["peak_rss_mb"] = peak_rss_mb(session)  # memory stays bounded while data streams through
        if scheduler is not None:
            row["lr"] = optimizer.param_groups[0]["lr"]
        session.report(epoch, row, model=model, optimizer=optimizer, **stateful)


# What the built-in loop needs from the run config, and what a resume may change (raytrain.checkpoint.resume): the model's
# shape and the optimizer's and scheduler's kind are fixed for the life of a run; the optimizer's settings are
# set into the restored optimizer when the config changes them.
train_loop.requires = ("model", "data")
train_loop.fixed_on_resume = ("model", "train.optimizer", "train.optimizer._component_", "train.scheduler.*")
train_loop.applied_on_resume = ("train.lr", "train.weight_decay", "train.momentum", "train.optimizer.*")


# ----------------------------------------------------------------------------------------------------------
# pieces of the loop


def build_optimizer(cfg: RunConfig, model: "nn.Module") -> "torch.optim.Optimizer":
    """train.optimizer: a component (its class with its checked keyword arguments), or a built-in name with
    train.lr, weight_decay and momentum."""
    import torch

    if cfg.optimizer is not None:
        return components.instantiate(cfg.optimizer, model.parameters())
    t = cfg.train
    if t.optimizer == "sgd":
        return torch.optim.SGD(model.parameters(), lr=t.lr, momentum=t.momentum, weight_decay=t.weight_decay)
    optimizer_cls = torch.optim.Adam if t.optimizer == "adam" else torch.optim.AdamW
    return optimizer_cls(model.parameters(), lr=t.lr, weight_decay=t.weight_decay)


def build_scheduler(cfg: RunConfig, optimizer: "torch.optim.Optimizer") -> Optional[Any]:
    """train.scheduler's component around the optimizer, or None."""

    return components.instantiate(cfg.scheduler, optimizer) if cfg.scheduler is not None else None


def autocast_dtype(cfg: RunConfig, device: "torch.device") -> Optional["torch.dtype"]:
    import torch

    if device.type != "cuda" or cfg.train.mixed_precision == "off":
        return None
    return torch.float16 if cfg.train.mixed_precision == "fp16" else torch.bfloat16


@dataclass
class EpochStats:
    # loss_sum may be a tensor on the device while an epoch runs (summed without a host sync); read as a float.
    loss_sum: Any = 0.0
    correct: float = 0.0
    samples: float = 0.0
    workers: int = 1  # how many workers keep sums like these (the run's world size): not a sum itself

    def as_list(self) -> list[float]:
        return [float(self.loss_sum), float(self.correct), float(self.samples)]

    def reset(self) -> None:
        self.loss_sum = self.correct = self.samples = 0.0

    # A stateful object for session.restore()/report(): saved in checkpoints, mid-epoch ones included.
    def state_dict(self) -> dict:
        return {"loss_sum": float(self.loss_sum), "correct": float(self.correct), "samples": float(self.samples),
                "workers": self.workers}

    def load_state_dict(self, state: dict) -> None:
        # Rank 0's sums, loaded on every worker: this worker's share of the epoch so far is rank 0's times the
        # writer's count over ours (every rank trains as many samples a step), so that an elastic run resumed on
        # another count still adds up to the epoch's samples.
        scale = float(state.get("workers") or self.workers) / self.workers
        self.loss_sum, self.correct, self.samples = (state["loss_sum"] * scale, state["correct"] * scale,
                                                     state["samples"] * scale)


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
    accum_steps: int = 1,
    scheduler: Any = None,
    on_step: Optional[Callable[[int, "torch.Tensor"], None]] = None,
    sync: Optional[Callable[[], bool]] = None,
) -> EpochStats:
    """One pass over `batches` (micro-batches: an optimizer step every `accum_steps` of them, the gradients of each
    averaged as one batch), summed into `stats` (a new EpochStats if None), which it returns. scheduler: stepped
    after every optimizer step. on_step(step, loss of its last micro-batch): after every optimizer step.
    sync: before clipping, shares the gradients and says whether the step commits (Session.sync_gradients)."""
    model.train()
    stats = stats if stats is not None else EpochStats()
    step = micro = 0
    for x, y in batches:
        micro += 1
        boundary = micro % accum_steps == 0
        if micro % accum_steps == 1 or accum_steps == 1:
            optimizer.zero_grad(set_to_none=True)
        # Every micro-batch's backward all-reduces under DDP (no_sync would save that, but an epoch's last step
        # may have fewer micro-batches, and its gradients must still be shared).
        with _autocast(x.device, amp_dtype):
            loss = loss_fn(model(x), y)
        scaled = loss / accum_steps if accum_steps > 1 else loss
        if scaler is not None:
            scaler.scale(scaled).backward()
        else:
            scaled.backward()
        stats.loss_sum = stats.loss_sum + loss.detach() * len(y)  # stays on the device: no host sync per step
        stats.samples += len(y)
        if not boundary:
            continue
        step += 1
        _optimizer_step(model, optimizer, grad_clip, scaler, scheduler, sync)
        if on_step is not None:
            on_step(step, loss.detach())
        if max_steps and step >= max_steps:
            break
    else:
        if micro % accum_steps:  # the epoch's last step had fewer micro-batches: its gradients still count
            _optimizer_step(model, optimizer, grad_clip, scaler, scheduler, sync)
    return stats


def _optimizer_step(model: "nn.Module", optimizer: "torch.optim.Optimizer", grad_clip: float,
                    scaler: Optional["torch.amp.GradScaler"], scheduler: Any,
                    sync: Optional[Callable[[], bool]] = None) -> None:
    from torch import nn

    if scaler is not None:
        scaler.unscale_(optimizer)
    if sync is not None and not sync():  # torchft: a step the replicas did not commit changes nothing
        if scaler is not None:
            scaler.update()
        return
    if grad_clip > 0:
        nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
    if scheduler is not None:
        scheduler.step()


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


def metrics_row(train: EpochStats, val: Optional[EpochStats], seconds: float, classification: bool,
                trained: Optional[float] = None) -> dict:
    """The epoch's row: `samples` and `train_loss` over the whole epoch; `samples_per_s` over the samples trained
    in `seconds` (`trained`: fewer than the epoch's in an epoch resumed from a mid-epoch checkpoint, whose earlier
    samples an earlier attempt trained), `epoch_s` those seconds."""
    trained = train.samples if trained is None else trained
    row = {
        "train_loss": train.loss_sum / max(train.samples, 1),
        "samples": int(train.samples),
        "samples_per_s": max(trained, 0.0) / max(seconds, 1e-9),
        "epoch_s": seconds,
    }
    if val is not None and val.samples:
        row["val_loss"] = val.loss_sum / val.samples
        if classification:
            row["val_accuracy"] = val.correct / val.samples
    return row


def format_row(row: dict, epochs: int, progress: str = "") -> str:
    """An epoch's console line; `progress`: the run's progress as raytrain.rundir.goodput.progress_text writes it."""
    parts = [f"epoch {row['epoch']}/{epochs}" if epochs else f"epoch {row['epoch']}"]
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
    if progress:
        parts.append(progress)
    return "  ".join(parts)


def show_rows(rows: list[dict], run_dir: Any, epochs: int, out: Optional[Any] = None, interactive: bool = False) -> None:
    """New metrics rows on the driver's console, the newest with the run's progress and time left (goodput's
    reading of all the run's records: once per call); a bar on an interactive terminal."""
    if not rows:
        return
    progress = goodput.read(run_dir, epochs).progress
    for row in rows:
        newest = row is rows[-1]
        console.epoch(format_row(row, epochs, goodput.progress_text(progress) if newest else ""),
                      {**row, "progress": progress} if newest else row, out=out,
                      bar=row["epoch"] / epochs if interactive and epochs else None)


def peak_rss_mb(session: Session) -> float:
    """The highest peak resident memory of any worker process so far, in MiB (the max over the workers)."""

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux reports KiB
    return round(session.all_reduce([peak], op="max")[0], 1)
