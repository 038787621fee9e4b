"""training/raytrain/driver/raytrainer.py: the driver's pieces that run without a cluster."""

from __future__ import annotations

from raytrain.driver.raytrainer import root_cause


def test_root_cause_is_the_innermost_last_line():
    try:
        try:
            raise ValueError("first line\nthe real reason")
        except ValueError as inner:
            raise RuntimeError("wrapper") from inner
    except RuntimeError as outer:
        assert root_cause(outer) == "the real reason"


def test_a_full_disk_on_a_worker_is_named_as_such_with_its_directory(tmp_path):
    """Issue 40, item 14: ENOSPC from a worker's write ends the run saying the disk is full and where."""
    import pytest
    import torch

    from raytrain.checkpoint import checkpoints
    from tests.support.disk import small_disk

    with small_disk(tmp_path / "disk", "64k") as disk:
        try:
            try:
                checkpoints.write_checkpoint(disk / "staging", {"epoch": 1, "step": 0, "w": torch.ones(50_000)},
                                             config={})
            except OSError as full:
                raise RuntimeError("Ray Train worker group failed") from full
        except RuntimeError as outer:
            assert root_cause(outer) == f"the disk is full at {disk / 'staging'} (No space left on device)"
        else:
            pytest.fail("a 64 KiB disk took 200 KB")
