"""bench/recovery.py: p4's figures for both sides, from the rows its rounds produce (the rounds themselves run a
real cluster: `scripts/bench p4`)."""

from __future__ import annotations

import torch

from bench import recovery
from tests.bench.support import probed_run, train_epochs


def _row(side, lost, per_epoch=11, detected=2.0, next_step=9.0):
    return {"side": side, "to_next_step_s": detected + next_step, "to_detected_s": detected,
            "detected_to_next_step_s": next_step, "completed_steps_lost": lost, "steps_per_epoch": per_epoch}


def _by_name(figures):
    return {f["figure"]: f for f in figures}


def test_both_sides_are_reported_side_by_side_with_their_targets():
    figures = _by_name(recovery.recovery_figures([_row("kill", 3), _row("kill", 5)],
                                                 [_row("delete", 0), _row("delete", 0)]))
    for side in recovery.SIDES:
        assert {f"p4_{side}_to_next_step_s", f"p4_{side}_to_detected_s", f"p4_{side}_detected_to_next_step_s",
                f"p4_{side}_completed_steps_lost"} <= figures.keys()
    kill, delete = figures["p4_kill_completed_steps_lost"], figures["p4_delete_completed_steps_lost"]
    assert kill["rounds"] == [3, 5] and kill["unit"] == "steps" and kill["met"] is True
    assert kill["target"] == "<= 1 interval (1 epoch = 11 steps)" and kill["steps_per_epoch"] == 11
    assert delete["rounds"] == [0, 0] and delete["target"] == "0" and delete["met"] is True


def test_a_lost_step_on_the_graceful_side_or_more_than_an_interval_on_the_kill_side_misses_the_target():
    figures = _by_name(recovery.recovery_figures([_row("kill", 12)], [_row("delete", 1)]))
    assert figures["p4_kill_completed_steps_lost"]["met"] is False
    assert figures["p4_delete_completed_steps_lost"]["met"] is False


def test_an_unknown_interval_is_not_called_met():
    figures = _by_name(recovery.recovery_figures([_row("kill", 0, per_epoch=None)], [_row("delete", 0)]))
    assert figures["p4_kill_completed_steps_lost"]["met"] is False
    assert figures["p4_kill_completed_steps_lost"]["target"] == "<= 1 interval (1 epoch = None steps)"


def test_no_detection_leaves_its_figures_empty_not_failed():
    figures = _by_name(recovery.recovery_figures([_row("kill", 0) | {"detected_to_next_step_s": None,
                                                                     "to_detected_s": None}], [_row("delete", 0)]))
    assert figures["p4_kill_detected_to_next_step_s"]["median"] is None
    assert figures["p4_kill_detected_to_next_step_s"]["met"] is None
    assert figures["p4_delete_detected_to_next_step_s"]["met"] is True


def test_the_node_goes_away_once_rank_zero_completed_half_of_the_epoch(tmp_path):
    run_dir, model = probed_run(tmp_path, "p4-kill-0")
    train_epochs(model, [4, 4])  # epochs of 4 steps
    train_epochs(model, [2], evaluate=False)  # epoch 3's first two forward passes
    assert not recovery.past_half_of_epoch(run_dir, 3)  # epoch 3's second step began: not known done
    model(torch.randn(2, 4))  # the third began: the second is done
    assert recovery.past_half_of_epoch(run_dir, 3)
