"""The CPU workload both sides of p1, p2 and scaling run, and where the sides run.

The same CIFAR-shaped uint8 data, the same decode/normalise and the same timed loop (the package's own
train_epoch) on both sides. Steps are timed with torch's own optimizer hook, so the loop under test carries
nothing for the benchmark."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Iterable, Iterator, Optional

import numpy as np

from bench.harness import BENCH_ROOT, BenchSettings

# CIFAR-10's per-channel mean and std: the "decode and normalise" both data paths apply.
CIFAR_MEAN = np.array([0.4914, 0.4822, 0.4465], dtype=np.float32)
CIFAR_STD = np.array([0.2470, 0.2435, 0.2616], dtype=np.float32)


# ----------------------------------------------------------------------------------------------------------
# data


def cifar_like(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """n CIFAR-10-shaped samples as stored on disk: uint8 HWC images and int64 labels."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, size=(n, 32, 32, 3), dtype=np.uint8), rng.integers(0, 10, size=n, dtype=np.int64)


def normalise_batch(batch: dict) -> dict:
    """uint8 NHWC -> float32 NCHW, scaled and normalised per channel (what torchvision's ToTensor+Normalize do)."""
    x = (batch["x"].astype(np.float32) / 255.0 - CIFAR_MEAN) / CIFAR_STD
    return {"x": np.ascontiguousarray(x.transpose(0, 3, 1, 2)), "y": batch["y"]}


def collate_normalised(samples: list) -> tuple:
    import torch

    xs = np.stack([s[0] for s in samples])
    ys = np.array([s[1] for s in samples], dtype=np.int64)
    out = normalise_batch({"x": xs, "y": ys})
    return torch.from_numpy(out["x"]), torch.from_numpy(out["y"])


class ArrayDataset:
    """A map-style dataset over the uint8 arrays (what a decoded-on-read image dataset yields)."""

    def __init__(self, x: np.ndarray, y: np.ndarray):
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i]


def dataset_size(s: BenchSettings, num_workers: int = 1) -> int:
    """Enough samples for every worker to run warmup + steps (and the ingest batches) within one epoch."""
    return max(s.warmup_steps + s.steps, s.ingest_batches + 1) * s.batch_size * num_workers


def ray_dataset(s: BenchSettings, num_workers: int = 1, block_rows: int = 1024):
    """The same uint8 arrays as a Ray Dataset (blocks of block_rows in the object store), normalised lazily per
    batch by Ray Data's own tasks, as a user's preprocessing would be."""
    import ray.data
    from ray.data.block import BlockAccessor

    x, y = cifar_like(dataset_size(s, num_workers))
    ray.data.DataContext.get_current().enable_progress_bars = False
    blocks = [BlockAccessor.batch_to_block({"x": x[i:i + block_rows], "y": y[i:i + block_rows]})
              for i in range(0, len(y), block_rows)]
    return ray.data.from_blocks(blocks).map_batches(normalise_batch, batch_format="numpy", batch_size=s.batch_size)


# ----------------------------------------------------------------------------------------------------------
# the timed loop


class TimedBatches:
    """Wraps a batch iterator: records how long each `next()` waited and each batch's size, and stops after
    `limit` batches."""

    def __init__(self, batches: Iterable, limit: int):
        self.source, self.limit = iter(batches), limit
        self.waits: list[float] = []
        self.sizes: list[int] = []

    def __iter__(self) -> Iterator:
        for _ in range(self.limit):
            began = time.perf_counter()
            try:
                batch = next(self.source)
            except StopIteration:
                return
            self.waits.append(time.perf_counter() - began)
            self.sizes.append(len(batch[1]))
            yield batch


def _as_xy(batch) -> tuple:
    return (batch["x"], batch["y"]) if isinstance(batch, dict) else batch


def timed_training(model, optimizer, batches: Iterable, warmup: int, steps: int) -> dict:
    """warmup + steps optimizer steps with the package's own train_epoch; the timed window excludes warmup."""
    import torch.nn.functional as F

    from raytrain.loop import train_epoch

    timed = TimedBatches((_as_xy(b) for b in batches), warmup + steps)
    marks: list[float] = []
    cpu_marks: list[float] = []

    def after_step(_optimizer, _args, _kwargs) -> None:
        marks.append(time.perf_counter())
        cpu_marks.append(time.process_time())

    handle = optimizer.register_step_post_hook(after_step)
    began = time.perf_counter()
    try:
        train_epoch(model, timed, optimizer, F.cross_entropy)
    finally:
        handle.remove()
    if len(marks) < warmup + 2:
        raise RuntimeError(f"only {len(marks)} batches arrived; the dataset is smaller than warmup + steps")
    window = marks[-1] - marks[warmup - 1] if warmup else marks[-1] - began
    timed_steps = len(marks) - warmup
    samples = sum(timed.sizes[warmup:len(marks)])
    # waits[i] precedes step i+1; the window holds steps warmup+1 .. end, whose waits are waits[warmup:].
    waiting = sum(timed.waits[warmup:len(marks)])
    # CPU seconds of the training process over the same window: on a shared, loaded machine, samples per CPU
    # second compares the two sides' own cost even when their share of the CPU differs.
    cpu = cpu_marks[-1] - cpu_marks[warmup - 1] if warmup else cpu_marks[-1]
    return {"samples_per_s": samples / window, "step_s": window / timed_steps, "wait_share": waiting / window,
            "steps": timed_steps, "samples_per_cpu_s": samples / cpu if cpu > 0 else None}


def timed_ingest(batches: Iterable, count: int) -> dict:
    """Batches/s of a data path with no model (the first batch, which pays start-up, is not timed)."""
    it = iter(batches)
    next(it)
    began = time.perf_counter()
    got = 0
    for _ in range(count):
        try:
            next(it)
        except StopIteration:
            break
        got += 1
    seconds = time.perf_counter() - began
    return {"batches_per_s": got / seconds if seconds > 0 else None, "batches": got}


def build_cnn(width: int):
    from raytrain.models import small_cnn

    return small_cnn(in_channels=3, num_classes=10, width=width, dropout=0.0)


# ----------------------------------------------------------------------------------------------------------
# where the sides run


def importable_env(env: Optional[dict] = None, **settings: str) -> dict:
    """An environment whose Python processes can import the bench package (it is not installed)."""
    env = dict(os.environ if env is None else env, **settings)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(BENCH_ROOT), env.get("PYTHONPATH")) if p)
    return env


def in_fresh_process(function: Callable[[dict], dict], params: dict) -> dict:
    """Call function(params) in a new Python process (as a Ray Train worker is one) and return its result;
    parameters and result travel as JSON over stdin/stdout."""
    code = (f"import json, sys; from {function.__module__} import {function.__name__} as f; "
            "r = f(json.load(sys.stdin)); sys.stdout.write('\\nBENCH-RESULT ' + json.dumps(r) + '\\n')")
    # Ray starts its workers with OMP_NUM_THREADS set to their CPUs; the raw side gets the same thread settings.
    threads = str(params.get("torch_threads", 1))
    env = importable_env(OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads)
    proc = subprocess.run([sys.executable, "-c", code], input=json.dumps(params), capture_output=True, text=True,
                          env=env)
    for line in proc.stdout.splitlines():
        if line.startswith("BENCH-RESULT "):
            return json.loads(line.split(" ", 1)[1])
    raise RuntimeError(f"{function.__name__} failed (exit {proc.returncode}): {proc.stderr.strip()[-2000:]}")


@contextlib.contextmanager
def own_ray_env(env: Optional[dict] = None) -> Iterator[dict]:
    """An environment for a `raytrain` process that starts its own embedded Ray: no RAY_ settings inherited and a
    Ray temp dir of its own (never the shared /tmp/ray), removed afterwards. The bench package is importable."""
    temp = tempfile.mkdtemp(prefix="rtb", dir="/tmp")
    base = {k: v for k, v in (os.environ if env is None else env).items() if not k.startswith("RAY_")}
    try:
        yield importable_env(base, RAY_TMPDIR=temp)
    finally:
        shutil.rmtree(temp, ignore_errors=True)


@contextlib.contextmanager
def embedded_ray(**init_options) -> Iterator[None]:
    """A Ray of its own in this process, in its own temp dir (never the shared /tmp/ray), gone afterwards."""
    import ray

    temp = tempfile.mkdtemp(prefix="rtb", dir="/tmp")
    ray.init(address="local", include_dashboard=False, logging_level=logging.WARNING, _temp_dir=temp,
             **init_options)
    try:
        yield
    finally:
        ray.shutdown()
        shutil.rmtree(temp, ignore_errors=True)


def ray_train_worker(loop_config: dict) -> None:
    """The Ray Train side: the same steps on one TorchTrainer worker fed by its Ray Data shard."""
    import torch
    import ray.train
    import ray.train.torch

    s = BenchSettings(**loop_config["settings"])
    torch.set_num_threads(s.torch_threads)
    torch.manual_seed(0)
    shard = ray.train.get_dataset_shard("train")

    def batches():
        return shard.iter_torch_batches(batch_size=s.batch_size, drop_last=True)

    result: dict = {"threads": torch.get_num_threads(), "world_size": ray.train.get_context().get_world_size()}
    if loop_config.get("ingest", True):
        result["ingest"] = timed_ingest(batches(), s.ingest_batches)
    model = ray.train.torch.prepare_model(build_cnn(s.cnn_width))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    result["train"] = timed_training(model, optimizer, batches(), s.warmup_steps, s.steps)
    if ray.train.get_context().get_world_rank() == 0:  # Ray Train keeps reported metrics only with checkpoints
        Path(loop_config["result_path"]).write_text(json.dumps(result))


def ray_train_side(s: BenchSettings, dataset, storage: str, num_workers: int = 1, ingest: bool = True,
                   cpus_per_worker: Optional[float] = None, placement: str = "PACK") -> dict:
    """One TorchTrainer run built as the launcher builds it; returns rank 0's measurements."""
    import ray.train
    from ray.train.torch import TorchTrainer

    from raytrain.driver.raytrainer import CONTROLLER_POLL_INTERVAL_S

    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", CONTROLLER_POLL_INTERVAL_S)
    result_path = Path(storage) / f"bench-{time.time_ns()}.json"
    result_path.parent.mkdir(parents=True, exist_ok=True)
    trainer = TorchTrainer(
        ray_train_worker,
        train_loop_config={"settings": asdict(s), "ingest": ingest, "result_path": str(result_path)},
        scaling_config=ray.train.ScalingConfig(num_workers=num_workers, placement_strategy=placement,
                                               resources_per_worker={"CPU": cpus_per_worker or s.torch_threads}),
        run_config=ray.train.RunConfig(name=f"bench-{time.time_ns()}", storage_path=storage),
        datasets={"train": dataset},
    )
    trainer.fit()
    return json.loads(result_path.read_text())
