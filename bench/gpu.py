"""gpu: ViT on CIFAR-shaped batches with bf16 autocast, Ray Train against raw torch, and MFU; skipped (with its
reason) without CUDA."""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable

from bench.harness import BenchSettings, figure, interleaved, ratios, skipped
from bench.workload import embedded_ray, in_fresh_process

# Dense bf16 peak (TFLOP/s) by device name fragment, for MFU; an unknown device reports no MFU.
BF16_PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "A10G": 70.0, "L4": 121.0}


def vit_train_flops_per_sample(params: int, tokens: int, layers: int, hidden: int) -> float:
    """Training FLOPs per sample: 6 * parameters * tokens for the matmuls, plus attention's 12 * L * T^2 * d."""
    return 6.0 * params * tokens + 12.0 * layers * tokens**2 * hidden


def vit_defaults() -> dict:
    """The shape of the package's ViT (raytrain.models.vit's defaults: the cifar10-vit preset's model)."""
    import inspect

    from raytrain.models import vit

    return {name: param.default for name, param in inspect.signature(vit).parameters.items()}


def gpu_vit_side(params: dict) -> dict:
    import torch

    from raytrain.models import vit

    s = BenchSettings(**params)
    p = vit_defaults()
    device = torch.device("cuda")
    model = vit(**p).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(s.batch_size, 3, p["image_size"], p["image_size"], device=device)
    y = torch.randint(0, 10, (s.batch_size,), device=device)
    for i in range(s.warmup_steps + s.steps):
        if i == s.warmup_steps:
            torch.cuda.synchronize()
            began = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
    torch.cuda.synchronize()
    seconds = time.perf_counter() - began
    n_params = sum(t.numel() for t in model.parameters())
    tokens = (p["image_size"] // p["patch_size"]) ** 2 + 1
    return {"samples_per_s": s.steps * s.batch_size / seconds,
            "flops_per_sample": vit_train_flops_per_sample(n_params, tokens, p["num_layers"], p["hidden_dim"]),
            "device": torch.cuda.get_device_name(0)}


def _gpu_ray_worker(loop_config: dict) -> None:
    Path(loop_config["result_path"]).write_text(json.dumps(gpu_vit_side(loop_config["settings"])))


def _ray_train_gpu_side(s: BenchSettings, work: Path, r: int) -> dict:
    import ray.train
    from ray.train.torch import TorchTrainer

    result_path = work / f"gpu-{r}.json"
    trainer = TorchTrainer(
        _gpu_ray_worker, train_loop_config={"settings": asdict(s), "result_path": str(result_path)},
        scaling_config=ray.train.ScalingConfig(num_workers=1, use_gpu=True),
        run_config=ray.train.RunConfig(name=f"bench-gpu-{time.time_ns()}", storage_path=str(work / "ray-results")))
    trainer.fit()
    return json.loads(result_path.read_text())


def bench_gpu(s: BenchSettings, work: Path, log: Callable[[str], None]) -> list[dict]:
    import torch

    if not torch.cuda.is_available():
        return [skipped("gpu_vit", "no CUDA device")]

    def after_round(r: int, sides: dict) -> None:
        log(f"gpu round {r + 1}: raw {sides['torch'][-1]['samples_per_s']:.0f}, "
            f"Ray Train {sides['ray'][-1]['samples_per_s']:.0f}")

    with embedded_ray():
        sides = interleaved(s.rounds, {"torch": lambda r: in_fresh_process(gpu_vit_side, asdict(s)),
                                       "ray": lambda r: _ray_train_gpu_side(s, work, r)}, after_round)
    raw, rt = sides["torch"], sides["ray"]
    device = raw[0]["device"]
    peak = next((v for k, v in BF16_PEAK_TFLOPS.items() if k in device), None)

    def mfu(rows):
        return [r["samples_per_s"] * r["flops_per_sample"] / (peak * 1e12) if peak else None for r in rows]

    raw_sps, rt_sps = [r["samples_per_s"] for r in raw], [r["samples_per_s"] for r in rt]
    common = {"device": device, "model": "ViT 12x384 patch 4, bf16", "batch_size": s.batch_size}
    return [figure("gpu_vit_raw_torch_samples_per_s", "samples/s", raw_sps, **common),
            figure("gpu_vit_ray_train_samples_per_s", "samples/s", rt_sps, **common),
            figure("gpu_vit_ratio", "x", ratios(rt_sps, raw_sps), **common),
            figure("gpu_vit_mfu_raw_torch", "fraction", mfu(raw), peak_tflops=peak, **common),
            figure("gpu_vit_mfu_ray_train", "fraction", mfu(rt), peak_tflops=peak, **common)]
