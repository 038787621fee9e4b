"""p4: a worker node that holds a training worker goes away mid-run, two ways side by side in each round: "kill"
(SIGKILL of every process of the node, a lost pod) and "delete" (a graceful pod deletion as kubelet does it: the
chart's preStop hook `raytrain drain`, then SIGTERM, then SIGKILL after the grace period). For each: seconds to the
next optimizer step, from Ray Train's failure decision to that step, and the completed steps trained again."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

from bench.cluster import (FAILURE_DECIDED, FollowedJob, NodeDeletion, controller_log_time, first_step_time,
                           kill_training_node, probe_file, run_started, steps_lost, timed_job_dir, trained_steps)
from bench.harness import TARGETS, BenchSettings, figure, logged_rounds, summary

SIDES = ("kill", "delete")
CHECKPOINT_EVERY_EPOCHS = 1


def p4_round(cluster, s: BenchSettings, work: Path, r: int, side: str) -> dict:
    """Take the training worker's node away (`side`: "kill" or "delete") halfway into epoch 3, start it again as the
    RayCluster controller would, and time the next optimizer step; count the completed steps trained again: the
    steps the worker group knew finished before it ended (at the kill, or at a drained group's own checkpoint), past
    the point the run resumed from."""
    from raytrain.rundir import runrecords

    name = f"p4-{side}-{r}-{time.time_ns() % 10**8}"
    storage = cluster.shared_path("/mnt/shared/runs")
    wd = timed_job_dir(work, name, s.p3_preset, str(probe_file(Path(storage) / name)), every_step=True)
    job = FollowedJob(cluster, f"raytrain run job.yaml --name {name} --storage {storage} --address auto "
                               f"--set train.epochs={s.p4_epochs} --set run.checkpoint_every={CHECKPOINT_EVERY_EPOCHS} "
                               f"--set run.max_failures=3", wd, name)
    run_dir = cluster.shared_dir / "runs" / name
    deadline = time.time() + 300
    while job.alive() and time.time() < deadline and len(runrecords.read_metrics(run_dir)) < 2:
        time.sleep(0.05)
    if len(runrecords.read_metrics(run_dir)) < 2:
        job.wait(60)
        raise RuntimeError(f"p4 {side}: job {name} did not reach epoch 2; its log ends:\n{job.tail()}")
    # Halfway into epoch 3, between epoch checkpoints: what a SIGKILL loses there is visible, and what a deletion
    # keeps (its checkpoint mid-epoch) too.
    while job.alive() and time.time() < deadline and not past_half_of_epoch(run_dir, 3):
        time.sleep(0.05)
    if not past_half_of_epoch(run_dir, 3):
        job.wait(60)
        raise RuntimeError(f"p4 {side}: job {name} did not reach the middle of epoch 3; its log ends:\n{job.tail()}")
    deletion = None
    if side == "kill":
        victim, t_gone = kill_training_node(cluster)
    else:
        deletion = NodeDeletion(cluster)
        victim, t_gone = deletion.node, deletion.began
    # KubeRay recreates a lost worker pod at once, on whichever machine has room and on that pod's own CPU
    # limit. Here every node shares the same two cores, so a replacement started now would compete with the
    # recovery for CPU. It starts after the next step instead, or after 120 s if the job needs it to go on.
    step = first_step_time(run_dir, t_gone, 120, job.alive)
    outcome = deletion.wait() if deletion else {}
    cluster.restart_node(victim)
    node_back_before_step = step is None
    if step is None:
        step = first_step_time(run_dir, t_gone, 300, job.alive)
    restarted = run_started(run_dir, t_gone, 1, job.alive)
    state = job.wait()
    if step is None or restarted is None:
        raise RuntimeError(f"p4 {side}: job {name} did not train again after the node went away ({state}); its "
                           f"log ends:\n{job.tail()}")
    # The log's timestamps have millisecond resolution; a detection logged within that of the kill still counts.
    detected = controller_log_time([Path(n.temp_dir) for n in cluster.nodes], FAILURE_DECIDED, t_gone - 0.001)
    resume = restarted.get("resumed_from_epoch"), restarted.get("resumed_at_step")
    # Completed when the node went away, and by the time the next group started: a deleted pod's group trains on to
    # the step it checkpoints at, and those steps count too. A killed one's group ends at the kill: the same steps.
    at_event, steps_per_epoch = trained_steps(run_dir, t_gone)
    by_end, _ = trained_steps(run_dir, restarted["time"])
    row = {"side": side, "node": victim.spec.name, "to_next_step_s": step - t_gone,
           "detected_to_next_step_s": step - detected if detected else None,
           "to_detected_s": detected - t_gone if detected else None,
           "steps_completed_at_event": len(at_event), "last_step_at_event": list(at_event[-1]) if at_event else None,
           "steps_completed_by_group_end": len(by_end), "last_step_by_group_end": list(by_end[-1]) if by_end else None,
           "resumed_from_epoch": resume[0] or 0, "resumed_at_step": resume[1] or 0,
           "completed_steps_lost_at_event": steps_lost(at_event, *resume),
           "completed_steps_lost": steps_lost(by_end, *resume),
           "steps_per_epoch": steps_per_epoch, "node_back_before_step": node_back_before_step, "job_status": state}
    if deletion:
        row.update(pre_stop_rc=outcome.get("pre_stop_rc"), pre_stop_s=outcome.get("pre_stop_s"),
                   sigkilled=len(outcome.get("killed") or []))
    return row


def past_half_of_epoch(run_dir: Path, epoch: int) -> bool:
    """Whether rank 0 is known to have completed half of `epoch`'s steps (as many as a whole epoch before had)."""
    done, per_epoch = trained_steps(run_dir, time.time())
    return per_epoch is not None and any(e == epoch and s >= max(1, per_epoch // 2) for e, s in done)


def bench_recovery(cluster, s: BenchSettings, work: Path, log: Callable[[str], None]) -> list[dict]:
    """p4: the two sides interleaved, each round one run per side."""
    results = logged_rounds(s.rounds, SIDES, lambda r, name: p4_round(cluster, s, work, r, name), log, "p4")
    return recovery_figures(results["kill"], results["delete"])


def recovery_figures(kill: list[dict], delete: list[dict]) -> list[dict]:
    """The figures of both sides from their rounds' rows (p4_round)."""
    figures = []
    for side, rows in (("kill", kill), ("delete", delete)):
        nxt = [x["detected_to_next_step_s"] for x in rows]
        med = summary(nxt)["median"]
        figures += [
            figure(f"p4_{side}_to_next_step_s", "s", [x["to_next_step_s"] for x in rows]),
            figure(f"p4_{side}_to_detected_s", "s", [x["to_detected_s"] for x in rows]),
            figure(f"p4_{side}_detected_to_next_step_s", "s", nxt, target=f"<= {TARGETS['p4_next_step_s']}",
                   met=med is not None and med <= TARGETS["p4_next_step_s"])]
    kill_lost = [x["completed_steps_lost"] for x in kill]
    interval = min((x["steps_per_epoch"] for x in kill if x.get("steps_per_epoch")), default=None)
    note = ("steps rank 0 knew finished (its next forward pass had begun) before its worker group ended, at the kill "
            "or at the drained group's own checkpoint, that the resumed run trains again")
    figures.append(figure("p4_kill_completed_steps_lost", "steps", kill_lost,
                          target=f"<= 1 interval ({CHECKPOINT_EVERY_EPOCHS} epoch = {interval} steps)",
                          met=bool(kill_lost) and interval is not None and max(kill_lost) <= interval,
                          checkpoint_every=CHECKPOINT_EVERY_EPOCHS, steps_per_epoch=interval, note=note))
    delete_lost = [x["completed_steps_lost"] for x in delete]
    figures.append(figure("p4_delete_completed_steps_lost", "steps", delete_lost, target="0",
                          met=bool(delete_lost) and max(delete_lost) == 0, note=note))
    return figures
