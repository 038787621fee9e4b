"""`raytrain bench`: what raytrain costs against raw PyTorch, measured in one invocation.

Figures (one JSON line each on stdout, all of them in BENCH_DIR/results.json, a chart in BENCH_DIR/bench.png):
- p1: training samples/s of the Ray Train path (TorchTrainer, 1 worker, Ray Data ingest, prepare_model, the
  package's own train_epoch) against a raw PyTorch loop (a plain process, DataLoader, the same train_epoch) on the
  same CNN, the same CIFAR-shaped batches of 256 and the same number of torch threads. The ratio is the figure.
- p2: Ray Data `iter_torch_batches` against a torch `DataLoader` delivering the same decoded, normalised batches
  with no model (batches/s), and the share of step time that the training loops of p1 spend waiting for data.
- p3: seconds from job submission to the first optimizer step, on an already running local multi-node cluster
  (`ray job submit`, as KubeRay's submitter does) and cold (`raytrain run` starting an embedded Ray).
- p4: seconds from a worker-node kill to the next optimizer step, and the completed epochs lost.
- scaling: samples/s with 1 and 2 Ray Train workers on two local worker nodes.
- gpu: ViT on CIFAR-shaped batches with bf16, Ray Train vs raw torch, and MFU; skipped without CUDA.

Sides are interleaved round by round (alternating which goes first) so that machine noise hits both alike; each
figure reports the median, min and max over the rounds. Nothing here asserts a speed: it prints what it measured.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator, Optional, TextIO

import numpy as np

ALL_PARTS = ("p1", "p2", "p3", "p4", "scaling", "gpu")
# CIFAR-10's per-channel mean and std: the "decode and normalise" both data paths apply.
CIFAR_MEAN = np.array([0.4914, 0.4822, 0.4465], dtype=np.float32)
CIFAR_STD = np.array([0.2470, 0.2435, 0.2616], dtype=np.float32)
# Dense bf16 peak (TFLOP/s) by device name fragment, for MFU; an unknown device reports no MFU.
BF16_PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "A10G": 70.0, "L4": 121.0}
TARGETS = {"p1_ratio": 0.97, "p2_wait_share": 0.05, "p3_running_s": 8.0, "p4_next_step_s": 10.0}


@dataclass
class BenchSettings:
    rounds: int = 3
    parts: tuple[str, ...] = ALL_PARTS
    out_dir: str = "bench-results"
    batch_size: int = 256
    warmup_steps: int = 3
    steps: int = 20  # timed training steps per side and round
    ingest_batches: int = 40  # batches per side and round for p2
    torch_threads: int = 1  # intra-op threads, the same on both sides
    cnn_width: int = 8  # small_cnn width: a step is compute-bound, tens to hundreds of ms on one core
    data_workers: int = 1  # DataLoader worker processes on the raw side (Ray Data runs its own tasks)
    p3_preset: str = "digits"
    p4_epochs: int = 8


# ----------------------------------------------------------------------------------------------------------
# statistics and output


def summary(values: Iterable[float]) -> dict:
    """median/min/max/n of the finite values (all None when there are none)."""
    vals = [float(v) for v in values if v is not None and np.isfinite(v)]
    if not vals:
        return {"median": None, "min": None, "max": None, "n": 0}
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "n": len(vals)}


def figure(name: str, unit: str, values: list[Optional[float]], *, target: Optional[str] = None,
           met: Optional[bool] = None, **extra) -> dict:
    """One figure: the per-round values, their summary, and the target it is judged against (if any)."""
    row = {"figure": name, "unit": unit, **summary(values), "rounds": values}
    if target is not None:
        row["target"] = target
        row["met"] = met if row["median"] is not None else None  # nothing measured: neither met nor missed
    row.update(extra)
    return row


def skipped(name: str, reason: str) -> dict:
    return {"figure": name, "skipped": reason}


def ratios(numerators: list[Optional[float]], denominators: list[Optional[float]]) -> list[Optional[float]]:
    """Per-round ratios: each round's two sides ran back to back, so their ratio cancels most machine drift."""
    return [n / d if n is not None and d else None for n, d in zip(numerators, denominators)]


def cpu_busy_seconds() -> Optional[float]:
    """CPU time the whole machine has spent busy since boot (all cores, /proc/stat), or None off Linux. The
    difference over a window, against window x cores, says whether the cores were the bottleneck."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def machine_info() -> dict:
    import torch

    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        import ray

        ray_version = ray.__version__
    except ImportError:
        ray_version = None
    return {
        "cpu": model, "cores": os.cpu_count(), "load_avg_at_start": list(os.getloadavg()),
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "python": platform.python_version(), "torch": torch.__version__, "ray": ray_version,
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }


def write_results(out_dir: Path, machine: dict, settings: BenchSettings, figures: list[dict]) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "results.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps({"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "machine": machine,
                               "settings": asdict(settings), "figures": figures}, indent=1) + "\n")
    os.replace(tmp, path)
    return path


def markdown(figures: list[dict], machine: dict, settings: BenchSettings) -> str:
    """The figures as a Markdown table (what docs/benchmarks.md shows), with the machine they came from."""
    def num(v):
        return "-" if v is None else f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"

    lines = [f"Machine: {machine.get('cores')} cores ({machine.get('cpu')}), {machine.get('memory_gib')} GiB, "
             f"load average {machine.get('load_avg_at_start', [0])[0]:.1f} at the start; torch {machine.get('torch')}, "
             f"Ray {machine.get('ray')}; {settings.rounds} interleaved rounds.", "",
             "| figure | unit | median | min | max | rounds | target | met |", "|---|---|---|---|---|---|---|---|"]
    for f in figures:
        if "skipped" in f or "error" in f:
            why = f"skipped: {f['skipped']}" if "skipped" in f else f"error: {f['error'].splitlines()[0][:120]}"
            lines.append(f"| {f['figure']} | | | | | | {why} | |")
            continue
        met = "" if f.get("met") is None else ("yes" if f["met"] else "no")
        lines.append(f"| {f['figure']} | {f['unit']} | {num(f['median'])} | {num(f['min'])} | {num(f['max'])} | "
                     f"{f['n']} | {f.get('target', '')} | {met} |")
    return "\n".join(lines) + "\n"


def chart(figures: list[dict], path: Path, title: str) -> Path:
    """One panel per part: bars at the median, whiskers from min to max, a dashed line at the target."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_name = {f["figure"]: f for f in figures if "median" in f and f.get("median") is not None}
    panels = [
        ("P1 training throughput (samples/s)", ["p1_raw_torch_samples_per_s", "p1_ray_train_samples_per_s"],
         ["raw torch", "Ray Train"], None),
        ("P1 Ray Train / raw torch", ["p1_ratio"], ["ratio"], TARGETS["p1_ratio"]),
        ("P2 ingest, no model (batches/s)", ["p2_dataloader_batches_per_s", "p2_ray_data_batches_per_s"],
         ["DataLoader", "Ray Data"], None),
        ("P2 share of step time waiting for data", ["p2_wait_share_raw_torch", "p2_wait_share_ray_train"],
         ["raw torch", "Ray Train"], TARGETS["p2_wait_share"]),
        ("P3 submission to first step (s)", ["p3_running_cluster_s", "p3_cold_embedded_s"],
         ["running cluster", "cold embedded"], TARGETS["p3_running_s"]),
        ("P4 node kill to next step (s)", ["p4_kill_to_next_step_s", "p4_detected_to_next_step_s"],
         ["from kill", "from detection"], TARGETS["p4_next_step_s"]),
        ("Scaling on 2 nodes (samples/s)", ["scaling_1_worker_samples_per_s", "scaling_2_workers_samples_per_s"],
         ["1 worker", "2 workers"], None),
        ("GPU ViT bf16 (samples/s)", ["gpu_vit_raw_torch_samples_per_s", "gpu_vit_ray_train_samples_per_s"],
         ["raw torch", "Ray Train"], None),
    ]
    panels = [p for p in panels if any(name in by_name for name in p[1])]
    cols = 2
    rows = max(1, (len(panels) + cols - 1) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(11, 3.2 * rows), squeeze=False)
    for ax, (label, names, ticks, target) in zip(axes.flat, panels):
        present = [(n, t) for n, t in zip(names, ticks) if n in by_name]
        meds = [by_name[n]["median"] for n, _ in present]
        lows = [by_name[n]["median"] - by_name[n]["min"] for n, _ in present]
        highs = [by_name[n]["max"] - by_name[n]["median"] for n, _ in present]
        xs = range(len(present))
        ax.bar(xs, meds, yerr=[lows, highs], capsize=6, color=["#4c72b0", "#dd8452", "#55a868"][: len(present)])
        ax.set_xticks(list(xs), [t for _, t in present])
        for x, m in zip(xs, meds):
            ax.annotate(f"{m:.0f}" if m >= 100 else f"{m:.3g}", (x, m), ha="center", va="bottom", xytext=(0, 3), textcoords="offset points")
        if target is not None:
            ax.axhline(target, linestyle="--", color="#c44e52", label=f"target {target:g}")
            ax.legend(loc="lower right", fontsize=8)
        ax.set_title(label, fontsize=10)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ----------------------------------------------------------------------------------------------------------
# the workload: CIFAR-shaped data, the same decode/normalise and the same timed loop on both sides


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


class TimedBatches:
    """Wraps a batch iterator: records how long each `next()` waited, and stops after `limit` batches."""

    def __init__(self, batches: Iterable, limit: int):
        self.source, self.limit = iter(batches), limit
        self.waits: list[float] = []

    def __iter__(self) -> Iterator:
        for _ in range(self.limit):
            began = time.perf_counter()
            try:
                batch = next(self.source)
            except StopIteration:
                return
            self.waits.append(time.perf_counter() - began)
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

    def on_step(step: int) -> None:
        marks.append(time.perf_counter())
        cpu_marks.append(time.process_time())

    began = time.perf_counter()
    stats = train_epoch(model, timed, optimizer, F.cross_entropy, on_step=on_step)
    if len(marks) < warmup + 2:
        raise RuntimeError(f"only {len(marks)} batches arrived; the dataset is smaller than warmup + steps")
    window = marks[-1] - marks[warmup - 1] if warmup else marks[-1] - began
    timed_steps = len(marks) - warmup
    per_step = stats.samples / max(len(marks), 1)
    # waits[i] precedes step i+1; the window holds steps warmup+1 .. end, whose waits are waits[warmup:].
    waiting = sum(timed.waits[warmup:len(marks)])
    # CPU seconds of the training process over the same window: on a shared, loaded machine, samples per CPU
    # second compares the two sides' own cost even when their share of the CPU differs.
    cpu = cpu_marks[-1] - cpu_marks[warmup - 1] if warmup else cpu_marks[-1]
    return {"samples_per_s": timed_steps * per_step / window, "step_s": window / timed_steps,
            "wait_share": waiting / window, "steps": timed_steps,
            "samples_per_cpu_s": timed_steps * per_step / cpu if cpu > 0 else None}


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
    from raytrain.models import SmallCNNParams, build_small_cnn

    return build_small_cnn(SmallCNNParams(in_channels=3, num_classes=10, width=width, dropout=0.0))


def dataset_size(s: BenchSettings, num_workers: int = 1) -> int:
    """Enough samples for every worker to run warmup + steps (and the ingest batches) within one epoch."""
    return max(s.warmup_steps + s.steps, s.ingest_batches + 1) * s.batch_size * num_workers


# ----------------------------------------------------------------------------------------------------------
# p1 + p2: raw torch in a fresh process, Ray Train with one worker on an embedded Ray


def in_fresh_process(function: str, params: dict) -> dict:
    """Call raytrain.bench.<function>(params) in a new Python process (as a Ray Train worker is one) and return
    its result; parameters and result travel as JSON over stdin/stdout."""
    code = ("import json, sys; from raytrain import bench; "
            f"r = bench.{function}(json.load(sys.stdin)); sys.stdout.write('\\nBENCH-RESULT ' + json.dumps(r) + '\\n')")
    # Ray starts its workers with OMP_NUM_THREADS set to their CPUs; the raw side gets the same thread settings.
    threads = str(params.get("torch_threads", 1))
    env = {**os.environ, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
    proc = subprocess.run([sys.executable, "-c", code], input=json.dumps(params), capture_output=True, text=True,
                          env=env)
    for line in proc.stdout.splitlines():
        if line.startswith("BENCH-RESULT "):
            return json.loads(line.split(" ", 1)[1])
    raise RuntimeError(f"{function} failed (exit {proc.returncode}): {proc.stderr.strip()[-2000:]}")


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

    from raytrain.launcher import CONTROLLER_POLL_INTERVAL_S

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


def bench_throughput(s: BenchSettings, work: Path, log: Callable[[str], None]) -> list[dict]:
    """p1 and p2, interleaved: each round runs both sides back to back, alternating which goes first."""
    import logging

    import ray

    temp = tempfile.mkdtemp(prefix="rtb", dir="/tmp")
    ray.init(address="local", include_dashboard=False, logging_level=logging.WARNING, _temp_dir=temp,
             num_cpus=os.cpu_count())
    raw: list[dict] = []
    rt: list[dict] = []
    try:
        dataset = ray_dataset(s)
        for r in range(s.rounds):
            for side in (("torch", "ray") if r % 2 == 0 else ("ray", "torch")):
                if side == "torch":
                    raw.append(in_fresh_process("raw_torch_side", asdict(s)))
                else:
                    rt.append(ray_train_side(s, dataset, str(work / "ray-results")))
            log(f"round {r + 1}/{s.rounds}: raw torch {raw[-1]['train']['samples_per_s']:.0f} samples/s, "
                f"Ray Train {rt[-1]['train']['samples_per_s']:.0f} samples/s")
    finally:
        ray.shutdown()
        shutil.rmtree(temp, ignore_errors=True)
    torch_sps = [r["train"]["samples_per_s"] for r in raw]
    ray_sps = [r["train"]["samples_per_s"] for r in rt]
    ratio = ratios(ray_sps, torch_sps)
    cpu_ratio = ratios([r["train"].get("samples_per_cpu_s") for r in rt], [r["train"].get("samples_per_cpu_s") for r in raw])
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


# ----------------------------------------------------------------------------------------------------------
# p3, p4, scaling: a real local multi-node cluster shaped like the chart's (head with num-cpus 0, worker nodes),
# jobs submitted with `ray job submit` as KubeRay's submitter does


# Log lines that mark the phases between submission and the first step (arrival times of `ray job logs`).
PHASE_MARKERS = {
    "driver_connected_s": "raytrain: joined Ray cluster",
    "trainer_built_s": "raytrain: training ",
    "worker_group_requested_s": "Attempting to start training worker group",
    "worker_group_started_s": "Started training worker group",
    "failure_detected_s": "[FailurePolicy]",
}


def bench_cluster(shared_dir: Path, worker_nodes: int = 2, cpus_per_node: float = 2.0,
                  out: Optional[TextIO] = None):
    """A head (num-cpus 0 and failure detection, as the chart sets them) plus worker nodes, token auth on. Nodes on
    their own loopback addresses: what is timed here is Ray and raytrain, not the network namespaces."""
    from raytrain.kube.localcluster import FAILURE_DETECTION_ENV, ClusterShape, LocalCluster, NodeSpec

    shape = ClusterShape(
        head=NodeSpec("head", "head", True, num_cpus=0, memory=2 * 2**30, env=dict(FAILURE_DETECTION_ENV)),
        workers=[NodeSpec(f"worker-{i}", "worker", False, num_cpus=cpus_per_node, memory=3 * 2**30)
                 for i in range(worker_nodes)],
        auth_token=True)
    cluster = LocalCluster(shape, out=out or sys.stderr, isolation="loopback", shared_dir=shared_dir)
    try:
        cluster.start(timeout=300)  # generous: the machine may be shared and busy
    except BaseException:
        cluster.stop()
        raise
    return cluster


class FollowedJob:
    """A job submitted like KubeRay's submitter does, its log followed with each line's arrival time."""

    def __init__(self, cluster, entrypoint: str, working_dir: Path, job_id: str):
        import threading

        self.cluster, self.job_id = cluster, job_id
        self.env = cluster.client_env()
        ray_bin = str(Path(sys.executable).parent / "ray")
        address = ["--address", cluster.dashboard_url]
        self.submitted = time.time()
        subprocess.run([ray_bin, "job", "submit", *address, "--no-wait", "--submission-id", job_id,
                        "--runtime-env-json", json.dumps({"working_dir": str(working_dir)}), "--",
                        *shlex.split(entrypoint)], env=self.env, check=True, capture_output=True, text=True)
        self.submit_returned = time.time()
        self.lines: list[tuple[float, str]] = []
        self.follower = subprocess.Popen([ray_bin, "job", "logs", *address, "--follow", job_id], env=self.env,
                                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.follower.stdout:
            self.lines.append((time.time(), line.rstrip()))

    def first(self, marker: str, after: float = 0.0) -> Optional[float]:
        return next((t for t, line in list(self.lines) if marker in line and t >= after), None)

    def wait(self, timeout: float = 600) -> str:
        try:
            self.follower.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.follower.kill()
        self.reader.join(timeout=5)
        status = subprocess.run([str(Path(sys.executable).parent / "ray"), "job", "status", "--address",
                                 self.cluster.dashboard_url, self.job_id], env=self.env, capture_output=True,
                                text=True)
        text = (status.stdout + status.stderr + "\n".join(line for _, line in self.lines[-5:])).upper()
        for state in ("SUCCEEDED", "FAILED", "STOPPED"):
            if state in text:
                return state
        return "UNKNOWN"

    def tail(self, n: int = 15) -> str:
        return "\n".join(line for _, line in self.lines[-n:])


def wait_event(run_dir: Path, event: str, after: float, timeout: float, alive: Callable[[], bool]) -> Optional[dict]:
    """The first `event` row written at or after `after` (worker clock = this machine's clock)."""
    from raytrain import runs

    deadline = time.time() + timeout
    while time.time() < deadline:
        for row in runs.read_events(run_dir):
            if row["event"] == event and row["time"] >= after:
                return row
        if not alive():
            return None
        time.sleep(0.05)
    return None


def job_dir(work: Path, name: str, config: Optional[Path] = None) -> Path:
    """The submitter's working dir: the run config as job.yaml, as the RayJob's ConfigMap carries it."""
    path = work / "jobs" / name
    path.mkdir(parents=True, exist_ok=True)
    if config is not None:
        shutil.copy(config, path / "job.yaml")
    return path


def p3_running_round(cluster, s: BenchSettings, work: Path, r: int) -> dict:
    """Submission to first optimizer step of `raytrain run PRESET --smoke-test` on the running cluster."""
    from raytrain.config import resolve_config_path

    name = f"p3-{r}-{time.time_ns() % 10**8}"
    storage = cluster.shared_path("/mnt/shared/runs")
    wd = job_dir(work, name, resolve_config_path(s.p3_preset))
    busy_before = cpu_busy_seconds()
    job = FollowedJob(cluster, f"raytrain run job.yaml --smoke-test --name {name} --storage {storage} "
                               f"--address auto", wd, name)
    run_dir = cluster.shared_dir / "runs" / name
    t0 = job.submitted
    step = wait_event(run_dir, "first_step", t0, 300, lambda: job.follower.poll() is None)
    busy_after, seen = cpu_busy_seconds(), time.time()
    start = wait_event(run_dir, "start", t0, 1, lambda: False)
    state = job.wait()
    phases = {"submit_cli_s": job.submit_returned - t0}
    for key, marker in PHASE_MARKERS.items():
        t = job.first(marker, t0)
        if t is not None and key != "failure_detected_s":
            phases[key] = t - t0
    if start:
        phases["worker_ready_s"] = start["time"] - t0
    if step is None:
        raise RuntimeError(f"p3: job {name} reached no training step ({state}); its log ends:\n{job.tail()}")
    phases["first_step_s"] = step["time"] - t0
    if busy_before is not None and busy_after is not None:
        # All processes on the machine (the cluster's own daemons included) from submission to the first step.
        phases["cpu_busy_s"] = busy_after - busy_before
        phases["cpu_busy_share"] = phases["cpu_busy_s"] / ((seen - t0) * (os.cpu_count() or 1))
    return phases


def p3_cold_round(s: BenchSettings, work: Path, r: int) -> dict:
    """Process start to first optimizer step of `raytrain run PRESET --smoke-test` on an embedded Ray."""
    from raytrain import runs

    name = f"cold-{r}"
    storage = work / "cold"
    temp = tempfile.mkdtemp(prefix="rtb", dir="/tmp")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env["RAY_TMPDIR"] = temp  # its own Ray temp dir, never the shared /tmp/ray
    t0 = time.time()
    proc = subprocess.Popen([sys.executable, "-m", "raytrain.cli", "run", s.p3_preset, "--smoke-test", "--name",
                             name, "--storage", str(storage)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        step = wait_event(runs.run_dir_of(str(storage), name), "first_step", t0, 300, lambda: proc.poll() is None)
        output, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
        shutil.rmtree(temp, ignore_errors=True)
    if step is None:
        raise RuntimeError(f"p3 cold: no training step; output ends:\n{output[-2000:]}")
    return {"first_step_s": step["time"] - t0}


def controller_log_time(temp_dirs: Iterable[Path], marker: str, after: float) -> Optional[float]:
    """When Ray Train's controller first logged `marker` at or after `after` (epoch seconds), read from its JSON
    log files in the nodes' session directories. The driver does not receive the controller's output (raytrain
    runs Ray with log_to_driver=False), but Ray keeps it in logs/train/ray-train-*-controller-*.log."""
    times = []
    for temp_dir in temp_dirs:
        for log in Path(temp_dir).glob("session_*/logs/train/ray-train-*-controller-*.log"):
            for line in log.read_text(errors="replace").splitlines():
                if marker not in line:
                    continue
                try:
                    stamp = json.loads(line)["asctime"]  # "2026-11-21 11:23:33,411", the node's local time
                    seconds, millis = stamp.split(",")
                    at = time.mktime(time.strptime(seconds, "%Y-%m-%d %H:%M:%S")) + int(millis) / 1000
                except (ValueError, KeyError):
                    continue
                if at >= after:
                    times.append(at)
    return min(times, default=None)


def p4_round(cluster, s: BenchSettings, work: Path, r: int) -> dict:
    """Kill a worker node mid-run (all its processes, as a lost pod), start it again as the RayCluster controller
    would, and time the next optimizer step; count the completed epochs that are trained again."""
    from raytrain import runs
    from raytrain.config import resolve_config_path
    from raytrain.kube.localcluster import kill_node, node_processes

    name = f"p4-{r}-{time.time_ns() % 10**8}"
    storage = cluster.shared_path("/mnt/shared/runs")
    wd = job_dir(work, name, resolve_config_path(s.p3_preset))
    job = FollowedJob(cluster, f"raytrain run job.yaml --name {name} --storage {storage} --address auto "
                               f"--set train.epochs={s.p4_epochs} --set run.checkpoint_every=1 "
                               f"--set run.max_failures=3", wd, name)
    run_dir = cluster.shared_dir / "runs" / name
    alive = lambda: job.follower.poll() is None  # noqa: E731
    deadline = time.time() + 300
    while alive() and time.time() < deadline and len(runs.read_metrics(run_dir)) < 2:
        time.sleep(0.05)
    completed = len(runs.read_metrics(run_dir))
    if completed < 2:
        job.wait(60)
        raise RuntimeError(f"p4: job {name} did not reach epoch 2; its log ends:\n{job.tail()}")
    time.sleep(0.3)  # into the next epoch, between checkpoints
    completed = max(row["epoch"] for row in runs.read_metrics(run_dir))
    # The node that holds a training worker (Ray packs both onto one node when they fit).
    state_file = cluster.run_dir / "state.json"
    hosts = [n for n in cluster.nodes[1:] if node_processes(state_file, n.spec.name, "RayTrainWorker")]
    victim = hosts[0] if hosts else cluster.nodes[-1]
    t_kill = time.time()
    kill_node(cluster.run_dir / "state.json", victim.spec.name)
    # KubeRay recreates a lost worker pod at once, on whichever machine has room and on that pod's own CPU
    # limit. Here every node shares the same two cores, so a replacement started now would compete with the
    # recovery for CPU. It starts after the next step instead, or after 120 s if the job needs it to go on.
    step = wait_event(run_dir, "first_step", t_kill, 120, alive)
    cluster.restart_node(victim)
    node_back_before_step = step is None
    if step is None:
        step = wait_event(run_dir, "first_step", t_kill, 300, alive)
    restarted = wait_event(run_dir, "start", t_kill, 1, alive)
    state = job.wait()
    if step is None or restarted is None:
        raise RuntimeError(f"p4: job {name} did not train again after the node kill ({state}); its log ends:\n"
                           f"{job.tail()}")
    # The log's timestamps have millisecond resolution; a detection logged within that of the kill still counts.
    detected = controller_log_time([Path(n.temp_dir) for n in cluster.nodes], PHASE_MARKERS["failure_detected_s"],
                                   t_kill - 0.001)
    resumed = restarted.get("resumed_from_epoch") or 0
    return {"killed_node": victim.spec.name, "kill_to_next_step_s": step["time"] - t_kill,
            "detected_to_next_step_s": step["time"] - detected if detected else None,
            "kill_to_detected_s": detected - t_kill if detected else None,
            "epochs_completed_at_kill": completed, "resumed_from_epoch": resumed,
            "completed_epochs_lost": completed - resumed, "node_back_before_step": node_back_before_step,
            "job_status": state}


def cluster_throughput_job(params: dict) -> dict:
    """Entrypoint of a scaling job on the cluster: the p1 Ray Train side with N workers, one per node."""
    import logging

    import ray

    s = BenchSettings(**params["settings"])
    ray.init(address="auto", logging_level=logging.WARNING)
    result = ray_train_side(s, ray_dataset(s, params["num_workers"]), params["storage"], params["num_workers"],
                            ingest=False, cpus_per_worker=1.0, placement="SPREAD")
    Path(params["result_path"]).write_text(json.dumps(result))
    return result


def scaling_round(cluster, s: BenchSettings, work: Path, num_workers: int, r: int) -> Optional[float]:
    name = f"scale-{num_workers}-{r}-{time.time_ns() % 10**8}"
    wd = job_dir(work, name)
    shared = cluster.shared_path("/mnt/shared/bench")
    (cluster.shared_dir / "bench").mkdir(parents=True, exist_ok=True)
    params = {"settings": asdict(s), "num_workers": num_workers, "storage": shared,
              "result_path": f"{shared}/{name}.json"}
    (wd / "params.json").write_text(json.dumps(params))
    code = "import json; from raytrain import bench; bench.cluster_throughput_job(json.load(open('params.json')))"
    job = FollowedJob(cluster, f"{shlex.quote(sys.executable)} -c {shlex.quote(code)}", wd, name)
    state = job.wait()
    result_file = cluster.shared_dir / "bench" / f"{name}.json"
    if state != "SUCCEEDED" or not result_file.exists():
        raise RuntimeError(f"scaling job {name} {state}; its log ends:\n{job.tail()}")
    result = json.loads(result_file.read_text())
    return result["train"]["samples_per_s"] * result["world_size"]  # DDP steps in lockstep: every rank's rate


def bench_cluster_parts(s: BenchSettings, work: Path, log: Callable[[str], None],
                        emit: Callable[[list[dict]], None], attempt: Callable[[str, Callable], None]) -> None:
    """p3 (running and cold, interleaved), scaling (1 and 2 workers, interleaved) and p4 on one local cluster."""
    log("starting a local cluster: head (num-cpus 0) + 2 worker nodes, token auth")
    cluster = bench_cluster(work / "shared")

    def p3() -> None:
        running, cold = [], []
        for r in range(s.rounds):
            for side in (("running", "cold") if r % 2 == 0 else ("cold", "running")):
                if side == "running":
                    running.append(p3_running_round(cluster, s, work, r))
                else:
                    cold.append(p3_cold_round(s, work, r))
            log(f"p3 round {r + 1}: running cluster {running[-1]['first_step_s']:.1f}s "
                f"({', '.join(f'{k} {v:.1f}' for k, v in running[-1].items())}), cold {cold[-1]['first_step_s']:.1f}s")
        first = [x["first_step_s"] for x in running]
        med = summary(first)["median"]
        phases = {k: summary([x.get(k) for x in running])["median"] for k in running[0]}
        emit([figure("p3_running_cluster_s", "s", first, target=f"<= {TARGETS['p3_running_s']}",
                     met=med is not None and med <= TARGETS["p3_running_s"], preset=f"{s.p3_preset} --smoke-test",
                     phase_medians_s=phases, cluster="head num-cpus 0 + 2 worker nodes, token auth"),
              figure("p3_cold_embedded_s", "s", [x["first_step_s"] for x in cold],
                     preset=f"{s.p3_preset} --smoke-test")])

    def scaling() -> None:
        one, two = [], []
        for r in range(s.rounds):
            for n in ((1, 2) if r % 2 == 0 else (2, 1)):
                (one if n == 1 else two).append(scaling_round(cluster, s, work, n, r))
            log(f"scaling round {r + 1}: 1 worker {one[-1]:.0f} samples/s, 2 workers {two[-1]:.0f} samples/s")
        common = {"per_worker_batch": s.batch_size, "torch_threads": s.torch_threads,
                  "note": f"2 worker nodes on one {os.cpu_count()}-core machine: CPU-bound, measured not claimed"}
        emit([figure("scaling_1_worker_samples_per_s", "samples/s", one, **common),
              figure("scaling_2_workers_samples_per_s", "samples/s", two, **common),
              figure("scaling_2_over_1", "x", ratios(two, one), **common)])

    def p4() -> None:
        rows = []
        for r in range(s.rounds):
            rows.append(p4_round(cluster, s, work, r))
            log(f"p4 round {r + 1}: " + ", ".join(f"{k} {v}" for k, v in rows[-1].items()))
        lost = [x["completed_epochs_lost"] for x in rows]
        nxt = [x["detected_to_next_step_s"] for x in rows]
        med = summary(nxt)["median"]
        emit([figure("p4_kill_to_next_step_s", "s", [x["kill_to_next_step_s"] for x in rows]),
              figure("p4_kill_to_detected_s", "s", [x["kill_to_detected_s"] for x in rows]),
              figure("p4_detected_to_next_step_s", "s", nxt, target=f"<= {TARGETS['p4_next_step_s']}",
                     met=med is not None and med <= TARGETS["p4_next_step_s"]),
              figure("p4_completed_epochs_lost", "epochs", lost, target="<= 1 (checkpoint_every)",
                     met=bool(lost) and max(lost) <= 1, checkpoint_every=1,
                     note="plus the partial epoch in flight at the kill")])

    try:
        for name, part in (("p3", p3), ("scaling", scaling), ("p4", p4)):
            if name in s.parts:
                attempt(name, part)
    finally:
        cluster.stop()


# ----------------------------------------------------------------------------------------------------------
# GPU: ViT with bf16, raw torch vs Ray Train, and MFU


def vit_train_flops_per_sample(params: int, tokens: int, layers: int, hidden: int) -> float:
    """Training FLOPs per sample: 6 * parameters * tokens for the matmuls, plus attention's 12 * L * T^2 * d."""
    return 6.0 * params * tokens + 12.0 * layers * tokens**2 * hidden


def gpu_vit_side(params: dict) -> dict:
    import torch

    from raytrain.models import ViTParams, build_vit

    s = BenchSettings(**params)
    p = ViTParams()
    device = torch.device("cuda")
    model = build_vit(p).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(s.batch_size, 3, p.image_size, p.image_size, device=device)
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
    tokens = (p.image_size // p.patch_size) ** 2 + 1
    return {"samples_per_s": s.steps * s.batch_size / seconds,
            "flops_per_sample": vit_train_flops_per_sample(n_params, tokens, p.num_layers, p.hidden_dim),
            "device": torch.cuda.get_device_name(0)}


def _gpu_ray_worker(loop_config: dict) -> None:
    Path(loop_config["result_path"]).write_text(json.dumps(gpu_vit_side(loop_config["settings"])))


def bench_gpu(s: BenchSettings, work: Path, log: Callable[[str], None]) -> list[dict]:
    import torch

    if not torch.cuda.is_available():
        return [skipped("gpu_vit", "no CUDA device")]
    import logging

    import ray
    import ray.train
    from ray.train.torch import TorchTrainer

    temp = tempfile.mkdtemp(prefix="rtb", dir="/tmp")
    ray.init(address="local", include_dashboard=False, logging_level=logging.WARNING, _temp_dir=temp)
    raw, rt = [], []
    try:
        for r in range(s.rounds):
            for side in (("torch", "ray") if r % 2 == 0 else ("ray", "torch")):
                if side == "torch":
                    raw.append(in_fresh_process("gpu_vit_side", asdict(s)))
                else:
                    result_path = work / f"gpu-{r}.json"
                    trainer = TorchTrainer(
                        _gpu_ray_worker, train_loop_config={"settings": asdict(s), "result_path": str(result_path)},
                        scaling_config=ray.train.ScalingConfig(num_workers=1, use_gpu=True),
                        run_config=ray.train.RunConfig(name=f"bench-gpu-{time.time_ns()}",
                                                       storage_path=str(work / "ray-results")))
                    trainer.fit()
                    rt.append(json.loads(result_path.read_text()))
            log(f"gpu round {r + 1}: raw {raw[-1]['samples_per_s']:.0f}, Ray Train {rt[-1]['samples_per_s']:.0f}")
    finally:
        ray.shutdown()
        shutil.rmtree(temp, ignore_errors=True)
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


# ----------------------------------------------------------------------------------------------------------
# the whole benchmark


def run_bench(s: BenchSettings, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    """Run the selected parts; print one JSON line per figure; write results.json and bench.png. Returns 0."""
    out_dir = Path(s.out_dir).absolute()
    work = Path(tempfile.mkdtemp(prefix="raytrain-bench-"))

    def log(message: str) -> None:
        print(f"bench: {message}", file=err, flush=True)

    machine = machine_info()
    log(f"{machine['cores']} cores ({machine['cpu']}), load average {machine['load_avg_at_start'][0]:.1f}; "
        f"{s.rounds} interleaved rounds; parts {', '.join(s.parts)}")
    figures: list[dict] = []

    def emit(rows: list[dict]) -> None:
        for row in rows:
            print(json.dumps(row), file=out, flush=True)
        figures.extend(rows)
        write_results(out_dir, machine, s, figures)

    def attempt(name: str, part: Callable[[], None]) -> None:
        """A part that fails is reported as a figure with its error; the other parts still run."""
        try:
            part()
        except Exception as error:  # noqa: BLE001 - reported, not hidden
            log(f"{name} failed: {error}")
            text = str(error)
            emit([{"figure": name, "error": text if len(text) <= 1500 else f"{text[:300]} ... {text[-1200:]}"}])

    try:
        if "p1" in s.parts or "p2" in s.parts:
            attempt("p1_p2", lambda: emit(bench_throughput(s, work, log)))
        if any(p in s.parts for p in ("p3", "p4", "scaling")):
            attempt("cluster", lambda: bench_cluster_parts(s, work, log, emit, attempt))
        if "gpu" in s.parts:
            attempt("gpu", lambda: emit(bench_gpu(s, work, log)))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    path = write_results(out_dir, machine, s, figures)
    (out_dir / "results.md").write_text(markdown(figures, machine, s))
    png = chart(figures, out_dir / "bench.png",
                f"raytrain bench: {machine['cores']} cores, {machine['cpu']}, "
                f"{s.rounds} rounds (bars: median, whiskers: min-max)")
    log(f"results {path}, chart {png}")
    return 0
