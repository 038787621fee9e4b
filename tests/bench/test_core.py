"""bench/core.py: samples/s over the epochs after the first, the p1core figures, and the plain side for real."""

from __future__ import annotations

import pytest

from bench import core
from bench.workload import in_fresh_process


def _rows(*seconds: float, samples: int = 100) -> list[dict]:
    return [{"epoch": i + 1, "samples": samples, "epoch_s": s} for i, s in enumerate(seconds)]


def test_the_rate_leaves_out_the_first_epoch_and_weighs_epochs_by_their_time():
    got = core.epoch_rate(_rows(10.0, 1.0, 3.0))
    assert got == {"samples_per_s": 200 / 4.0, "epochs": 2, "samples_per_epoch": 100}
    with pytest.raises(ValueError, match="no epoch after the first"):
        core.epoch_rate(_rows(1.0))


def test_figures_pair_each_rounds_sides():
    w = core.WORKLOADS["digits"]
    rt = [{"samples_per_s": 97.0, "samples_per_epoch": 1438}, {"samples_per_s": 90.0, "samples_per_epoch": 1438}]
    plain = [{"samples_per_s": 100.0, "samples_per_epoch": 1438}, {"samples_per_s": 100.0, "samples_per_epoch": 1438}]
    rows = {r["figure"]: r for r in core.core_figures("digits", w, 1, rt, plain)}
    ratio = rows["p1core_digits_ratio"]
    assert ratio["rounds"] == [0.97, 0.9] and ratio["met"] is False  # median 0.935 < 0.97
    assert rows["p1core_digits_plain_samples_per_s"]["median"] == 100.0
    assert "train.torch_threads=1" in ratio["overrides"] and "scaling.num_workers=1" in ratio["overrides"]
    assert ratio["timed_epochs"] == w.epochs - 1


def test_the_plain_side_trains_the_presets_model_on_its_training_split(tmp_path):
    params = {"preset": "digits", "storage": str(tmp_path), "data_workers": 0,
              "overrides": ["scaling.num_workers=1", "train.epochs=2", "train.torch_threads=1"]}
    result = in_fresh_process(core.plain_side, params)
    assert result["threads"] == 1
    assert [r["epoch"] for r in result["rows"]] == [1, 2]
    assert all(r["samples"] == 1438 and r["epoch_s"] > 0 for r in result["rows"])  # digits' training split
