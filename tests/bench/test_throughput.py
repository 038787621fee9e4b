"""bench/throughput.py: the raw-torch side for real in a fresh process (tiny settings), and the p1/p2 figures."""

from __future__ import annotations

from dataclasses import asdict

from bench import throughput
from bench.harness import BenchSettings
from bench.workload import in_fresh_process


def test_the_raw_torch_side_trains_and_ingests_in_a_fresh_process_with_the_asked_threads():
    s = BenchSettings(batch_size=8, warmup_steps=1, steps=2, ingest_batches=2, cnn_width=2, torch_threads=1)
    result = in_fresh_process(throughput.raw_torch_side, asdict(s))
    assert result["threads"] == 1
    assert result["ingest"]["batches"] == 2 and result["ingest"]["batches_per_s"] > 0
    assert result["train"]["steps"] == 2 and result["train"]["samples_per_s"] > 0


def _side(sps: float, wait: float, ingest: float) -> dict:
    return {"train": {"samples_per_s": sps, "wait_share": wait, "samples_per_cpu_s": sps / 2},
            "ingest": {"batches_per_s": ingest}}


def test_figures_pair_each_rounds_sides_and_judge_the_targets():
    raw = [_side(100.0, 0.02, 10.0), _side(100.0, 0.02, 11.0)]
    ray = [_side(99.0, 0.01, 12.0), _side(97.0, 0.01, 13.0)]
    rows = {r["figure"]: r for r in throughput.throughput_figures(BenchSettings(), raw, ray)}
    assert rows["p1_ratio"]["rounds"] == [0.99, 0.97] and rows["p1_ratio"]["met"] is True  # median 0.98 >= 0.97
    assert rows["p1_ratio_per_cpu_second"]["rounds"] == [0.99, 0.97]
    assert rows["p2_ray_data_batches_per_s"]["rounds"] == [12.0, 13.0]
    assert rows["p2_wait_share_ray_train"]["met"] is True and "target" not in rows["p2_wait_share_raw_torch"]


def test_only_the_asked_parts_get_figures():
    raw, ray = [_side(100.0, 0.2, 10.0)], [_side(90.0, 0.2, 12.0)]
    p1 = throughput.throughput_figures(BenchSettings(parts=("p1",)), raw, ray)
    p2 = throughput.throughput_figures(BenchSettings(parts=("p2",)), raw, ray)
    assert {r["figure"][:2] for r in p1} == {"p1"} and {r["figure"][:2] for r in p2} == {"p2"}
    assert next(r for r in p1 if r["figure"] == "p1_ratio")["met"] is False
    assert next(r for r in p2 if r["figure"] == "p2_wait_share_ray_train")["met"] is False
