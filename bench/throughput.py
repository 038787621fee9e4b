"""p1 and p2: raw torch in a fresh process against Ray Train with one worker on an embedded Ray.

- p1: training samples/s of the Ray Train path (TorchTrainer, 1 worker, Ray Data ingest, prepare_model, the
  package's own train_epoch) against a raw PyTorch loop (a plain process, DataLoader, the same train_epoch) on the
  same CNN, the same CIFAR-shaped batches and the same number of torch threads. The ratio is the figure.
- p2: Ray Data `iter_torch_batches` against a torch `DataLoader` delivering the same decoded, normalised batches
  with no model (batches/s), and the share of step time that the training loops of p1 spend waiting for data.
"""

from __future__ import annotations

import os
from dataclasses import asdict
from pathlib import Path
from typing import Callable

from bench.harness import TARGETS, BenchSettings, figure, interleaved, ratios, summary
from bench.workload import (ArrayDataset, build_cnn, cifar_like, collate_normalised, dataset_size, embedded_ray,
                            in_fresh_process, ray_dataset, ray_train_side, timed_ingest, timed_training)


def raw_torch_side(params: dict) -> dict:
    """Runs in a fresh process: DataLoader ingest, then training."""
    import torch
    from torch.utils.data import DataLoader

    s = BenchSettings(**params)
    torch.set_num_threads(s.torch_threads)
    torch.manual_seed(0)
    x, y = cifar_like(dataset_size(s))

    def loader():
        return DataLoader(ArrayDataset(x, y), batch_size=s.batch_size, shuffle=True, collate_fn=collate_normalised,
                          num_workers=s.data_workers, persistent_workers=False, drop_last=True)

    ingest = timed_ingest(loader(), s.ingest_batches)
    model = build_cnn(s.cnn_width)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    train = timed_training(model, optimizer, loader(), s.warmup_steps, s.steps)
    return {"ingest": ingest, "train": train, "threads": torch.get_num_threads()}


def bench_throughput(s: BenchSettings, work: Path, log: Callable[[str], None]) -> list[dict]:
    """p1 and p2, interleaved: each round runs both sides back to back, alternating which goes first."""
    def after_round(r: int, sides: dict) -> None:
        log(f"round {r + 1}/{s.rounds}: raw torch {sides['torch'][-1]['train']['samples_per_s']:.0f} samples/s, "
            f"Ray Train {sides['ray'][-1]['train']['samples_per_s']:.0f} samples/s")

    with embedded_ray(num_cpus=os.cpu_count()):
        dataset = ray_dataset(s)
        sides = interleaved(s.rounds, {
            "torch": lambda r: in_fresh_process(raw_torch_side, asdict(s)),
            "ray": lambda r: ray_train_side(s, dataset, str(work / "ray-results")),
        }, after_round)
    return throughput_figures(s, sides["torch"], sides["ray"])


def throughput_figures(s: BenchSettings, raw: list[dict], rt: list[dict]) -> list[dict]:
    """The p1 and p2 figures (those of s.parts) from each round's raw-torch and Ray Train measurements."""
    torch_sps = [r["train"]["samples_per_s"] for r in raw]
    ray_sps = [r["train"]["samples_per_s"] for r in rt]
    ratio = ratios(ray_sps, torch_sps)
    cpu_ratio = ratios([r["train"].get("samples_per_cpu_s") for r in rt],
                       [r["train"].get("samples_per_cpu_s") for r in raw])
    wait_rt = [r["train"]["wait_share"] for r in rt]
    wait_raw = [r["train"]["wait_share"] for r in raw]
    common = {"batch_size": s.batch_size, "torch_threads": s.torch_threads, "model": f"small_cnn width {s.cnn_width}"}
    out = []
    if "p1" in s.parts:
        med = summary(ratio)["median"]
        out += [
            figure("p1_raw_torch_samples_per_s", "samples/s", torch_sps, **common),
            figure("p1_ray_train_samples_per_s", "samples/s", ray_sps, **common),
            figure("p1_ratio", "x", ratio, target=f">= {TARGETS['p1_ratio']}",
                   met=med is not None and med >= TARGETS["p1_ratio"], **common),
            figure("p1_ratio_per_cpu_second", "x", cpu_ratio, note="samples per CPU-second of the training process: "
                   "the two sides' own cost, less sensitive to how much CPU a loaded machine gives each", **common),
        ]
    if "p2" in s.parts:
        med = summary(wait_rt)["median"]
        out += [
            figure("p2_dataloader_batches_per_s", "batches/s", [r["ingest"]["batches_per_s"] for r in raw],
                   data_workers=s.data_workers, batch_size=s.batch_size),
            figure("p2_ray_data_batches_per_s", "batches/s", [r["ingest"]["batches_per_s"] for r in rt],
                   batch_size=s.batch_size),
            figure("p2_wait_share_raw_torch", "fraction", wait_raw, **common),
            figure("p2_wait_share_ray_train", "fraction", wait_rt, target=f"< {TARGETS['p2_wait_share']}",
                   met=med is not None and med < TARGETS["p2_wait_share"], **common),
        ]
    return out
