"""What every part shares: the settings, interleaved rounds, figure rows (one JSON line each on stdout) and
results.json, which is rewritten after every part so that a part that fails later loses nothing."""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterable, Optional, TextIO, TypeVar

ALL_PARTS = ("p1", "p2", "p1core", "ckptread", "p3", "p4", "p4ft", "p5", "scaling", "shrink", "e2e", "gpu")
TARGETS = {"p1_ratio": 0.97, "p2_wait_share": 0.05, "p3_running_s": 8.0, "p4_next_step_s": 10.0, "p1core_ratio": 0.97,
           "ckptread_ratio": 2.0, "p5_blocked_ratio": 0.10, "shrink_s": 15.0,
           "e2e_ratio": 1.0}
RESULTS_FILE = "results.json"
# The directory that holds the bench package (it is not installed): processes and jobs started by the benchmark
# get it on their import path, or a copy of the package in their working dir.
BENCH_ROOT = Path(__file__).resolve().parent.parent

T = TypeVar("T")


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
    p5_batch_size: int = 8  # global batch of the gpt preset's model in p5 (sequences of its block size)
    p5_checkpoint_every: int = 2  # p5: steps between checkpoints
    p5_checkpoints: int = 3  # p5: checkpoints per side and round
    p5_memory_steps: int = 3  # p5: training steps per side and round for the peak memory


# ----------------------------------------------------------------------------------------------------------
# rounds and figures


def interleaved(rounds: int, sides: dict[str, Callable[[int], T]],
                after_round: Optional[Callable[[int, dict[str, list[T]]], None]] = None) -> dict[str, list[T]]:
    """Each round runs every side once, back to back: in the given order on even rounds, reversed on odd ones, so
    that machine noise and warm caches hit the sides alike. Returns each side's per-round results."""
    results: dict[str, list[T]] = {name: [] for name in sides}
    order = list(sides)
    for r in range(rounds):
        for name in order if r % 2 == 0 else order[::-1]:
            results[name].append(sides[name](r))
        if after_round is not None:
            after_round(r, results)
    return results


def logged_rounds(rounds: int, sides: Iterable[str], one_round: Callable[[int, str], dict],
                  log: Callable[[str], None], part: str) -> dict[str, list[dict]]:
    """interleaved() over sides whose rounds each return a row (a dict with a "side"), each row logged as a line."""
    def side(name: str) -> Callable[[int], dict]:
        def one(r: int) -> dict:
            row = one_round(r, name)
            log(f"{part} round {r + 1} {name}: " + ", ".join(f"{k} {v}" for k, v in row.items() if k != "side"))
            return row
        return one

    return interleaved(rounds, {name: side(name) for name in sides})


def summary(values: Iterable[Optional[float]]) -> dict:
    """median/min/max/n of the finite values (all None when there are none)."""
    vals = [float(v) for v in values if v is not None and math.isfinite(v)]
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


# ----------------------------------------------------------------------------------------------------------
# the machine


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


# ----------------------------------------------------------------------------------------------------------
# output


def write_results(out_dir: Path, machine: dict, settings: BenchSettings, figures: list[dict]) -> Path:
    from raytrain.rundir.atomicfile import write_atomic

    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / RESULTS_FILE
    write_atomic(path, json.dumps({"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "machine": machine,
                                   "settings": asdict(settings), "figures": figures}, indent=1) + "\n")
    return path


class Results:
    """The figures of one invocation: each printed as one JSON line on `out` as it is measured, all of them kept
    in OUT_DIR/results.json; progress goes to `err`."""

    def __init__(self, settings: BenchSettings, machine: dict, out: TextIO = sys.stdout, err: TextIO = sys.stderr):
        self.settings, self.machine, self.out, self.err = settings, machine, out, err
        self.out_dir = Path(settings.out_dir).absolute()
        self.figures: list[dict] = []

    def log(self, message: str) -> None:
        print(f"bench: {message}", file=self.err, flush=True)

    def emit(self, rows: list[dict]) -> None:
        for row in rows:
            print(json.dumps(row), file=self.out, flush=True)
        self.figures.extend(rows)
        self.write()

    def attempt(self, name: str, part: Callable[[], None]) -> None:
        """A part that fails is reported as a figure with its error; the other parts still run."""
        try:
            part()
        except Exception as error:  # noqa: BLE001 - reported, not hidden
            self.log(f"{name} failed: {error}")
            text = str(error)
            self.emit([{"figure": name, "error": text if len(text) <= 1500 else f"{text[:300]} ... {text[-1200:]}"}])

    def write(self) -> Path:
        return write_results(self.out_dir, self.machine, self.settings, self.figures)
