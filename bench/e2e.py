"""e2e: a short run on a running cluster, end to end (`ray job submit` to the job's end), against upstream's minimal
Ray Train job on the same cluster: the same model (MLP 1-32-1), data (200 samples of y = 2x + 1), one epoch, 2
workers of 1 CPU, Adam, a global batch of 24, DDP (`prepare_model`), one `ray.train.report` at the end.

Sides, interleaved round by round:
- "raytrain": `raytrain run linear --set train.epochs=1 ...` as a RayJob's submitter runs it;
- "raytrain_ray_interval": the same with the job's `RAY_metrics_report_interval_ms=10000` (Ray's default, what every
  run used before raytrain set a short interval for its workers): rank 0 then lingers 11 s for its last metrics;
- "upstream": bench/e2e.py's UPSTREAM script.

Each side's phases, in seconds after submission: the submitter returning, the workers' loop starting (raytrain's
`start` event; upstream's own printed line), the loop's end (raytrain's last epoch row; upstream's line after its
report), and the job's end (Ray's job record: its end_time, what a RayJob's status follows)."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Callable

from bench.cluster import FollowedJob, job_dir
from bench.harness import TARGETS, BenchSettings, figure, logged_rounds, summary

SIDES = ("raytrain", "raytrain_ray_interval", "upstream")
ARGS = ("--set train.epochs=1 --set scaling.num_workers=2 --set scaling.cpus_per_worker=1 "
        "--set run.checkpoint_every=1")

# Upstream's minimal Ray Train (V2) job, as its docs' quickstart writes it, on the linear preset's workload.
UPSTREAM = '''
import sys, time

import ray.train
import ray.train.torch
import torch
from ray.train.torch import TorchTrainer


def train_func():
    print(f"E2E_LOOP_START {time.time()}", flush=True)
    x = (torch.arange(200, dtype=torch.float32) / 200.0).reshape(-1, 1)
    data = torch.utils.data.TensorDataset(x, 2 * x + 1)
    loader = ray.train.torch.prepare_data_loader(torch.utils.data.DataLoader(data, batch_size=12, shuffle=True))
    model = ray.train.torch.prepare_model(torch.nn.Sequential(torch.nn.Linear(1, 32), torch.nn.ReLU(),
                                                              torch.nn.Linear(32, 1)))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=0.01)
    for xb, yb in loader:
        loss = torch.nn.functional.mse_loss(model(xb), yb)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    ray.train.report({"loss": loss.item()})
    print(f"E2E_LOOP_END {time.time()}", flush=True)


TorchTrainer(train_func, scaling_config=ray.train.ScalingConfig(num_workers=2),
             run_config=ray.train.RunConfig(name=sys.argv[2], storage_path=sys.argv[1])).fit()
'''
MARK = re.compile(r"E2E_(LOOP_START|LOOP_END) ([0-9.]+)")


def e2e_round(cluster, work: Path, r: int, side: str) -> dict:
    from raytrain.rundir import runrecords

    name = f"e2e-{side}-{r}-{time.time_ns() % 10**8}"
    storage = cluster.shared_path("/mnt/shared/runs")
    wd = job_dir(work, name)
    if side == "upstream":
        (wd / "upstream.py").write_text(UPSTREAM)
        entry = f"python upstream.py {storage} {name}"
    else:
        entry = f"raytrain run linear {ARGS} --name {name} --storage {storage} --address auto"
    job = FollowedJob(cluster, entry, wd, name, runtime_env_vars=(
        {"RAY_metrics_report_interval_ms": "10000"} if side == "raytrain_ray_interval" else None))
    state = job.wait(300)
    t0 = job.submitted
    row = {"side": side, "job_status": state, "submit_cli_s": job.submit_returned - t0}
    if side == "upstream":
        for line in job.lines:
            m = MARK.search(line)
            if m:  # two workers print each: rank 0's start is the first, the group's end the last
                key = "loop_start_s" if m.group(1) == "LOOP_START" else "loop_end_s"
                at = float(m.group(2)) - t0
                row[key] = min(row.get(key, at), at) if key == "loop_start_s" else max(row.get(key, at), at)
    else:
        run_dir = cluster.shared_dir / "runs" / name
        starts = [e for e in runrecords.read_events(run_dir) if e.get("event") == "start"]
        rows = runrecords.read_metrics(run_dir)
        if starts:
            row["loop_start_s"] = starts[0]["time"] - t0
        ends = [x["timing"]["time"] for x in rows if isinstance(x.get("timing"), dict) and "time" in x["timing"]]
        if ends:
            row["loop_end_s"] = ends[-1] - t0
    ended = job.ended_at()
    row["job_end_from"] = "ray" if ended is not None else "log"  # Ray's job record, else the log follower's end
    row["job_end_s"] = (ended or job.ended or time.time()) - t0
    if state != "SUCCEEDED":
        raise RuntimeError(f"e2e {side}: job {name} ended {state}; its log ends:\n{job.tail()}")
    return row


def bench_e2e(cluster, s: BenchSettings, work: Path, log: Callable[[str], None]) -> list[dict]:
    results = logged_rounds(s.rounds, SIDES, lambda r, side: e2e_round(cluster, work, r, side), log, "e2e")
    return e2e_figures(results)


def e2e_figures(results: dict[str, list[dict]]) -> list[dict]:
    """Each side's end-to-end seconds with its phase medians, and raytrain's ratio to upstream per round."""
    figures = []
    for side in SIDES:
        rows = results[side]
        phases = {k: summary([x.get(k) for x in rows])["median"]
                  for k in ("submit_cli_s", "loop_start_s", "loop_end_s", "job_end_s")}
        figures.append(figure(f"e2e_{side}_s", "s", [x["job_end_s"] for x in rows], phase_medians_s=phases))
    ratios = [a["job_end_s"] / b["job_end_s"] for a, b in zip(results["raytrain"], results["upstream"])]
    med = summary(ratios)["median"]
    figures.append(figure("e2e_raytrain_over_upstream", "x", ratios, target=f"<= {TARGETS['e2e_ratio']:g}",
                          met=med is not None and med <= TARGETS["e2e_ratio"],
                          workload="linear, 1 epoch, 2 workers x 1 CPU, a running cluster"))
    return figures
