"""bench/gpu.py: the FLOPs formula behind MFU, and the part's skip without CUDA (it runs for real with one)."""

from __future__ import annotations

import pytest
import torch

from bench import gpu
from bench.harness import BenchSettings


def test_vit_flops_formula():
    assert gpu.vit_train_flops_per_sample(params=10, tokens=2, layers=1, hidden=4) == 6 * 10 * 2 + 12 * 4 * 4


def test_gpu_part_is_skipped_with_its_reason_without_cuda(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: the GPU part runs for real (scripts/bench gpu)")
    rows = gpu.bench_gpu(BenchSettings(), tmp_path, lambda message: None)
    assert rows == [{"figure": "gpu_vit", "skipped": "no CUDA device"}]
