"""training/raytrain/checkpoint/checkpoints.py: the single-file checkpointer. A commit is a rename of a fully written staging
directory, fenced; the hash is computed while writing and checked on the one read of a load; a damaged manifest
beside a state that loads is still used; pruning keeps the newest complete ones of any attempt and never a damaged
one; a full disk is reported as such."""

from __future__ import annotations

import errno
import hashlib
import json

import pytest
import torch

from raytrain.checkpoint import checkpoints
from raytrain.checkpoint.checkpoints import FileCheckpointer, Position
from raytrain.lifecycle.endings import AttemptEnded, Ending
from tests.support.disk import small_disk


def state(epoch, step=0, width=2):
    model = torch.nn.Linear(width, 1)
    optimizer = torch.optim.Adam(model.parameters())
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch, "step": step,
            "config": {"train": {"epochs": 9}}, "extra": {}}


def save(run_dir, epoch, step=0, keep=50, control=None):
    saver = FileCheckpointer(run_dir, keep=keep) if control is None else FileCheckpointer(run_dir, control, keep)
    return saver.save(Position(epoch, step), lambda: state(epoch, step), writer=True, config={"train": {"epochs": 9}})


def test_a_save_commits_by_rename_with_its_hash_computed_while_writing(tmp_path):
    path = save(tmp_path, 3)
    assert path.name.startswith("checkpoint_epoch000003_") and path.parent == tmp_path
    assert not list(tmp_path.glob(".staging-*")) and not list(path.glob("*.tmp"))
    meta = json.loads((path / checkpoints.META_FILE).read_text())
    data = (path / checkpoints.STATE_FILE).read_bytes()
    assert meta["sha256"] == hashlib.sha256(data).hexdigest() and meta["size"] == len(data)
    assert (meta["epoch"], meta["step"], meta["format"]) == (3, 0, checkpoints.FORMAT)
    loaded = checkpoints.load(path)
    assert loaded.state["epoch"] == 3 and set(loaded.state["model"]) == {"weight", "bias"}
    assert loaded.warning is None


def test_only_the_writer_writes(tmp_path):
    saver = FileCheckpointer(tmp_path)
    built = []
    assert saver.save(Position(1), lambda: built.append(1) or state(1), writer=False) is None
    assert built == [] and not list(tmp_path.iterdir())  # the state is not even built where it is not written


def test_newest_position_first_and_each_broken_one_is_reported(tmp_path):
    for epoch, step in ((2, 0), (3, 5), (4, 0), (4, 7), (6, 0)):
        save(tmp_path, epoch, step)
    saver = FileCheckpointer(tmp_path)
    ordered = saver.latest()
    assert [checkpoints.position_of(p) for p in ordered] == [
        Position(6), Position(4, 7), Position(4), Position(3, 5), Position(2)]
    # the newest: state truncated; the next: state overwritten with junk of the same size
    truncated = ordered[0] / checkpoints.STATE_FILE
    truncated.write_bytes(truncated.read_bytes()[:100])
    junk = ordered[1] / checkpoints.STATE_FILE
    junk.write_bytes(b"x" * junk.stat().st_size)
    warnings = []
    loaded = saver.load_newest(warnings.append)
    assert loaded.path == ordered[2] and loaded.state["epoch"] == 4 and loaded.state["step"] == 0
    assert len(warnings) == 2 and all("does not match the hash" in w for w in warnings)


@pytest.mark.parametrize("damage", [b"", b"\xff\xfe not json", b"[1, 2]", b'{"epoch": 1}'])
def test_a_damaged_manifest_beside_a_state_that_loads_is_used_and_said(tmp_path, damage):
    path = save(tmp_path, 5)
    (path / checkpoints.META_FILE).write_bytes(damage)
    warnings = []
    loaded = FileCheckpointer(tmp_path).load_newest(warnings.append)
    assert loaded.path == path and loaded.state["epoch"] == 5
    assert len(warnings) == 1 and "state.pt loads and was used" in warnings[0]


def test_pruning_keeps_the_newest_complete_of_any_attempt_and_never_a_damaged_one(tmp_path):
    old = [save(tmp_path, epoch) for epoch in (1, 2, 3)]  # a killed attempt's, never pruned by it
    damaged = save(tmp_path, 4)
    (damaged / checkpoints.STATE_FILE).write_bytes(b"cut")
    newest = save(tmp_path, 5, keep=2)  # this save prunes
    left = sorted(p.name for p in tmp_path.glob("checkpoint_*"))
    assert left == sorted([newest.name, old[2].name, damaged.name])


def test_staging_directories_are_removed_and_named(tmp_path):
    save(tmp_path, 1)
    staging = tmp_path / ".staging-checkpoint_epoch000002_deadbeef"
    staging.mkdir()
    (staging / checkpoints.STATE_FILE).write_bytes(b"half")
    warnings = []
    assert FileCheckpointer(tmp_path).remove_staging(warnings.append) == [staging.name]
    assert not staging.exists() and "never committed" in warnings[0]


class Lost:
    token = 7

    def check(self):
        raise AttemptEnded(Ending.LEASE_LOST, "attempt 8 took the run over")

    def poll(self):
        return Ending.LEASE_LOST, "attempt 8 took the run over"


def test_a_writer_that_lost_the_run_commits_nothing(tmp_path):
    with pytest.raises(AttemptEnded):
        save(tmp_path, 1, control=Lost())
    assert not list(tmp_path.iterdir())


def test_a_full_disk_is_reported_as_such_and_leaves_nothing_half_written(tmp_path):
    with small_disk(tmp_path / "disk", "64k") as disk:
        FileCheckpointer(disk).save(Position(1), lambda: state(1, width=8), writer=True)  # a small one fits
        with pytest.raises(OSError) as failed:
            FileCheckpointer(disk).save(Position(2), lambda: state(2, width=40_000), writer=True)
        assert failed.value.errno == errno.ENOSPC  # not torch's "unexpected pos"
        assert [p.name.split("_")[1] for p in disk.iterdir()] == ["epoch000001"]  # nothing half-written stays


def test_nothing_to_resume_from(tmp_path):
    assert FileCheckpointer(tmp_path).load_newest(print) is None
    assert checkpoints.newest_complete(tmp_path) is None
