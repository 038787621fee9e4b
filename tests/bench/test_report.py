"""bench/report.py: results.md's table and the chart, from real figure rows."""

from __future__ import annotations

import struct

from bench import harness, report


def _png_size(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


FIGURES = [
    harness.figure("p1_raw_torch_samples_per_s", "samples/s", [1000.0, 1020.0, 990.0]),
    harness.figure("p1_ray_train_samples_per_s", "samples/s", [985.0, 1000.0, 970.0]),
    harness.figure("p1_ratio", "x", [0.985, 0.98, 0.98], target=">= 0.97", met=True),
    harness.figure("p3_running_cluster_s", "s", [21.0, 19.5, 25.0], target="<= 8.0", met=False),
    harness.skipped("gpu_vit", "no CUDA device"),
    {"figure": "p4", "error": "the job did not train again"},
]
MACHINE = {"cores": 2, "cpu": "AMD EPYC", "memory_gib": 23.5, "load_avg_at_start": [12.0], "torch": "2.13.0",
           "ray": "2.55.1"}


def test_chart_draws_the_measured_parts(tmp_path):
    png = report.chart(FIGURES, tmp_path / "bench.png", "test")
    width, height = _png_size(png)
    assert width > 500 and height > 200


def test_chart_with_nothing_measured_still_writes_a_png(tmp_path):
    png = report.chart([harness.skipped("gpu_vit", "no CUDA device")], tmp_path / "empty.png", "nothing")
    assert _png_size(png)[0] > 0


def test_every_panel_names_figures_the_parts_emit_and_a_target_the_harness_knows():
    for _title, names, ticks, target in report.PANELS:
        assert len(names) == len(ticks) and all(n.split("_")[0] in harness.ALL_PARTS for n in names)
        assert target is None or target in harness.TARGETS.values()


def test_markdown_table_names_the_machine_and_every_figure():
    figures = [harness.figure("p1_ratio", "x", [0.98, 0.99, 0.97], target=">= 0.97", met=True),
               harness.figure("p3_running_cluster_s", "s", [20.0, 22.0, 30.0], target="<= 8.0", met=False),
               harness.skipped("gpu_vit", "no CUDA device"),
               {"figure": "p4", "error": "no step after the kill\ndetails"}]
    text = report.markdown(figures, MACHINE, harness.BenchSettings())
    assert text.startswith("Machine: 2 cores (AMD EPYC)") and "load average 12.0" in text
    assert "| p1_ratio | x | 0.98 | 0.97 | 0.99 | 3 | >= 0.97 | yes |" in text
    assert "| p3_running_cluster_s | s | 22 | 20 | 30 | 3 | <= 8.0 | no |" in text
    assert "skipped: no CUDA device" in text and "error: no step after the kill |" in text


def test_write_report_writes_results_md_and_bench_png(tmp_path):
    table, png = report.write_report(FIGURES, MACHINE, harness.BenchSettings(), tmp_path / "out")
    assert table == tmp_path / "out" / "results.md" and "| p1_ratio | x | 0.98 |" in table.read_text()
    assert png == tmp_path / "out" / "bench.png" and _png_size(png)[0] > 500
