"""p1core: `raytrain run PRESET` (1 worker, the product's own built-in loop, its data and model, embedded Ray) against
a plain PyTorch loop on the same model, the same data, the same global batch and the same torch threads, each side
in a fresh process, interleaved round by round.

Both sides are measured the same way: training samples/s over whole epochs, the first epoch left out as warm-up.
The raytrain side's figure comes from the run's own metrics.jsonl rows (`samples`, `epoch_s`: the loop times its
training pass, not evaluation or checkpoints); the plain loop writes the same two numbers per epoch.

The plain side builds the preset's model component and its data component's train split (`data.loader: torch`,
map-style) through raytrain's builders, as a user's script importing them would, then runs a textbook loop:
DataLoader (shuffled), zero_grad, forward, loss, backward, clip where the preset clips, step, the loss summed on
the device. Workloads: `digits` (the preset as it ships: a small CNN on 8x8 digits, `data.loader: auto`, which
takes a DataLoader), `digits_ray` (the same with Ray Data ingest, as the preset shipped before) and `vit`
(cifar10-vit on synthetic data, a ViT shrunk to fit a round into well under a minute on 2 cores: compute-bound).
"""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from bench.harness import TARGETS, BenchSettings, figure, interleaved, ratios, summary
from bench.workload import in_fresh_process, own_ray_env


@dataclass(frozen=True)
class Workload:
    preset: str
    overrides: tuple[str, ...]  # --set keys on both sides, besides epochs, workers and threads
    epochs: int  # the first is warm-up
    data_workers: int  # the plain side's DataLoader worker processes (Ray Data runs its own tasks)
    note: str


WORKLOADS = {
    "digits": Workload("digits", (), 10, 0, "the preset as shipped: small_cnn width 16, 1438 training images, "
                                            "global batch 64, data.loader: auto (a DataLoader for its 0.5 MB); "
                                            "in-memory tensors on the plain side"),
    "digits_ray": Workload("digits", ("data.loader=ray",), 10, 0, "the preset with Ray Data ingest "
                                                                  "(data.loader=ray), as it shipped before auto"),
    "vit": Workload("cifar10-vit", ("data.synthetic=true", "data.synthetic_train=512", "data.synthetic_val=64",
                                    "model.num_layers=4", "model.num_heads=4", "model.hidden_dim=128",
                                    "model.mlp_dim=256", "train.batch_size=128"), 4, 1,
                    "cifar10-vit on synthetic data (augmented), 4 layers x 128 wide, global batch 128; Parquet "
                    "decoded by Ray Data on the raytrain side, the same arrays by 1 DataLoader worker on the plain "
                    "side"),
}


def side_overrides(w: Workload, threads: int) -> list[str]:
    """What both sides set on top of the preset: 1 worker, the workload's epochs, the torch threads."""
    return [*w.overrides, "scaling.num_workers=1", f"train.epochs={w.epochs}", f"train.torch_threads={threads}"]


def epoch_rate(rows: list[dict], warmup: int = 1) -> dict:
    """Training samples/s over the epochs after the first `warmup`: their samples over their seconds (rows with
    `epoch`, `samples`, `epoch_s`, as metrics.jsonl holds them)."""
    timed = sorted((r for r in rows if r["epoch"] > warmup), key=lambda r: r["epoch"])
    if not timed:
        raise ValueError(f"no epoch after the first {warmup} to time (rows for epochs "
                         f"{[r.get('epoch') for r in rows]})")
    samples = sum(r["samples"] for r in timed)
    seconds = sum(r["epoch_s"] for r in timed)
    return {"samples_per_s": samples / seconds, "epochs": len(timed), "samples_per_epoch": timed[0]["samples"]}


# ----------------------------------------------------------------------------------------------------------
# the two sides


def plain_side(params: dict) -> dict:
    """Runs in a fresh process: the plain PyTorch loop over the preset's model and training split."""
    import torch
    from torch import nn
    from torch.utils.data import DataLoader

    from raytrain.data import DataContext
    from raytrain.loop import build_optimizer
    from raytrain.spec import build
    from raytrain.spec.config import load_config

    cfg = load_config(params["preset"], params["overrides"])
    torch.set_num_threads(cfg.train.torch_threads)
    torch.manual_seed(cfg.train.seed)
    model = build.build_model(cfg)
    data = build.call_data_component(cfg, DataContext(root=Path(params["storage"]) / "datasets",
                                                      seed=cfg.train.seed, loader="torch"))["train"]
    workers = params["data_workers"]
    loader = DataLoader(data, batch_size=cfg.train.batch_size, shuffle=True, num_workers=workers,
                        persistent_workers=workers > 0)
    optimizer = build_optimizer(cfg, model)  # the preset's optimizer: a plain torch.optim.AdamW here
    loss_fn = build.build_loss(cfg)
    clip = cfg.train.grad_clip
    rows = []
    for epoch in range(1, cfg.train.epochs + 1):
        began = time.perf_counter()
        model.train()
        loss_sum, samples = torch.zeros(()), 0
        for x, y in loader:
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            loss.backward()
            if clip > 0:
                nn.utils.clip_grad_norm_(model.parameters(), clip)
            optimizer.step()
            loss_sum += loss.detach() * len(y)
            samples += len(y)
        seconds = time.perf_counter() - began
        rows.append({"epoch": epoch, "samples": samples, "epoch_s": seconds,
                     "train_loss": float(loss_sum) / max(samples, 1)})
    return {"rows": rows, "threads": torch.get_num_threads()}


def raytrain_side(w: Workload, threads: int, storage: Path, name: str) -> list[dict]:
    """`raytrain run PRESET` on an embedded Ray of its own; the run's metrics rows."""
    from raytrain.rundir import runrecords

    args = [sys.executable, "-m", "raytrain.cli", "run", w.preset, "--name", name, "--storage", str(storage)]
    for key in side_overrides(w, threads):
        args += ["--set", key]
    with own_ray_env() as env:
        proc = subprocess.run(args, cwd=storage, env=env, capture_output=True, text=True, timeout=900)
    rows = runrecords.read_metrics(runrecords.run_dir_of(str(storage), name))
    if proc.returncode != 0 or len(rows) < w.epochs:
        raise RuntimeError(f"raytrain run {w.preset} ended with {proc.returncode} after {len(rows)} epoch rows; "
                           f"its output ends:\n{(proc.stdout + proc.stderr)[-2000:]}")
    return rows


def bench_core(s: BenchSettings, work: Path, log: Callable[[str], None]) -> list[dict]:
    """p1core for each workload: the raytrain and the plain side interleaved."""
    storage = work / "p1core"
    storage.mkdir(parents=True, exist_ok=True)  # shared by the rounds: the ViT's Parquet is written once
    out: list[dict] = []
    for key, w in WORKLOADS.items():
        def raytrain_round(r: int, key=key, w=w) -> dict:
            rows = raytrain_side(w, s.torch_threads, storage, f"{key}-{r}-{time.time_ns() % 10**8}")
            return {**epoch_rate(rows), "rows": rows}

        def plain_round(r: int, w=w) -> dict:
            result = in_fresh_process(plain_side, {"preset": w.preset, "overrides": side_overrides(w, s.torch_threads),
                                                   "storage": str(storage), "data_workers": w.data_workers})
            return {**epoch_rate(result["rows"]), "rows": result["rows"], "threads": result["threads"]}

        def after_round(r: int, sides: dict, key=key) -> None:
            rt, plain = sides["raytrain"][-1], sides["plain"][-1]
            log(f"p1core {key} round {r + 1}/{s.rounds}: raytrain {rt['samples_per_s']:.0f} samples/s, plain "
                f"{plain['samples_per_s']:.0f} samples/s ({rt['samples_per_s'] / plain['samples_per_s']:.3f}x)")

        sides = interleaved(s.rounds, {"raytrain": raytrain_round, "plain": plain_round}, after_round)
        out += core_figures(key, w, s.torch_threads, sides["raytrain"], sides["plain"])
    return out


def core_figures(key: str, w: Workload, threads: int, rt: list[dict], plain: list[dict]) -> list[dict]:
    """A workload's three figures from each round's measurements of the two sides (epoch_rate's dicts)."""
    rt_sps = [r["samples_per_s"] for r in rt]
    plain_sps = [r["samples_per_s"] for r in plain]
    ratio = ratios(rt_sps, plain_sps)
    med = summary(ratio)["median"]
    target = TARGETS["p1core_ratio"]
    common = {"preset": w.preset, "overrides": side_overrides(w, threads), "timed_epochs": w.epochs - 1,
              "samples_per_epoch": {"raytrain": _first(rt, "samples_per_epoch"),
                                    "plain": _first(plain, "samples_per_epoch")},
              "plain_data_workers": w.data_workers, "note": w.note}
    return [figure(f"p1core_{key}_raytrain_samples_per_s", "samples/s", rt_sps, epoch_s=_epoch_seconds(rt), **common),
            figure(f"p1core_{key}_plain_samples_per_s", "samples/s", plain_sps, epoch_s=_epoch_seconds(plain),
                   **common),
            figure(f"p1core_{key}_ratio", "x", ratio, target=f">= {target}", met=med is not None and med >= target,
                   **common)]


def _epoch_seconds(results: list[dict]) -> list[list[float]]:
    """Each round's seconds per epoch (the first one included): where a side's time went."""
    return [[round(row["epoch_s"], 4) for row in r.get("rows", [])] for r in results]


def _first(results: list[dict], key: str) -> Optional[int]:
    return results[0].get(key) if results else None

