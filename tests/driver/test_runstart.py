"""training/raytrain/driver/runstart.py: a start's resume check refuses a checkpoint this config cannot load, naming
the setting that would."""

from __future__ import annotations

from pathlib import Path

import pytest

from raytrain.checkpoint.checkpoints import FileCheckpointer, Position
from raytrain.driver import runstart
from raytrain.rundir import runrecords
from raytrain.spec.config import load_config


def test_a_resume_with_the_other_checkpointer_is_refused_naming_the_setting(tmp_path):
    import torch

    from raytrain.checkpoint.checkpoints import Position
    from raytrain.checkpoint.resume import ResumeRefused
    from raytrain.checkpoint.sharded import ShardedCheckpointer
    from raytrain.rundir import runrecords

    path = tmp_path / "job.yaml"
    path.write_text(f"model: {{_component_: mlp}}\ndata: {{_component_: raytrain.data.linear.Linear}}\n"
                    f"run: {{storage_path: {tmp_path / 'runs'}, name: r}}\n")
    cfg = load_config(str(path))
    run_dir = tmp_path / "runs" / "r"
    model = torch.nn.Linear(1, 1)
    saver = ShardedCheckpointer(run_dir, asynchronous=False)
    saver.save(Position(1), model, None, lambda: {"epoch": 1, "step": 0, "config": cfg.to_dict(), "extra": {}},
               config=cfg.to_dict())
    with pytest.raises(ResumeRefused) as caught:
        runstart.check_resume(cfg, runrecords.Records(run_dir))
    assert "a sharded checkpoint, but this config writes file ones" in str(caught.value)
    assert "--set run.checkpointer=sharded" in str(caught.value)


# ------------------------------------------------------------------------------------ nothing left to train (issue 42)

def _linear(tmp_path, epochs):
    return load_config("linear", [f"run.storage_path={tmp_path / 'runs'}", "run.name=r", f"train.epochs={epochs}"])


def _checkpoint(cfg, epoch, step=0):
    import torch

    model = torch.nn.Linear(1, 1)
    state = {"model": model.state_dict(), "optimizer": None, "epoch": epoch, "step": step,
             "config": cfg.to_dict(), "extra": {}}
    run_dir = runrecords.run_dir_of(cfg.run.storage_path, cfg.run.name)
    return FileCheckpointer(run_dir, keep=50).save(Position(epoch, step), lambda: state, writer=True,
                                                   config=cfg.to_dict())


def _damage_same_size(path):
    from raytrain.checkpoint import checkpoints

    state = path / checkpoints.STATE_FILE
    data = bytearray(state.read_bytes())
    data[len(data) // 2] ^= 0xFF  # the size its manifest says, another hash: only the hash check under the lease sees it
    state.write_bytes(bytes(data))


@pytest.mark.parametrize("case, trained, epochs, damage, says", [
    ("finished", [(4, 0), (6, 0)], 6, None, ("nothing to train: r already finished 6 epochs (checkpoint "
                                             "checkpoint_epoch000006_")),
    ("train.epochs raised since", [(4, 0), (6, 0)], 8, None, None),
    ("train.epochs lowered since", [(6, 0)], 4, None, ("nothing to train: r already trained 6 epochs, more "
                                                       "than train.epochs=4 asks")),
    ("failed midway", [(2, 0), (4, 0)], 6, None, None),
    ("stopped midway (mid-epoch checkpoint)", [(4, 0), (5, 3)], 6, None, None),
    ("stopped during the last epoch", [(5, 0), (5, 7)], 6, None, None),
    ("no checkpoint", [], 6, None, None),
    ("newest checkpoint truncated", [(4, 0), (6, 0)], 6, "truncated", None),
    ("newest checkpoint corrupted, same size", [(4, 0), (6, 0)], 6, "corrupted", None),
])
def test_a_start_has_nothing_to_train_only_when_the_checkpoint_it_resumes_from_holds_the_last_epoch(
        tmp_path, case, trained, epochs, damage, says):
    cfg = _linear(tmp_path, epochs)
    paths = [_checkpoint(cfg, epoch, step) for epoch, step in trained]
    if damage == "truncated":
        (paths[-1] / "state.pt").write_bytes(b"half a checkpoint")
    elif damage == "corrupted":
        _damage_same_size(paths[-1])
    run_dir = runrecords.run_dir_of(cfg.run.storage_path, cfg.run.name)
    plan = runstart.check_resume(cfg, runrecords.Records(run_dir))
    said = runstart.nothing_to_train(cfg, plan)
    assert (said is None) == (says is None), (case, said)
    if says is not None:
        assert said.startswith(says) and "raise train.epochs to train on" in said, said
    # The look before the lease (no hash read) agrees, but for a damage only the hash shows: the attempt decides.
    assert runstart.looks_finished(cfg) == (says is not None or damage == "corrupted"), case


def test_a_ray_train_function_is_never_skipped_its_progress_is_its_own(tmp_path):
    from raytrain.checkpoint.resume import ResumePlan

    job = Path(__file__).resolve().parents[2] / "examples" / "ray-train-script" / "job.yaml"
    cfg = load_config(str(job), [f"run.storage_path={tmp_path}", "run.name=r"],
                      import_user_code=False)  # its function is not imported: the loop section says what it is
    _checkpoint(cfg, 50)
    plan = ResumePlan(checkpoint=tmp_path / "r" / "checkpoint_epoch000050_x", epoch=50)
    assert runstart.nothing_to_train(cfg, plan) is None and not runstart.looks_finished(cfg)


@pytest.mark.parametrize("step, now, warned", [(3, "ray", True), (0, "ray", False), (3, "torch", False)])
def test_a_mid_epoch_resume_under_another_loader_warns_naming_the_fix(tmp_path, step, now, warned):
    """Each loader orders an epoch its own way: the rest of a mid-epoch checkpoint's epoch would not match."""
    cfg = _linear(tmp_path, 6)
    _checkpoint(cfg, 2, step)  # with data.loader: torch, the preset's
    resumed = load_config("linear", [f"run.storage_path={tmp_path / 'runs'}", "run.name=r", "train.epochs=6",
                                     f"data.loader={now}"])
    run_dir = runrecords.run_dir_of(cfg.run.storage_path, cfg.run.name)
    runstart.check_resume(resumed, runrecords.Records(run_dir))
    warnings = [e["message"] for e in runrecords.read_events(run_dir)
                if e["event"] == "warning" and "data.loader" in e["message"]]  # not the missing rows' warning
    assert bool(warnings) == warned, warnings
    if warned:
        assert "3 steps into epoch 3 with data.loader torch; this start uses ray" in warnings[0] and \
            "--set data.loader=torch" in warnings[0], warnings
