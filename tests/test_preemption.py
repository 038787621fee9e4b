"""Step boundaries on one worker (no process group): step-count checkpoints land on their step, a stop request
in lease.json is seen within the poll interval, a takeover ends the worker without a checkpoint, a draining node
checkpoints and ends the group."""

from __future__ import annotations

import json
import time

import torch

from raytrain import lease as leases
from raytrain.preemption import POLL_S, StepBoundary


def boundary(tmp_path, **kw):
    return StepBoundary(tmp_path, 3, every_steps=kw.get("every_steps", 0), every_s=kw.get("every_s", 0.0),
                        is_rank_zero=True, device=torch.device("cpu"))


def write_lease(tmp_path, token, stop=None):
    record = {"token": token, "host": "h", "pid": 1, "since": 0, "renewed": time.time(), "ttl_s": 30}
    (tmp_path / leases.LEASE_FILE).write_text(json.dumps({**record, **({"stop": stop} if stop else {})}))


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
    while not (decision := b.decide()).stop:
        assert time.monotonic() - began < POLL_S + 1
        time.sleep(0.01)
    assert decision.checkpoint and not decision.lost and b.reason == "SIGTERM"

    write_lease(tmp_path, 4)
    b = boundary(tmp_path)
    while not (decision := b.decide()).stop:
        time.sleep(0.01)
    assert decision.lost and not decision.checkpoint and "attempt 4 took the run over" in b.reason


def test_a_draining_node_on_any_worker_checkpoints_and_ends_the_group_at_the_next_decision(tmp_path):
    draining = iter([False, False, True])
    b = StepBoundary(tmp_path, None, every_steps=0, every_s=0.0, is_rank_zero=False, device=torch.device("cpu"),
                     node_draining=lambda: next(draining))
    decisions = [b.decide() for _ in range(3)]
    assert [(d.checkpoint, d.drain, d.stop) for d in decisions] == [(False, False, False), (False, False, False),
                                                                    (True, True, False)]


def test_a_stop_request_wins_over_a_drain(tmp_path):
    write_lease(tmp_path, 3, stop="SIGTERM")
    b = StepBoundary(tmp_path, 3, every_steps=0, every_s=0.0, is_rank_zero=True, device=torch.device("cpu"),
                     node_draining=lambda: True)
    decision = b.decide(at_epoch_end=True)  # reads the stop request now
    assert decision.stop and not decision.drain
