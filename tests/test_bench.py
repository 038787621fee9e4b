"""training/bench.py: the statistics, the figure rows, results.json, the chart, the shared data path and timed
loop on real (small) inputs, and the `raytrain bench` argument checks. No speed is asserted here: the benchmark
prints what it measures (scripts/bench)."""

from __future__ import annotations

import json
import struct
import time

import numpy as np
import pytest
import torch

from raytrain import bench
from raytrain.cli import main


@pytest.mark.parametrize("values, expected", [
    ([3.0, 1.0, 2.0], {"median": 2.0, "min": 1.0, "max": 3.0, "n": 3}),
    ([4.0, 1.0], {"median": 2.5, "min": 1.0, "max": 4.0, "n": 2}),
    ([None, 5.0, float("nan")], {"median": 5.0, "min": 5.0, "max": 5.0, "n": 1}),  # failed rounds are left out
    ([], {"median": None, "min": None, "max": None, "n": 0}),
])
def test_summary(values, expected):
    assert bench.summary(values) == expected


def test_ratios_pair_rounds_and_skip_missing_sides():
    assert bench.ratios([90.0, 100.0, None], [100.0, 100.0, 50.0]) == [0.9, 1.0, None]
    assert bench.ratios([1.0], [0.0]) == [None]


def test_figure_rows_are_one_json_line_with_target():
    row = bench.figure("p1_ratio", "x", [0.98, 0.96, 0.99], target=">= 0.97", met=True, batch_size=256)
    line = json.dumps(row)
    assert "\n" not in line
    assert json.loads(line) == {"figure": "p1_ratio", "unit": "x", "median": 0.98, "min": 0.96, "max": 0.99, "n": 3,
                                "rounds": [0.98, 0.96, 0.99], "target": ">= 0.97", "met": True, "batch_size": 256}
    assert bench.skipped("gpu_vit", "no CUDA device") == {"figure": "gpu_vit", "skipped": "no CUDA device"}


def _png_size(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def test_results_json_and_chart(tmp_path):
    figures = [
        bench.figure("p1_raw_torch_samples_per_s", "samples/s", [1000.0, 1020.0, 990.0]),
        bench.figure("p1_ray_train_samples_per_s", "samples/s", [985.0, 1000.0, 970.0]),
        bench.figure("p1_ratio", "x", [0.985, 0.98, 0.98], target=">= 0.97", met=True),
        bench.figure("p3_running_cluster_s", "s", [21.0, 19.5, 25.0], target="<= 8.0", met=False),
        bench.skipped("gpu_vit", "no CUDA device"),
        {"figure": "p4", "error": "the job did not train again"},
    ]
    settings = bench.BenchSettings(rounds=3, out_dir=str(tmp_path))
    path = bench.write_results(tmp_path, {"cores": 2}, settings, figures)
    stored = json.loads(path.read_text())
    assert stored["machine"] == {"cores": 2}
    assert stored["settings"]["rounds"] == 3
    assert [f["figure"] for f in stored["figures"]] == [f["figure"] for f in figures]
    png = bench.chart(figures, tmp_path / "bench.png", "test")
    width, height = _png_size(png)
    assert width > 500 and height > 200


def test_chart_with_nothing_measured_still_writes_a_png(tmp_path):
    png = bench.chart([bench.skipped("gpu_vit", "no CUDA device")], tmp_path / "empty.png", "nothing")
    assert _png_size(png)[0] > 0


def test_normalise_matches_torchvision_to_tensor_and_normalize():
    x, y = bench.cifar_like(4, seed=1)
    assert x.shape == (4, 32, 32, 3) and x.dtype == np.uint8 and y.dtype == np.int64
    out = bench.normalise_batch({"x": x, "y": y})
    assert out["x"].shape == (4, 3, 32, 32) and out["x"].dtype == np.float32
    expected = (torch.from_numpy(x).permute(0, 3, 1, 2).float() / 255.0
                - torch.tensor(bench.CIFAR_MEAN).view(1, 3, 1, 1)) / torch.tensor(bench.CIFAR_STD).view(1, 3, 1, 1)
    assert torch.allclose(torch.from_numpy(out["x"]), expected, atol=1e-6)
    xs, ys = bench.collate_normalised([(x[i], y[i]) for i in range(4)])
    assert torch.equal(xs, torch.from_numpy(out["x"])) and torch.equal(ys, torch.from_numpy(y))


def test_dataset_holds_enough_batches_for_every_worker():
    s = bench.BenchSettings(batch_size=8, warmup_steps=2, steps=5, ingest_batches=3)
    assert bench.dataset_size(s) == 7 * 8
    assert bench.dataset_size(s, num_workers=2) == 14 * 8


def test_timed_training_runs_the_package_loop_and_times_only_after_warmup():
    torch.manual_seed(0)
    model = bench.build_cnn(width=4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = bench.cifar_like(6 * 4)
    batches = [bench.collate_normalised([(x[i], y[i]) for i in range(b * 4, b * 4 + 4)]) for b in range(6)]
    before = [p.detach().clone() for p in model.parameters()]
    result = bench.timed_training(model, optimizer, batches, warmup=2, steps=3)
    assert result["steps"] == 3  # 2 warmup + 3 timed; the sixth batch is never drawn
    assert result["samples_per_s"] > 0 and result["step_s"] > 0
    assert 0 <= result["wait_share"] < 1 and result["samples_per_cpu_s"] > 0
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))  # it really trained


def test_timed_training_says_when_the_data_runs_out():
    model = bench.build_cnn(width=4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = bench.cifar_like(4)
    with pytest.raises(RuntimeError, match="smaller than warmup"):
        bench.timed_training(model, optimizer, [bench.collate_normalised([(x[i], y[i]) for i in range(4)])], 2, 3)


def test_timed_ingest_counts_batches_after_the_first():
    result = bench.timed_ingest(iter(range(10)), count=5)
    assert result["batches"] == 5 and result["batches_per_s"] > 0
    assert bench.timed_ingest(iter(range(3)), count=5)["batches"] == 2


def test_vit_flops_formula():
    assert bench.vit_train_flops_per_sample(params=10, tokens=2, layers=1, hidden=4) == 6 * 10 * 2 + 12 * 4 * 4


def test_gpu_part_is_skipped_with_its_reason_without_cuda(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: the GPU part runs for real (scripts/bench gpu)")
    rows = bench.bench_gpu(bench.BenchSettings(), tmp_path, lambda message: None)
    assert rows == [{"figure": "gpu_vit", "skipped": "no CUDA device"}]


@pytest.mark.parametrize("argv, message", [
    (["bench", "p9"], "unknown part(s) p9"),
    (["bench", "--rounds", "0"], "--rounds and --threads must be >= 1"),
    (["bench", "--steps", "1"], "--steps >= 2"),
])
def test_bench_rejects_bad_arguments(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_markdown_table_names_the_machine_and_every_figure():
    figures = [bench.figure("p1_ratio", "x", [0.98, 0.99, 0.97], target=">= 0.97", met=True),
               bench.figure("p3_running_cluster_s", "s", [20.0, 22.0, 30.0], target="<= 8.0", met=False),
               bench.skipped("gpu_vit", "no CUDA device"),
               {"figure": "p4", "error": "no step after the kill\ndetails"}]
    text = bench.markdown(figures, {"cores": 2, "cpu": "AMD EPYC", "memory_gib": 23.5, "load_avg_at_start": [12.0],
                                    "torch": "2.13.0", "ray": "2.55.1"}, bench.BenchSettings())
    assert text.startswith("Machine: 2 cores (AMD EPYC)") and "load average 12.0" in text
    assert "| p1_ratio | x | 0.98 | 0.97 | 0.99 | 3 | >= 0.97 | yes |" in text
    assert "| p3_running_cluster_s | s | 22 | 20 | 30 | 3 | <= 8.0 | no |" in text
    assert "skipped: no CUDA device" in text and "error: no step after the kill |" in text


def test_a_target_with_nothing_measured_is_neither_met_nor_missed():
    row = bench.figure("p4_detected_to_next_step_s", "s", [None, None], target="<= 10.0", met=False)
    assert row["met"] is None and row["n"] == 0


def test_failure_detection_time_is_read_from_the_controller_log(tmp_path):
    from raytrain.bench import controller_log_time

    logs = tmp_path / "n1" / "session_2026-11-21_11-00-00_1_1" / "logs" / "train"
    logs.mkdir(parents=True)
    line = lambda stamp, message: json.dumps({"asctime": stamp, "levelname": "INFO", "message": message})  # noqa: E731
    (logs / "ray-train-sys-controller-abc.log").write_text("\n".join([
        line("2026-11-21 11:00:05,250", "[FailurePolicy] RETRY\\n worker died"),
        line("2026-11-21 11:00:09,000", "Requesting resources"),
        line("2026-11-21 11:00:20,500", "[FailurePolicy] RETRY second failure"),
        "not json [FailurePolicy]",
    ]))
    base = time.mktime(time.strptime("2026-11-21 11:00:00", "%Y-%m-%d %H:%M:%S"))
    assert controller_log_time([tmp_path / "n1"], "[FailurePolicy]", base) == base + 5.25
    assert controller_log_time([tmp_path / "n1"], "[FailurePolicy]", base + 6) == base + 20.5
    assert controller_log_time([tmp_path / "n1", tmp_path / "n2"], "[FailurePolicy]", base + 30) is None


def test_cpu_busy_seconds_counts_the_work_done_in_between():
    from raytrain.bench import cpu_busy_seconds

    before = cpu_busy_seconds()
    burn_until = time.process_time() + 0.3
    while time.process_time() < burn_until:
        pass
    after = cpu_busy_seconds()
    assert after - before >= 0.25  # this process alone was busy 0.3 s (the clock ticks every 10 ms)
