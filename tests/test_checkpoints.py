"""training/raytrain/checkpoints.py: atomic writes, detection of truncated or corrupted checkpoints, newest-first fallback."""

from __future__ import annotations

import json

import torch

from raytrain import checkpoints


def save(path, epoch):
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.Adam(model.parameters())
    checkpoints.write_checkpoint(path, model_state=model.state_dict(), optimizer_state=optimizer.state_dict(),
                                 epoch=epoch, config={"train": {"epochs": 9}})


def test_round_trip(tmp_path):
    save(tmp_path / "c", 3)
    state = checkpoints.read_checkpoint(tmp_path / "c")
    assert state["epoch"] == 3 and state["config"] == {"train": {"epochs": 9}}
    assert set(state["model"]) == {"weight", "bias"}
    assert not list((tmp_path / "c").glob("*.tmp"))


def test_newest_readable_wins_and_each_broken_one_is_reported(tmp_path):
    for epoch in (2, 4, 6, 8):
        save(tmp_path / checkpoints.checkpoint_dir_name(epoch), epoch)
    ordered = checkpoints.candidates(tmp_path)
    assert [checkpoints.read_checkpoint(p)["epoch"] for p in ordered] == [8, 6, 4, 2]
    # epoch 8: state truncated mid-write; epoch 6: meta never written (crash before the rename)
    state_file = ordered[0] / checkpoints.STATE_FILE
    state_file.write_bytes(state_file.read_bytes()[:100])
    (ordered[1] / checkpoints.META_FILE).unlink()
    warnings = []
    path, state = checkpoints.load_newest(checkpoints.candidates(tmp_path), warnings.append)
    assert state["epoch"] == 4 and path == ordered[2]
    assert len(warnings) == 2
    assert "does not match the hash" in warnings[0] and "missing or invalid" in warnings[1]


def test_a_newer_checkpoint_than_rays_latest_wins_and_ray_latest_breaks_ties(tmp_path):
    for epoch in (1, 2):
        save(tmp_path / checkpoints.checkpoint_dir_name(epoch), epoch)
    by_epoch = {json.loads((p / "meta.json").read_text())["epoch"]: p for p in checkpoints.candidates(tmp_path)}
    # Ray's latest is epoch 1 (the epoch-2 report was uploaded but not yet registered when a worker died)
    assert checkpoints.candidates(tmp_path, ray_latest=[by_epoch[1]]) == [by_epoch[2], by_epoch[1]]
    twin = tmp_path / checkpoints.checkpoint_dir_name(2)  # epoch 2 trained again after a fallback
    save(twin, 2)
    assert checkpoints.candidates(tmp_path, ray_latest=[by_epoch[2]])[0] == by_epoch[2]


def test_nothing_to_resume_from(tmp_path):
    assert checkpoints.load_newest(checkpoints.candidates(tmp_path), print) is None
