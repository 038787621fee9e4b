"""bench/gpu.py: the FLOPs formula behind MFU, each side's loop on the CPU (the same code the GPU runs, in fp32 and
on gloo), and the part's skip without CUDA (it runs for real with one: scripts/bench gpu)."""

from __future__ import annotations

import pytest
import torch

from bench import gpu
from bench.harness import BenchSettings
from bench.workload import in_fresh_process


def test_flops_formula():
    assert gpu.train_flops_per_sample(params=10, tokens=2, layers=1, hidden=4) == 6 * 10 * 2 + 12 * 4 * 4


# Each preset's input shape and each strategy's wrapping, once each (a fresh process costs seconds).
@pytest.mark.parametrize(("preset", "strategy"), [("cifar10-vit", "none"), ("gpt", "ddp"), ("cifar10-vit", "fsdp"),
                                                  ("gpt", "fsdp")])
def test_each_side_trains_the_presets_model_and_reports_its_figures(preset, strategy):
    settings = BenchSettings(warmup_steps=1, steps=2)
    # A fresh process each: a process group is per process, and the preset's smoke model keeps it to seconds.
    out = in_fresh_process(gpu.gpu_side, {"preset": preset, "strategy": strategy, "device": "cpu", "smoke": True,
                                          "settings": gpu.asdict(settings), "batch_size": 4,
                                          "port": gpu.free_port()})
    assert (out["preset"], out["strategy"], out["batch_size"], out["device"]) == (preset, strategy, 4, "cpu")
    assert out["samples_per_s"] > 0 and out["step_s"] > 0 and out["loss"] == out["loss"]  # not NaN
    # The smoke models' shapes: gpt 64 tokens, 2 layers, 64 wide; ViT 32/4 -> 64 patches + the class token.
    tokens, layers, width = {"gpt": (64, 2, 64), "cifar10-vit": (65, 2, 64)}[preset]
    assert out["flops_per_sample"] == gpu.train_flops_per_sample(out["params"], tokens, layers, width)


def test_gpu_part_is_skipped_with_its_reason_without_cuda(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: the GPU part runs for real (scripts/bench gpu)")
    rows = gpu.bench_gpu(BenchSettings(), tmp_path, lambda message: None)
    assert rows == [{"figure": "gpu", "skipped": "no CUDA device"}]
