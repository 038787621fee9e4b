"""scaling: samples/s of the p1 Ray Train side with 1 and with 2 workers (SPREAD: one per worker node) on the
local cluster, interleaved round by round. Each run is a job of its own, submitted as KubeRay's submitter does."""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable

from bench.cluster import FollowedJob, job_dir
from bench.harness import BenchSettings, figure, interleaved, ratios
from bench.workload import ray_dataset, ray_train_side


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


def scaling_round(cluster, s: BenchSettings, work: Path, num_workers: int, r: int) -> float:
    name = f"scale-{num_workers}-{r}-{time.time_ns() % 10**8}"
    wd = job_dir(work, name, ship_bench=True)  # the job runs bench code: the driver and its workers import it
    shared = cluster.shared_path("/mnt/shared/bench")
    (cluster.shared_dir / "bench").mkdir(parents=True, exist_ok=True)
    params = {"settings": asdict(s), "num_workers": num_workers, "storage": shared,
              "result_path": f"{shared}/{name}.json"}
    (wd / "params.json").write_text(json.dumps(params))
    code = ("import json; from bench.scaling import cluster_throughput_job; "
            "cluster_throughput_job(json.load(open('params.json')))")
    job = FollowedJob(cluster, f"{shlex.quote(sys.executable)} -c {shlex.quote(code)}", wd, name)
    state = job.wait()
    result_file = cluster.shared_dir / "bench" / f"{name}.json"
    if state != "SUCCEEDED" or not result_file.exists():
        raise RuntimeError(f"scaling job {name} {state}; its log ends:\n{job.tail()}")
    result = json.loads(result_file.read_text())
    return result["train"]["samples_per_s"] * result["world_size"]  # DDP steps in lockstep: every rank's rate


def bench_scaling(cluster, s: BenchSettings, work: Path, log: Callable[[str], None]) -> list[dict]:
    def after_round(r: int, sides: dict) -> None:
        log(f"scaling round {r + 1}: 1 worker {sides['1'][-1]:.0f} samples/s, "
            f"2 workers {sides['2'][-1]:.0f} samples/s")

    sides = interleaved(s.rounds, {"1": lambda r: scaling_round(cluster, s, work, 1, r),
                                   "2": lambda r: scaling_round(cluster, s, work, 2, r)}, after_round)
    one, two = sides["1"], sides["2"]
    common = {"per_worker_batch": s.batch_size, "torch_threads": s.torch_threads,
              "note": f"2 worker nodes on one {os.cpu_count()}-core machine: CPU-bound, measured not claimed"}
    return [figure("scaling_1_worker_samples_per_s", "samples/s", one, **common),
            figure("scaling_2_workers_samples_per_s", "samples/s", two, **common),
            figure("scaling_2_over_1", "x", ratios(two, one), **common)]
