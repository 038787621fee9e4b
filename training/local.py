"""`raytrain local`: the same model, data and metrics in one plain PyTorch process, no Ray.

This is the "before Ray" baseline: it shares the epoch and evaluation steps with the Ray Train loop, so the two
differ only in what Ray adds (processes, sharding, DDP, checkpoints through Ray Train)."""

from __future__ import annotations

import os
import sys
import time
from typing import TextIO

import torch
from torch.utils.data import DataLoader

from raytrain import console, runs
from raytrain.config import RunConfig, dump_yaml
from raytrain.data import DATASETS, DataUnavailable, data_context
from raytrain.launcher import LaunchError, Outcome, summarize
from raytrain.loop import (autocast_dtype, build_optimizer, evaluate, format_row, loss_function, metrics_row,
                           torch_threads, train_epoch)
from raytrain.models import build_model


def train_local(cfg: RunConfig, out: TextIO = sys.stdout) -> Outcome:
    started = time.time()
    run_dir = runs.run_dir_of(cfg.run.storage_path, cfg.run.name)
    runs.write_config(run_dir, dump_yaml(cfg))
    (run_dir / runs.METRICS_FILE).unlink(missing_ok=True)  # a local run always starts from scratch
    spec = DATASETS[cfg.data.name]
    ctx = data_context(cfg)
    try:
        spec.prepare(cfg.data.params, ctx)
    except DataUnavailable as err:
        raise LaunchError(str(err)) from None
    device = torch.device("cuda" if cfg.scaling.use_gpu and torch.cuda.is_available() else "cpu")
    torch.set_num_threads(torch_threads(cfg, os.cpu_count() or 1))
    torch.manual_seed(cfg.train.seed)
    train_ds, val_ds = spec.torch_datasets(cfg.data.params, ctx)
    # One process sees the whole global batch, as the N workers together do.
    train_loader = DataLoader(train_ds, batch_size=cfg.train.batch_size, shuffle=True)
    val_loader = DataLoader(val_ds, batch_size=cfg.train.batch_size) if val_ds is not None else None
    model = build_model(cfg.model).to(device)
    optimizer = build_optimizer(cfg, model)
    loss_fn = loss_function(spec.task)
    classification = spec.task == "classification"
    amp_dtype = autocast_dtype(cfg, device)
    to_device = lambda loader: ((x.to(device), y.to(device)) for x, y in loader)  # noqa: E731
    runs.append_event(run_dir, "start", start_epoch=1, resumed_from_epoch=None, world_size=1)
    console.info("training", f"local training {cfg.run.name} on {device}; run directory {run_dir}", out=out,
                 run_dir=str(run_dir))
    for epoch in range(1, cfg.train.epochs + 1):
        began = time.perf_counter()
        stats = train_epoch(model, to_device(train_loader), optimizer, loss_fn,
                            max_steps=cfg.train.max_steps_per_epoch, grad_clip=cfg.train.grad_clip, amp_dtype=amp_dtype)
        seconds = time.perf_counter() - began
        val = evaluate(model, to_device(val_loader), loss_fn, classification, amp_dtype) if val_loader else None
        row = metrics_row(epoch, stats, val, seconds, classification)
        row["resumed_from_epoch"] = None
        runs.append_metrics(run_dir, row)
        console.epoch(format_row(row, cfg.train.epochs), row, out=out)
    result = summarize(run_dir, "succeeded", started)
    runs.write_result(run_dir, result)
    return Outcome(run_dir, result)
