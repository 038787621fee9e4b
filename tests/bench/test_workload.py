"""bench/workload.py: the shared data path, the timed loop (the package's own train_epoch, timed with torch's
optimizer hook) and the fresh-process runner, on real small inputs."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from bench import workload
from bench.harness import BenchSettings


def test_normalise_matches_torchvision_to_tensor_and_normalize():
    x, y = workload.cifar_like(4, seed=1)
    assert x.shape == (4, 32, 32, 3) and x.dtype == np.uint8 and y.dtype == np.int64
    out = workload.normalise_batch({"x": x, "y": y})
    assert out["x"].shape == (4, 3, 32, 32) and out["x"].dtype == np.float32
    mean, std = (torch.tensor(v).view(1, 3, 1, 1) for v in (workload.CIFAR_MEAN, workload.CIFAR_STD))
    expected = (torch.from_numpy(x).permute(0, 3, 1, 2).float() / 255.0 - mean) / std
    assert torch.allclose(torch.from_numpy(out["x"]), expected, atol=1e-6)
    xs, ys = workload.collate_normalised([(x[i], y[i]) for i in range(4)])
    assert torch.equal(xs, torch.from_numpy(out["x"])) and torch.equal(ys, torch.from_numpy(y))


def test_dataset_holds_enough_batches_for_every_worker():
    s = BenchSettings(batch_size=8, warmup_steps=2, steps=5, ingest_batches=3)
    assert workload.dataset_size(s) == 7 * 8
    assert workload.dataset_size(s, num_workers=2) == 14 * 8


def _batches(n_batches: int, size: int = 4) -> list:
    x, y = workload.cifar_like(n_batches * size)
    return [workload.collate_normalised([(x[i], y[i]) for i in range(b * size, (b + 1) * size)])
            for b in range(n_batches)]


def test_timed_training_runs_the_package_loop_and_times_only_after_warmup():
    torch.manual_seed(0)
    model = workload.build_cnn(width=4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    before = [p.detach().clone() for p in model.parameters()]
    result = workload.timed_training(model, optimizer, _batches(6), warmup=2, steps=3)
    assert result["steps"] == 3  # 2 warmup + 3 timed; the sixth batch is never drawn
    assert result["samples_per_s"] > 0 and result["step_s"] > 0
    assert result["samples_per_s"] == pytest.approx(4 / result["step_s"])  # 4 samples per timed step
    assert 0 <= result["wait_share"] < 1 and result["samples_per_cpu_s"] > 0
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))  # it really trained
    assert not optimizer._optimizer_step_post_hooks  # the timing hook is gone afterwards


def test_timed_training_says_when_the_data_runs_out():
    model = workload.build_cnn(width=4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with pytest.raises(RuntimeError, match="smaller than warmup"):
        workload.timed_training(model, optimizer, _batches(1), 2, 3)


def test_timed_batches_records_waits_and_sizes_and_stops_at_its_limit():
    timed = workload.TimedBatches(iter(_batches(5, size=3)), limit=4)
    assert len(list(timed)) == 4 and timed.sizes == [3, 3, 3, 3] and len(timed.waits) == 4


def test_timed_ingest_counts_batches_after_the_first():
    result = workload.timed_ingest(iter(range(10)), count=5)
    assert result["batches"] == 5 and result["batches_per_s"] > 0
    assert workload.timed_ingest(iter(range(3)), count=5)["batches"] == 2


def test_importable_env_puts_the_checkout_first_and_keeps_the_rest():
    env = workload.importable_env({"PYTHONPATH": "/elsewhere", "KEEP": "1"}, OMP_NUM_THREADS="2")
    assert env["PYTHONPATH"].split(os.pathsep) == [str(workload.BENCH_ROOT), "/elsewhere"]
    assert env["KEEP"] == "1" and env["OMP_NUM_THREADS"] == "2"
    assert (workload.BENCH_ROOT / "bench" / "__init__.py").exists()


def test_in_fresh_process_says_which_function_failed_and_why():
    with pytest.raises(RuntimeError, match=r"(?s)train_flops_per_sample failed \(exit 1\).*TypeError"):
        from bench.gpu import train_flops_per_sample

        workload.in_fresh_process(train_flops_per_sample, {"not": "its arguments"})
