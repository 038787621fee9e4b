"""p3: seconds from job submission to the first optimizer step of `raytrain run PRESET --smoke-test`, on an
already running local multi-node cluster (`ray job submit`, as KubeRay's submitter does) and cold (`raytrain run`
starting an embedded Ray), interleaved round by round.

The running-cluster rounds also say where the time went (phases, seconds after submission), each read from a
record Ray or the run keeps: the submitter CLI returning, Ray Train's controller actor being created (the
trainer is built and fit() has started; Ray's task events), Ray Train's controller asking for and getting its
worker group (its log files on the nodes), rank 0 ready (the run's `start` event), and the machine's busy CPU share."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from bench.cluster import (TRAIN_CONTROLLER_CLASS, WORKER_GROUP_REQUESTED, WORKER_GROUP_STARTED, FollowedJob,
                           actor_created_time, controller_log_time, first_step_time, probe_file, run_started,
                           timed_job_dir)
from bench.harness import TARGETS, BenchSettings, cpu_busy_seconds, figure, interleaved, summary
from bench.workload import own_ray_env


def p3_running_round(cluster, s: BenchSettings, work: Path, r: int) -> dict:
    """Submission to first optimizer step of `raytrain run PRESET --smoke-test` on the running cluster."""
    name = f"p3-{r}-{time.time_ns() % 10**8}"
    storage = cluster.shared_path("/mnt/shared/runs")
    wd = timed_job_dir(work, name, s.p3_preset, str(probe_file(Path(storage) / name)))
    busy_before = cpu_busy_seconds()
    job = FollowedJob(cluster, f"raytrain run job.yaml --smoke-test --name {name} --storage {storage} "
                               f"--address auto", wd, name)
    run_dir = cluster.shared_dir / "runs" / name
    t0 = job.submitted
    step = first_step_time(run_dir, t0, 300, job.alive)
    busy_after, seen = cpu_busy_seconds(), time.time()
    start = run_started(run_dir, t0, 1, lambda: False)
    state = job.wait()
    if step is None:
        raise RuntimeError(f"p3: job {name} reached no training step ({state}); its log ends:\n{job.tail()}")
    phases = {"submit_cli_s": job.submit_returned - t0}
    controller = actor_created_time(cluster.dashboard_url, job.env, TRAIN_CONTROLLER_CLASS, t0, step)
    if controller is not None:
        phases["controller_created_s"] = controller - t0
    for key, marker in (("worker_group_requested_s", WORKER_GROUP_REQUESTED),
                        ("worker_group_started_s", WORKER_GROUP_STARTED)):
        t = controller_log_time([Path(n.temp_dir) for n in cluster.nodes], marker, t0)
        if t is not None:
            phases[key] = t - t0
    if start:
        phases["worker_ready_s"] = start["time"] - t0
    phases["first_step_s"] = step - t0
    if busy_before is not None and busy_after is not None:
        # All processes on the machine (the cluster's own daemons included) from submission to the first step.
        phases["cpu_busy_s"] = busy_after - busy_before
        phases["cpu_busy_share"] = phases["cpu_busy_s"] / ((seen - t0) * (os.cpu_count() or 1))
    return phases


def p3_cold_round(s: BenchSettings, work: Path, r: int) -> dict:
    """Process start to first optimizer step of `raytrain run job.yaml --smoke-test` on an embedded Ray, started in
    a working dir like the running side's."""
    from raytrain.rundir import runrecords

    name = f"cold-{r}"
    run_dir = runrecords.run_dir_of(str(work / "cold"), name)
    wd = timed_job_dir(work, name, s.p3_preset, str(probe_file(run_dir)))
    output = ""
    with own_ray_env() as env:
        t0 = time.time()
        proc = subprocess.Popen([sys.executable, "-m", "raytrain.cli", "run", "job.yaml", "--smoke-test", "--name",
                                 name, "--storage", str(run_dir.parent)], cwd=wd, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            step = first_step_time(run_dir, t0, 300, lambda: proc.poll() is None)
            output, _ = proc.communicate(timeout=300)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
    if step is None:
        raise RuntimeError(f"p3 cold: no training step; output ends:\n{output[-2000:]}")
    return {"first_step_s": step - t0}


def bench_first_step(cluster, s: BenchSettings, work: Path, log: Callable[[str], None]) -> list[dict]:
    """p3, the running and the cold side interleaved."""
    def after_round(r: int, sides: dict) -> None:
        running, cold = sides["running"][-1], sides["cold"][-1]
        log(f"p3 round {r + 1}: running cluster {running['first_step_s']:.1f}s "
            f"({', '.join(f'{k} {v:.1f}' for k, v in running.items())}), cold {cold['first_step_s']:.1f}s")

    sides = interleaved(s.rounds, {"running": lambda r: p3_running_round(cluster, s, work, r),
                                   "cold": lambda r: p3_cold_round(s, work, r)}, after_round)
    running, cold = sides["running"], sides["cold"]
    first = [x["first_step_s"] for x in running]
    med = summary(first)["median"]
    phase_names = list(dict.fromkeys(k for x in running for k in x))
    phases = {k: summary([x.get(k) for x in running])["median"] for k in phase_names}
    return [figure("p3_running_cluster_s", "s", first, target=f"<= {TARGETS['p3_running_s']}",
                   met=med is not None and med <= TARGETS["p3_running_s"], preset=f"{s.p3_preset} --smoke-test",
                   phase_medians_s=phases, cluster="head num-cpus 0 + 2 worker nodes, token auth"),
            figure("p3_cold_embedded_s", "s", [x["first_step_s"] for x in cold],
                   preset=f"{s.p3_preset} --smoke-test")]
