"""Step control at step boundaries on one worker (no process group): step-count checkpoints land on their step, a stop request
in lease.json is seen within the poll interval, a takeover ends the worker without a checkpoint, a draining node
checkpoints and ends the group."""

from __future__ import annotations

import json
import time

import torch

from raytrain.lifecycle.endings import Ending
from raytrain.rundir import layout
from raytrain.rundir.runcontrol import UNFENCED, WorkerControl
from raytrain.worker.stepcontrol import POLL_S, SYNC_S, StepControl


def boundary(tmp_path, **kw):
    return StepControl(WorkerControl(tmp_path, 3), every_steps=kw.get("every_steps", 0),
                       every_s=kw.get("every_s", 0.0), is_rank_zero=True, device=torch.device("cpu"))


def write_lease(tmp_path, token, stop=None):
    record = {"token": token, "host": "h", "pid": 1, "since": 0, "renewed": time.time(), "ttl_s": 30}
    (tmp_path / layout.LEASE_FILE).write_text(json.dumps({**record, **({"stop": stop} if stop else {})}))


def test_step_count_checkpoints_fall_on_their_steps(tmp_path):
    write_lease(tmp_path, 3)
    b = boundary(tmp_path, every_steps=7)
    due = []
    for step in range(1, 30):
        if b.decide().checkpoint:
            due.append(step)
            b.checkpointed()
    assert due == [7, 14, 21, 28]


def test_a_stop_request_is_seen_within_the_poll_interval_and_a_takeover_ends_without_a_checkpoint(tmp_path):
    write_lease(tmp_path, 3, stop="SIGTERM")
    b = boundary(tmp_path)
    began = time.monotonic()
    while (decision := b.decide()).ending is None:
        assert time.monotonic() - began < POLL_S + SYNC_S + 2  # a bound, with room for a loaded machine
        time.sleep(0.01)
    assert decision.ending is Ending.STOPPED and decision.checkpoint and decision.reason == "SIGTERM"

    write_lease(tmp_path, 4)
    b = boundary(tmp_path)
    while (decision := b.decide()).ending is None:
        time.sleep(0.01)
    assert decision.ending is Ending.LEASE_LOST and not decision.checkpoint
    assert "attempt 4 took the run over" in decision.reason


def test_a_draining_node_on_any_worker_checkpoints_and_ends_the_group_at_the_next_decision(tmp_path):
    draining = iter([False, False, True])
    b = StepControl(UNFENCED, every_steps=0, every_s=0.0, is_rank_zero=False, device=torch.device("cpu"),
                    node_draining=lambda: next(draining))
    decisions = [b.decide() for _ in range(3)]
    assert [(d.checkpoint, d.ending) for d in decisions] == [(False, None), (False, None), (True, Ending.DRAINING)]


def test_a_stop_request_wins_over_a_drain(tmp_path):
    write_lease(tmp_path, 3, stop="SIGTERM")
    b = StepControl(WorkerControl(tmp_path, 3), every_steps=0, every_s=0.0, is_rank_zero=True,
                    device=torch.device("cpu"), node_draining=lambda: True)
    decision = b.decide(at_epoch_end=True)  # reads the stop request now
    assert decision.ending is Ending.STOPPED
