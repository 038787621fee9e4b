"""p4: seconds from a worker-node kill (every process of the node, as a lost pod) to the next optimizer step, from
Ray Train's failure decision to that step, and the completed epochs that are trained again."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

from bench.cluster import (FAILURE_DECIDED, FollowedJob, controller_log_time, first_step_time, kill_training_node,
                           probe_file, run_started, timed_job_dir)
from bench.harness import TARGETS, BenchSettings, figure, summary


def p4_round(cluster, s: BenchSettings, work: Path, r: int) -> dict:
    """Kill a worker node mid-run, start it again as the RayCluster controller would, and time the next optimizer
    step; count the completed epochs that are trained again."""
    from raytrain import runs

    name = f"p4-{r}-{time.time_ns() % 10**8}"
    storage = cluster.shared_path("/mnt/shared/runs")
    wd = timed_job_dir(work, name, s.p3_preset, str(probe_file(Path(storage) / name)))
    job = FollowedJob(cluster, f"raytrain run job.yaml --name {name} --storage {storage} --address auto "
                               f"--set train.epochs={s.p4_epochs} --set run.checkpoint_every=1 "
                               f"--set run.max_failures=3", wd, name)
    run_dir = cluster.shared_dir / "runs" / name
    deadline = time.time() + 300
    while job.alive() and time.time() < deadline and len(runs.read_metrics(run_dir)) < 2:
        time.sleep(0.05)
    if len(runs.read_metrics(run_dir)) < 2:
        job.wait(60)
        raise RuntimeError(f"p4: job {name} did not reach epoch 2; its log ends:\n{job.tail()}")
    time.sleep(0.3)  # into the next epoch, between checkpoints
    completed = max(row["epoch"] for row in runs.read_metrics(run_dir))
    victim, t_kill = kill_training_node(cluster)
    # KubeRay recreates a lost worker pod at once, on whichever machine has room and on that pod's own CPU
    # limit. Here every node shares the same two cores, so a replacement started now would compete with the
    # recovery for CPU. It starts after the next step instead, or after 120 s if the job needs it to go on.
    step = first_step_time(run_dir, t_kill, 120, job.alive)
    cluster.restart_node(victim)
    node_back_before_step = step is None
    if step is None:
        step = first_step_time(run_dir, t_kill, 300, job.alive)
    restarted = run_started(run_dir, t_kill, 1, job.alive)
    state = job.wait()
    if step is None or restarted is None:
        raise RuntimeError(f"p4: job {name} did not train again after the node kill ({state}); its log ends:\n"
                           f"{job.tail()}")
    # The log's timestamps have millisecond resolution; a detection logged within that of the kill still counts.
    detected = controller_log_time([Path(n.temp_dir) for n in cluster.nodes], FAILURE_DECIDED, t_kill - 0.001)
    resumed = restarted.get("resumed_from_epoch") or 0
    return {"killed_node": victim.spec.name, "kill_to_next_step_s": step - t_kill,
            "detected_to_next_step_s": step - detected if detected else None,
            "kill_to_detected_s": detected - t_kill if detected else None,
            "epochs_completed_at_kill": completed, "resumed_from_epoch": resumed,
            "completed_epochs_lost": completed - resumed, "node_back_before_step": node_back_before_step,
            "job_status": state}


def bench_recovery(cluster, s: BenchSettings, work: Path, log: Callable[[str], None]) -> list[dict]:
    """p4: one side only, so its rounds simply follow one another."""
    rows = []
    for r in range(s.rounds):
        rows.append(p4_round(cluster, s, work, r))
        log(f"p4 round {r + 1}: " + ", ".join(f"{k} {v}" for k, v in rows[-1].items()))
    lost = [x["completed_epochs_lost"] for x in rows]
    nxt = [x["detected_to_next_step_s"] for x in rows]
    med = summary(nxt)["median"]
    return [figure("p4_kill_to_next_step_s", "s", [x["kill_to_next_step_s"] for x in rows]),
            figure("p4_kill_to_detected_s", "s", [x["kill_to_detected_s"] for x in rows]),
            figure("p4_detected_to_next_step_s", "s", nxt, target=f"<= {TARGETS['p4_next_step_s']}",
                   met=med is not None and med <= TARGETS["p4_next_step_s"]),
            figure("p4_completed_epochs_lost", "epochs", lost, target="<= 1 (checkpoint_every)",
                   met=bool(lost) and max(lost) <= 1, checkpoint_every=1,
                   note="plus the partial epoch in flight at the kill")]
