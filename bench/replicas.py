"""p4ft: a worker node SIGKILLed mid-epoch under scaling.fault_tolerance torchft against restart, side by side in
each round on the same workload and the same kill: the node that holds rank 1 (rank 0, whose steps the probe
records, survives under torchft). For each side: the longest pause of rank 0's training steps from the kill on
(the survivors' stall; under restart, rank 0 is restarted with the group), the time until the lost worker trains
again (torchft: its replacement's heal; restart: the new group's start), and the completed steps trained again."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

from bench.cluster import FollowedJob, probe_file, steps_lost, timed_job_dir, trained_steps
from bench.harness import BenchSettings, figure, logged_rounds
from bench.recovery import past_half_of_epoch

SIDES = ("restart", "torchft")
WINDOW_S = 90.0  # rank 0's steps are looked at this long after the kill
# Longer than p4's 8: the survivor must still be training when Ray Train's replacement joins (10-30 s after the kill
# here), or the replacement finds the run finished and there is no heal to time
EPOCHS = 60


def p4ft_round(cluster, s: BenchSettings, work: Path, r: int, side: str) -> dict:
    from raytrain.cluster.pods import kill_node, node_processes
    from raytrain.rundir import runrecords

    name = f"p4ft-{side}-{r}-{time.time_ns() % 10**8}"
    storage = cluster.shared_path("/mnt/shared/runs")
    wd = timed_job_dir(work, name, s.p3_preset, str(probe_file(Path(storage) / name)), every_step=True)
    # One worker per node (each takes a node's 2 CPUs), so that a node's loss is one worker's
    job = FollowedJob(cluster, f"raytrain run job.yaml --name {name} --storage {storage} --address auto "
                               f"--set train.epochs={EPOCHS} --set run.checkpoint_every=1 --set run.max_failures=3 "
                               f"--set scaling.num_workers=2 --set scaling.cpus_per_worker=2 "
                               f"--set scaling.fault_tolerance={side}", wd, name)
    run_dir = cluster.shared_dir / "runs" / name
    deadline = time.time() + 300
    while job.alive() and time.time() < deadline and not past_half_of_epoch(run_dir, 3):
        time.sleep(0.05)
    if not past_half_of_epoch(run_dir, 3):
        job.wait(60)
        raise RuntimeError(f"p4ft {side}: job {name} did not reach the middle of epoch 3; its log ends:\n{job.tail()}")
    rank0 = {row["pid"] for row in runrecords.read_jsonl(probe_file(run_dir))}
    state = cluster.run_dir / "state.json"
    hosts = [n for n in cluster.nodes[1:] if node_processes(state, n.spec.name, "RayTrainWorker")]
    others = [n for n in hosts if not set(node_processes(state, n.spec.name)) & rank0]
    if not others:
        job.wait(60)
        raise RuntimeError(f"p4ft {side}: no worker node without rank 0 (hosts {[n.spec.name for n in hosts]})")
    victim = others[0]
    t_gone = time.time()
    kill_node(state, victim.spec.name)
    at_event, _ = trained_steps(run_dir, t_gone)
    # KubeRay recreates the pod: here the node starts again at once (it has the replacement's CPUs)
    cluster.restart_node(victim)
    end = job.wait()
    events = runrecords.read_events(run_dir)
    later = [e for e in events if e["time"] >= t_gone]
    restarted = next((e for e in later if e.get("event") == "start"), None)
    healed = next((e for e in later if e.get("event") == "healed"), None)
    trained_at = next((e["time"] for e in events if e.get("event") == "trained"), None)
    # torchft: the replacement's heal; restart: the new group's start. A start after the run had trained all its
    # epochs (a replacement that found it finished) is no rejoining
    back = healed if side == "torchft" else restarted
    if back is not None and trained_at is not None and back["time"] > trained_at:
        back = None
    from bench.probes import FORWARD

    forwards = sorted(row["time"] for row in runrecords.read_jsonl(probe_file(run_dir))
                      if row.get("event") == FORWARD and row.get("train"))
    before = [t for t in forwards if t <= t_gone]
    window = [t for t in forwards if t_gone < t <= t_gone + WINDOW_S]
    marks = before[-1:] + window
    stall = max((b - a for a, b in zip(marks, marks[1:])), default=None)
    if restarted is not None and (trained_at is None or restarted["time"] < trained_at):
        lost = steps_lost(at_event, restarted.get("resumed_from_epoch"), restarted.get("resumed_at_step"))
    else:
        lost = 0  # no group started again: nothing was restored, every replica went on from where it was
    rows = runrecords.read_metrics(run_dir)
    return {"side": side, "node": victim.spec.name, "stall_s": stall,
            "to_rejoined_s": back["time"] - t_gone if back else None,
            "rejoined_by": back.get("event") if back else None,
            "completed_steps_trained_again": lost,
            "steps_retried": sum(int(row.get("replica_steps_retried") or 0) for row in rows),
            "replicas_in_sync": [row.get("replicas_in_sync") for row in rows if "replicas_in_sync" in row],
            "samples_per_epoch": [row.get("samples") for row in rows],
            "steps_before_kill": len(at_event), "job_status": end}


def bench_replicas(cluster, s: BenchSettings, work: Path, log: Callable[[str], None]) -> list[dict]:
    """p4ft: the two sides interleaved, each round one run per side."""
    results = logged_rounds(s.rounds, SIDES, lambda r, name: p4ft_round(cluster, s, work, r, name), log, "p4ft")
    figures = []
    for side in SIDES:
        rows = results[side]
        figures += [
            figure(f"p4ft_{side}_stall_s", "s", [x["stall_s"] for x in rows],
                   **({"target": "<= 5", "met": all(x["stall_s"] is not None and x["stall_s"] <= 5 for x in rows)}
                      if side == "torchft" else {})),
            figure(f"p4ft_{side}_to_rejoined_s", "s", [x["to_rejoined_s"] for x in rows]),
            figure(f"p4ft_{side}_completed_steps_trained_again", "steps",
                   [x["completed_steps_trained_again"] for x in rows],
                   **({"target": "0", "met": all(x["completed_steps_trained_again"] == 0 for x in rows)}
                      if side == "torchft" else {}))]
    return figures
