"""Honest resume, decided before Ray starts: torn checkpoints removed, unloadable ones named, model/optimizer
changes refused naming the keys, optimizer settings applied to the restored optimizer."""

from __future__ import annotations

import json

import pytest
import torch

from raytrain import checkpoints, resume
from raytrain.resume import ResumeRefused

CONFIG = {"model": {"name": "mlp", "hidden": 32}, "train": {"optimizer": "adam", "lr": 0.01, "epochs": 9}}


def save(run_dir, epoch, config=CONFIG):
    path = run_dir / checkpoints.checkpoint_dir_name(epoch)
    model = torch.nn.Linear(2, 1)
    checkpoints.write_checkpoint(path, model_state=model.state_dict(),
                                 optimizer_state=torch.optim.Adam(model.parameters()).state_dict(),
                                 epoch=epoch, config=config)
    return path


def changed(**sections):
    return {section: {**CONFIG[section], **sections.get(section, {})} for section in CONFIG}


def test_torn_directories_are_removed_and_the_newest_whole_checkpoint_resumes(tmp_path):
    save(tmp_path, 2)
    whole = save(tmp_path, 4)
    empty_state = save(tmp_path, 6)
    (empty_state / checkpoints.STATE_FILE).write_bytes(b"")  # disk full
    no_meta = tmp_path / "checkpoint_epoch000008_aaaaaaaa"
    no_meta.mkdir()  # a crash before anything was written
    cut = save(tmp_path, 10)
    state = cut / checkpoints.STATE_FILE
    state.write_bytes(state.read_bytes()[:50])  # an upload cut short
    warnings = []
    plan = resume.plan(tmp_path, changed(train={"epochs": 20}), warnings.append)
    assert plan.checkpoint == whole and plan.epoch == 4 and plan.applied == {}
    assert sorted(plan.removed_torn) == sorted([empty_state.name, no_meta.name, cut.name])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([whole.name, next(tmp_path.glob("*epoch000002*")).name])
    assert all("a torn write, removed; falling back" in w for w in warnings) and len(warnings) == 3


def test_a_torn_checkpoint_that_ray_registered_is_left_for_ray_and_skipped(tmp_path):
    whole = save(tmp_path, 2)
    torn = save(tmp_path, 4)
    (torn / checkpoints.STATE_FILE).write_bytes(b"")
    (tmp_path / resume.RAY_SNAPSHOT).write_text(json.dumps(
        {"checkpoint_results": [{"checkpoint_dir_name": whole.name}, {"checkpoint_dir_name": torn.name}]}))
    warnings = []
    plan = resume.plan(tmp_path, CONFIG, warnings.append)
    assert plan.checkpoint == whole and torn.exists() and plan.removed_torn == []
    assert "cannot be loaded and are skipped" in warnings[0] and torn.name in warnings[0]


def test_checkpoints_that_exist_but_none_loads_refuse_the_start_naming_them(tmp_path):
    bad = save(tmp_path, 3)
    state = bad / checkpoints.STATE_FILE
    state.write_bytes(b"x" * state.stat().st_size)  # complete in size, corrupted
    with pytest.raises(ResumeRefused) as refused:
        resume.plan(tmp_path, CONFIG, lambda _: None)
    assert bad.name in str(refused.value) and "does not match the hash" in str(refused.value)
    assert "new --name" in str(refused.value) and "delete these" in str(refused.value)
    assert bad.exists()  # refused, not cleaned: it is evidence, not a torn write


@pytest.mark.parametrize("config, named", [
    (changed(model={"hidden": 64}), ["model.hidden: 32 in the checkpoint, 64 now", "--set model.hidden=32"]),
    (changed(model={"depth": 3}), ["model.depth: None in the checkpoint, 3 now"]),
    (changed(train={"optimizer": "sgd"}), ["train.optimizer: 'adam' in the checkpoint, 'sgd' now"]),
])
def test_changes_a_resume_cannot_apply_are_refused_naming_the_keys(tmp_path, config, named):
    save(tmp_path, 5)
    with pytest.raises(ResumeRefused) as refused:
        resume.plan(tmp_path, config, lambda _: None)
    message = str(refused.value)
    assert all(text in message for text in named), message
    assert "another --name" in message


def test_optimizer_settings_are_planned_and_applied_to_the_restored_optimizer(tmp_path):
    save(tmp_path, 5)
    plan = resume.plan(tmp_path, changed(train={"lr": 0.5}), lambda _: None)
    assert plan.applied == {"train.lr": (0.01, 0.5)}

    model = torch.nn.Linear(2, 1)
    sgd = torch.optim.SGD(model.parameters(), lr=0.003, momentum=0.9, weight_decay=0.0)  # a scheduler moved lr
    resume.apply_optimizer_settings(sgd, {"train.weight_decay": (0.0, 0.01)})
    assert sgd.param_groups[0]["lr"] == 0.003  # unchanged by the user: left to the scheduler
    assert sgd.param_groups[0]["weight_decay"] == 0.01
    resume.apply_optimizer_settings(sgd, plan.applied)
    assert sgd.param_groups[0]["lr"] == 0.5


def test_no_checkpoint_trains_from_scratch(tmp_path):
    plan = resume.plan(tmp_path, CONFIG, lambda _: None)
    assert plan.checkpoint is None and plan.epoch == 0


def test_old_checkpoints_without_config_in_meta_are_compared_from_their_state(tmp_path):
    path = save(tmp_path, 5)
    meta = json.loads((path / checkpoints.META_FILE).read_text())
    del meta["config"], meta["size"]
    (path / checkpoints.META_FILE).write_text(json.dumps(meta))
    with pytest.raises(ResumeRefused, match="model.hidden"):
        resume.plan(tmp_path, changed(model={"hidden": 8}), lambda _: None)
