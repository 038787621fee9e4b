"""Honest resume, decided before Ray starts: staging directories removed, committed checkpoints never deleted,
unloadable ones named, changes to what the loop declares fixed refused naming the keys, what it hands to raytrain
applied to the restored optimizer, and nothing fixed or applied for a loop that declares nothing."""

from __future__ import annotations

import json

import pytest
import torch

from raytrain.checkpoint import checkpoints, resume
from raytrain.checkpoint.checkpoints import FileCheckpointer, Position
from raytrain.checkpoint.resume import ResumeRefused, ResumeRules
from raytrain.loop import train_loop

CONFIG = {"model": {"_component_": "mlp", "hidden": 32},
          "train": {"optimizer": "adam", "lr": 0.01, "epochs": 9}}
BUILT_IN = resume.rules_of(train_loop)


def save(run_dir, epoch, config=CONFIG, step=0):
    model = torch.nn.Linear(2, 1)
    state = {"model": model.state_dict(), "optimizer": torch.optim.Adam(model.parameters()).state_dict(),
             "epoch": epoch, "step": step, "config": config, "extra": {}}
    return FileCheckpointer(run_dir, keep=50).save(Position(epoch, step), lambda: state, writer=True, config=config)


def plan(run_dir, config=CONFIG, warn=lambda _: None, rules=BUILT_IN):
    return resume.plan(run_dir, config, warn, rules, FileCheckpointer(run_dir))


def changed(**sections):
    return {section: {**CONFIG[section], **sections.get(section, {})} for section in CONFIG}


def test_staging_is_removed_and_a_damaged_committed_checkpoint_is_skipped_never_deleted(tmp_path):
    save(tmp_path, 2)
    whole = save(tmp_path, 4, step=3)
    empty_state = save(tmp_path, 6)
    (empty_state / checkpoints.STATE_FILE).write_bytes(b"")  # emptied later: a committed one, damaged
    staging = tmp_path / ".staging-checkpoint_epoch000008_aaaaaaaa"
    staging.mkdir()  # a crash while it was written: provably never committed
    warnings = []
    result = plan(tmp_path, changed(train={"epochs": 20}), warnings.append)
    assert result.checkpoint == whole and (result.epoch, result.step) == (4, 3) and result.applied == {}
    assert result.removed_staging == [staging.name] and not staging.exists()
    assert empty_state.exists()  # skipped, not deleted
    assert any("never committed" in w for w in warnings)
    assert any(empty_state.name in w and "skipped" in w for w in warnings)


@pytest.mark.parametrize("damage", ["meta", "meta-and-size"])
def test_a_damaged_manifest_beside_a_state_that_loads_still_resumes(tmp_path, damage):
    path = save(tmp_path, 5)
    (path / checkpoints.META_FILE).write_bytes(b"\x13\x37 twenty random bytes!")
    result = plan(tmp_path)
    assert result.checkpoint == path and result.epoch == 5 and path.exists()


def test_checkpoints_that_exist_but_none_loads_refuse_the_start_naming_them_and_keep_them(tmp_path):
    bad = save(tmp_path, 3)
    state = bad / checkpoints.STATE_FILE
    state.write_bytes(b"x" * state.stat().st_size)  # complete in size, corrupted
    also_bad = save(tmp_path, 4)
    (also_bad / checkpoints.META_FILE).write_bytes(b"{}")
    (also_bad / checkpoints.STATE_FILE).write_bytes(b"junk")
    with pytest.raises(ResumeRefused) as refused:
        plan(tmp_path)
    message = str(refused.value)
    assert bad.name in message and also_bad.name in message and "does not match the hash" in message
    assert "new --name" in message and "kept as they are" in message
    assert bad.exists() and also_bad.exists()  # evidence, not torn writes


@pytest.mark.parametrize("config, named", [
    (changed(model={"hidden": 64}), ["model.hidden: 32 in the checkpoint, 64 now", "--set model.hidden=32"]),
    (changed(model={"depth": 3}), ["model.depth: None in the checkpoint, 3 now"]),
    (changed(train={"optimizer": "sgd"}), ["train.optimizer: 'adam' in the checkpoint, 'sgd' now"]),
    ({**CONFIG, "train": {**CONFIG["train"], "optimizer": {"_component_": "torch.optim.SGD", "lr": 0.1}}},
     ["train.optimizer"]),
])
def test_changes_the_built_in_loop_declares_fixed_are_refused_naming_the_keys(tmp_path, config, named):
    save(tmp_path, 5)
    with pytest.raises(ResumeRefused) as refused:
        plan(tmp_path, config)
    message = str(refused.value)
    assert all(text in message for text in named), message
    assert "another --name" in message


def test_settings_the_loop_hands_over_are_planned_and_applied_to_the_restored_optimizer(tmp_path):
    save(tmp_path, 5)
    assert plan(tmp_path, changed(train={"lr": 0.5})).applied == {"train.lr": (0.01, 0.5)}

    model = torch.nn.Linear(2, 1)
    sgd = torch.optim.SGD(model.parameters(), lr=0.003, momentum=0.9, weight_decay=0.0)  # a scheduler moved lr
    resume.apply_optimizer_settings(sgd, {"train.weight_decay": (0.0, 0.01)})
    assert sgd.param_groups[0]["lr"] == 0.003  # unchanged by the user: left to the scheduler
    assert sgd.param_groups[0]["weight_decay"] == 0.01
    resume.apply_optimizer_settings(sgd, {"train.optimizer.betas": ([0.9, 0.99], [0.8, 0.9])})
    assert "betas" not in sgd.param_groups[0]  # not an SGD setting: nothing to set
    resume.apply_optimizer_settings(sgd, {"train.lr": (0.01, 0.5)})
    assert sgd.param_groups[0]["lr"] == 0.5


def test_a_component_optimizers_own_settings_are_applied(tmp_path):
    config = {**CONFIG, "train": {**CONFIG["train"], "optimizer": {"_component_": "torch.optim.AdamW", "lr": 0.1}}}
    save(tmp_path, 2, config=config)
    new = {**config, "train": {**config["train"], "optimizer": {"_component_": "torch.optim.AdamW", "lr": 0.2}}}
    assert plan(tmp_path, new).applied == {"train.optimizer.lr": (0.1, 0.2)}


def test_a_loop_that_declares_nothing_has_nothing_refused_and_nothing_applied(tmp_path):
    save(tmp_path, 5)
    result = plan(tmp_path, changed(model={"hidden": 64}, train={"lr": 0.5, "optimizer": "sgd"}),
                  rules=ResumeRules())
    assert result.epoch == 5 and result.applied == {}


def test_no_checkpoint_trains_from_scratch(tmp_path):
    result = plan(tmp_path)
    assert result.checkpoint is None and result.epoch == 0


def test_old_checkpoints_without_config_in_meta_are_compared_from_their_state(tmp_path):
    path = save(tmp_path, 5)
    meta = json.loads((path / checkpoints.META_FILE).read_text())
    del meta["config"], meta["size"]
    (path / checkpoints.META_FILE).write_text(json.dumps(meta))
    with pytest.raises(ResumeRefused, match="model.hidden"):
        plan(tmp_path, changed(model={"hidden": 8}))
