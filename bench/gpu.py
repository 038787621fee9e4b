"""gpu: the ViT and gpt presets' models in bf16 on one GPU: raw torch against the same loop in a Ray Train worker,
their MFU, and FSDP2 against DDP (step time and peak device memory). Skipped (with its reason) without CUDA.

Each model is the preset's own (`raytrain.spec.build.build_model` on `cifar10-vit` and `gpt`), at the preset's
global batch (train.batch_size) and with what the loop does on a GPU: bf16 autocast (train.mixed_precision: auto),
AdamW; for FSDP2, `raytrain.parallel.sharding.fully_shard_model` (bf16 parameters, fp32 reduction). Batches are
generated on the device, so the figure is the model's step, not data loading (p1/p2 measure that).

MFU: training FLOPs per sample = 6 x parameters x tokens (the matmuls, forward and backward) + 12 x layers x
tokens^2 x width (attention's scores and values), over the device's dense bf16 peak, looked up by its name.
FSDP against DDP runs on one GPU (world size 1): what FSDP2's machinery costs a step when it has nothing to shard,
not what it saves across GPUs.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable

from bench.harness import BenchSettings, figure, interleaved, ratios, skipped
from bench.workload import embedded_ray, in_fresh_process

# Dense bf16 peak (TFLOP/s) by device name fragment, for MFU; an unknown device reports no MFU.
BF16_PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "A10G": 70.0, "L4": 121.0}
# The presets whose models are measured, and the shape of their inputs.
GPU_PRESETS = ("cifar10-vit", "gpt")


def train_flops_per_sample(params: int, tokens: int, layers: int, hidden: int) -> float:
    """Training FLOPs per sample: 6 * parameters * tokens for the matmuls, plus attention's 12 * L * T^2 * d."""
    return 6.0 * params * tokens + 12.0 * layers * tokens**2 * hidden


def model_shape(preset: str, cfg) -> tuple[int, int, int]:
    """(tokens per sample, layers, width) of a preset's model, from its config."""
    kw = cfg.model.kwargs
    if preset == "gpt":
        return cfg.data.component.kwargs.get("block_size", 128), kw.get("n_layers", 6), kw.get("d_model", 384)
    image, patch = kw.get("image_size", 32), kw.get("patch_size", 4)
    return (image // patch) ** 2 + 1, kw.get("num_layers", 12), kw.get("hidden_dim", 384)


def gpu_side(params: dict) -> dict:
    """One side in this process: params preset, strategy ("none", "ddp", "fsdp"), settings, device ("cuda"; "cpu"
    for the unit test), port (for ddp/fsdp: a one-rank process group of its own)."""
    import torch
    import torch.distributed as dist

    from raytrain import loop
    from raytrain.spec import build
    from raytrain.spec.config import load_config

    s = BenchSettings(**params["settings"])
    preset, strategy = params["preset"], params["strategy"]
    device = torch.device(params.get("device", "cuda"))
    if device.type == "cuda" and device.index is None:  # the visible GPU (a Ray worker sees only its own)
        device = torch.device("cuda", torch.cuda.current_device())
    overrides = [f"scaling.strategy={'fsdp' if strategy == 'fsdp' else 'ddp'}", "scaling.num_workers=1",
                 f"scaling.use_gpu={'true' if device.type == 'cuda' else 'false'}", *params.get("overrides", [])]
    cfg = load_config(preset, overrides, smoke=params.get("smoke", False))
    torch.manual_seed(0)
    own_group = strategy != "none" and not dist.is_initialized()
    if own_group:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(params["port"]))
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=0, world_size=1)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    model = build.build_model(cfg)
    n_params = sum(p.numel() for p in model.parameters())
    if strategy == "fsdp":
        from raytrain.parallel.sharding import fully_shard_model

        model = fully_shard_model(model, cfg, device, 1)
    else:
        model = model.to(device)
        if strategy == "ddp":
            from torch.nn.parallel import DistributedDataParallel

            model = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = loop.build_optimizer(cfg, model)
    loss_fn = build.build_loss(cfg)
    amp = loop.autocast_dtype(cfg, device)
    batch = params.get("batch_size") or cfg.train.batch_size
    tokens, layers, width = model_shape(preset, cfg)
    if preset == "gpt":
        data = torch.randint(0, cfg.model.kwargs.get("vocab_size", 256), (batch, tokens + 1), device=device)
        x, y = data[:, :-1], data[:, 1:]
    else:
        size = cfg.model.kwargs.get("image_size", 32)
        x = torch.randn(batch, 3, size, size, device=device)
        y = torch.randint(0, cfg.model.kwargs.get("num_classes", 10), (batch,), device=device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    began = time.perf_counter()
    for i in range(s.warmup_steps + s.steps):
        if i == s.warmup_steps:
            sync()
            began = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=amp, enabled=amp is not None):
            loss = loss_fn(model(x), y)
        loss.backward()
        if cfg.train.grad_clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.train.grad_clip)
        optimizer.step()
    sync()
    seconds = time.perf_counter() - began
    out = {"preset": preset, "strategy": strategy, "batch_size": batch, "params": n_params,
           "samples_per_s": s.steps * batch / seconds, "step_s": seconds / s.steps,
           "flops_per_sample": train_flops_per_sample(n_params, tokens, layers, width),
           "loss": float(loss.detach()),
           "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
           "torch": torch.__version__}
    if device.type == "cuda":
        out["peak_memory_mib"] = torch.cuda.max_memory_allocated(device) / 2**20
    if own_group:
        dist.destroy_process_group()
    return out


def _ray_worker(loop_config: dict) -> None:
    # Ray Train set up the process group (nccl on a GPU worker); the model is used as the loop uses it on one worker.
    result = gpu_side({**loop_config["params"], "strategy": "none"})
    Path(loop_config["result_path"]).write_text(json.dumps(result))


def _ray_train_side(params: dict, work: Path, r: int) -> dict:
    import ray.train
    from ray.train.torch import TorchTrainer

    result_path = work / f"gpu-{params['preset']}-{r}.json"
    trainer = TorchTrainer(
        _ray_worker, train_loop_config={"params": params, "result_path": str(result_path)},
        scaling_config=ray.train.ScalingConfig(num_workers=1, use_gpu=True),
        run_config=ray.train.RunConfig(name=f"bench-gpu-{time.time_ns()}", storage_path=str(work / "ray-results")))
    trainer.fit()
    return json.loads(result_path.read_text())


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def bench_gpu(s: BenchSettings, work: Path, log: Callable[[str], None]) -> list[dict]:
    import torch

    if not torch.cuda.is_available():
        return [skipped("gpu", "no CUDA device")]
    rows: list[dict] = []
    with embedded_ray():
        for preset in GPU_PRESETS:
            params = {"preset": preset, "settings": asdict(s), "device": "cuda"}

            def after_round(r: int, sides: dict, preset=preset) -> None:
                log(f"gpu {preset} round {r + 1}: " + ", ".join(
                    f"{side} {runs[-1]['samples_per_s']:.0f} samples/s" for side, runs in sides.items()))

            try:
                sides = interleaved(s.rounds, {
                    "torch": lambda r, p=params: in_fresh_process(gpu_side, {**p, "strategy": "none"}),
                    "ray": lambda r, p=params: _ray_train_side(p, work, r),
                    "ddp": lambda r, p=params: in_fresh_process(gpu_side, {**p, "strategy": "ddp",
                                                                           "port": free_port()}),
                    "fsdp": lambda r, p=params: in_fresh_process(gpu_side, {**p, "strategy": "fsdp",
                                                                            "port": free_port()})}, after_round)
            except Exception as exc:  # one preset's failure (say, out of memory) leaves the other's figures
                log(f"gpu {preset}: {type(exc).__name__}: {exc}")
                rows.append({"figure": f"gpu_{preset.replace('-', '_')}", "error": f"{type(exc).__name__}: {exc}"})
                continue
            rows += preset_figures(preset, sides)
    return rows


def preset_figures(preset: str, sides: dict[str, list[dict]]) -> list[dict]:
    first = sides["torch"][0]
    device = first["device"]
    peak = next((v for k, v in BF16_PEAK_TFLOPS.items() if k in device), None)
    name = preset.replace("-", "_")
    common = {"device": device, "torch": first["torch"], "batch_size": first["batch_size"],
              "params": first["params"], "model": f"the {preset} preset's model, bf16 autocast, AdamW"}

    def sps(side: str) -> list:
        return [r["samples_per_s"] for r in sides[side]]

    def mfu(side: str) -> list:
        return [r["samples_per_s"] * r["flops_per_sample"] / (peak * 1e12) if peak else None for r in sides[side]]

    return [figure(f"gpu_{name}_raw_torch_samples_per_s", "samples/s", sps("torch"), **common),
            figure(f"gpu_{name}_ray_train_samples_per_s", "samples/s", sps("ray"), **common),
            figure(f"gpu_{name}_ray_train_ratio", "x", ratios(sps("ray"), sps("torch")), **common),
            figure(f"gpu_{name}_mfu_raw_torch", "fraction", mfu("torch"), peak_tflops=peak, **common),
            figure(f"gpu_{name}_mfu_ray_train", "fraction", mfu("ray"), peak_tflops=peak, **common),
            figure(f"gpu_{name}_ddp_step_ms", "ms", [r["step_s"] * 1e3 for r in sides["ddp"]], **common),
            figure(f"gpu_{name}_fsdp_step_ms", "ms", [r["step_s"] * 1e3 for r in sides["fsdp"]], **common),
            figure(f"gpu_{name}_fsdp_over_ddp_step", "x",
                   ratios([r["step_s"] for r in sides["fsdp"]], [r["step_s"] for r in sides["ddp"]]), **common),
            figure(f"gpu_{name}_ddp_peak_memory_mib", "MiB", [r["peak_memory_mib"] for r in sides["ddp"]], **common),
            figure(f"gpu_{name}_fsdp_peak_memory_mib", "MiB", [r["peak_memory_mib"] for r in sides["fsdp"]],
                   **common)]
