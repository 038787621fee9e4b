"""shrink: an elastic run (`scaling.num_workers: [1, 2]`, one worker per node) whose training node's pod is deleted
mid-epoch (the chart's preStop hook drains it; the pod stays away), two sides in each round: "refresh" (raytrain's
controller callback has Ray's AutoscalingCoordinator leave the drained node out at the restart:
raytrain.worker.elastic) and "ray" (RAYTRAIN_ELASTIC_REFRESH_COORDINATOR=0: the coordinator as Ray made it, which
looks at the nodes every 20 s). For each: seconds from the deletion to the smaller group's first optimizer step,
the size that group started with, and whether a group start failed first (Ray Train's start timeout)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Callable

from bench.cluster import (FollowedJob, NodeDeletion, first_step_time, probe_file, ray_cli, run_started,
                           timed_job_dir)
from bench.harness import TARGETS, BenchSettings, figure, logged_rounds, summary

SIDES = ("refresh", "ray")


def shrink_round(cluster, s: BenchSettings, work: Path, r: int, side: str) -> dict:
    from raytrain.rundir import runrecords

    name = f"shrink-{side}-{r}-{time.time_ns() % 10**8}"
    storage = cluster.shared_path("/mnt/shared/runs")
    wd = timed_job_dir(work, name, s.p3_preset, str(probe_file(Path(storage) / name)), every_step=True)
    env = "RAYTRAIN_ELASTIC_REFRESH_COORDINATOR=0 " if side == "ray" else ""
    # Each worker takes a whole 2-CPU node: the deletion leaves room for one. Many epochs: the job is stopped once
    # the smaller group has stepped.
    job = FollowedJob(cluster, f"env {env}raytrain run job.yaml --name {name} --storage {storage} --address auto "
                               f"--set train.epochs=200 --set 'scaling.num_workers=[1, 2]' "
                               f"--set scaling.cpus_per_worker=2 --set data.loader=torch --set run.max_failures=3", wd, name)
    run_dir = cluster.shared_dir / "runs" / name
    deadline = time.time() + 300
    while job.alive() and time.time() < deadline and len(runrecords.read_metrics(run_dir)) < 1:
        time.sleep(0.05)
    started = [e for e in runrecords.read_events(run_dir) if e.get("event") == "start"]
    if not started or started[-1].get("world_size") != 2:
        job.wait(60)
        raise RuntimeError(f"shrink {side}: job {name} did not train an epoch on 2 workers ({started}); its log "
                           f"ends:\n{job.tail()}")
    time.sleep(0.5)  # into epoch 2
    deletion = NodeDeletion(cluster)
    t_gone = deletion.began
    step = first_step_time(run_dir, t_gone + 0.001, 180, job.alive)
    restarted = run_started(run_dir, t_gone, 1, job.alive)
    outcome = deletion.wait()
    subprocess.run([ray_cli(), "job", "stop", "--address", cluster.dashboard_url, name], env=job.env,
                   capture_output=True, text=True, timeout=120)
    state = job.wait(120)
    cluster.restart_node(deletion.node)  # the next round starts with both nodes again
    if step is None or restarted is None:
        raise RuntimeError(f"shrink {side}: job {name} did not train again after the deletion ({state}); its log "
                           f"ends:\n{job.tail()}")
    warnings = [e["message"] for e in runrecords.read_events(run_dir)
                if e.get("event") == "warning" and e.get("time", 0) >= t_gone]
    return {"side": side, "to_next_step_s": step - t_gone, "workers_after": restarted.get("world_size"),
            "failed_starts": sum("could not start the worker group" in m for m in warnings),
            "pre_stop_rc": outcome.get("pre_stop_rc"), "job_status": state}


def bench_shrink(cluster, s: BenchSettings, work: Path, log: Callable[[str], None]) -> list[dict]:
    results = logged_rounds(s.rounds, SIDES, lambda r, name: shrink_round(cluster, s, work, r, name), log, "shrink")
    return shrink_figures(results["refresh"], results["ray"])


def shrink_figures(refresh: list[dict], ray: list[dict]) -> list[dict]:
    """Both sides' figures from their rounds' rows (shrink_round)."""
    figures = []
    for name, rows in (("refresh", refresh), ("ray", ray)):
        seconds = [x["to_next_step_s"] for x in rows]
        extra = {"workers_after": [x["workers_after"] for x in rows],
                 "failed_starts": [x["failed_starts"] for x in rows]}
        if name == "refresh":
            med = summary(seconds)["median"]
            figures.append(figure("shrink_refresh_to_next_step_s", "s", seconds, target=f"<= {TARGETS['shrink_s']:g}",
                                  met=med is not None and med <= TARGETS["shrink_s"], **extra))
        else:
            figures.append(figure("shrink_ray_to_next_step_s", "s", seconds, **extra,
                                  note="RAYTRAIN_ELASTIC_REFRESH_COORDINATOR=0: Ray's AutoscalingCoordinator as Ray "
                                       "made it, as before raytrain refreshed it"))
    return figures
