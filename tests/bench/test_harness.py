"""bench/harness.py: the statistics, interleaved rounds, the figure rows, results.json and the machine's CPU
counter, on real inputs. No speed is asserted here: the benchmark prints what it measures (scripts/bench)."""

from __future__ import annotations

import io
import json
import time

import pytest

from bench import harness


@pytest.mark.parametrize("values, expected", [
    ([3.0, 1.0, 2.0], {"median": 2.0, "min": 1.0, "max": 3.0, "n": 3}),
    ([4.0, 1.0], {"median": 2.5, "min": 1.0, "max": 4.0, "n": 2}),
    # failed rounds are left out
    ([None, 5.0, float("nan"), float("inf")], {"median": 5.0, "min": 5.0, "max": 5.0, "n": 1}),
    ([], {"median": None, "min": None, "max": None, "n": 0}),
])
def test_summary(values, expected):
    assert harness.summary(values) == expected


def test_ratios_pair_rounds_and_skip_missing_sides():
    assert harness.ratios([90.0, 100.0, None], [100.0, 100.0, 50.0]) == [0.9, 1.0, None]
    assert harness.ratios([1.0], [0.0]) == [None]


def test_interleaved_alternates_which_side_goes_first_and_keeps_each_sides_rounds():
    calls = []

    def side(name):
        def run(r):
            calls.append((r, name))
            return f"{name}{r}"
        return run

    seen_after = []
    results = harness.interleaved(3, {"a": side("a"), "b": side("b")},
                                  lambda r, sofar: seen_after.append((r, len(sofar["a"]), len(sofar["b"]))))
    assert calls == [(0, "a"), (0, "b"), (1, "b"), (1, "a"), (2, "a"), (2, "b")]
    assert results == {"a": ["a0", "a1", "a2"], "b": ["b0", "b1", "b2"]}
    assert seen_after == [(0, 1, 1), (1, 2, 2), (2, 3, 3)]  # called once per round, with both sides done


def test_figure_rows_are_one_json_line_with_target():
    row = harness.figure("p1_ratio", "x", [0.98, 0.96, 0.99], target=">= 0.97", met=True, batch_size=256)
    line = json.dumps(row)
    assert "\n" not in line
    assert json.loads(line) == {"figure": "p1_ratio", "unit": "x", "median": 0.98, "min": 0.96, "max": 0.99, "n": 3,
                                "rounds": [0.98, 0.96, 0.99], "target": ">= 0.97", "met": True, "batch_size": 256}
    assert harness.skipped("gpu_vit", "no CUDA device") == {"figure": "gpu_vit", "skipped": "no CUDA device"}


def test_a_target_with_nothing_measured_is_neither_met_nor_missed():
    row = harness.figure("p4_detected_to_next_step_s", "s", [None, None], target="<= 10.0", met=False)
    assert row["met"] is None and row["n"] == 0


def test_results_json_holds_the_machine_settings_and_figures(tmp_path):
    figures = [harness.figure("p1_ratio", "x", [0.985, 0.98, 0.98], target=">= 0.97", met=True),
               harness.skipped("gpu_vit", "no CUDA device")]
    settings = harness.BenchSettings(rounds=3, out_dir=str(tmp_path))
    path = harness.write_results(tmp_path, {"cores": 2}, settings, figures)
    stored = json.loads(path.read_text())
    assert path.name == "results.json" and [p.name for p in tmp_path.iterdir()] == ["results.json"]  # no temp left
    assert stored["machine"] == {"cores": 2} and stored["settings"]["rounds"] == 3
    assert stored["settings"]["parts"] == list(harness.ALL_PARTS)
    assert stored["figures"] == figures


def test_results_print_each_figure_as_a_line_keep_results_json_current_and_report_a_failed_part(tmp_path):
    out, err = io.StringIO(), io.StringIO()
    results = harness.Results(harness.BenchSettings(out_dir=str(tmp_path / "out")), {"cores": 2}, out, err)
    results.emit([harness.figure("p1_ratio", "x", [1.0])])
    assert [f["figure"] for f in json.loads((tmp_path / "out" / "results.json").read_text())["figures"]] == ["p1_ratio"]

    def failing_part():
        raise RuntimeError("p4: the job did not train again\n" + "x" * 3000)

    results.attempt("p4", failing_part)
    results.attempt("p3", lambda: results.emit([harness.figure("p3_running_cluster_s", "s", [18.0])]))
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [row["figure"] for row in lines] == ["p1_ratio", "p4", "p3_running_cluster_s"]  # a failure stops nothing
    assert lines[1]["error"].startswith("p4: the job did not train again") and len(lines[1]["error"]) < 1600
    assert "bench: p4 failed: p4: the job did not train again" in err.getvalue()
    stored = json.loads((tmp_path / "out" / "results.json").read_text())
    assert [f["figure"] for f in stored["figures"]] == ["p1_ratio", "p4", "p3_running_cluster_s"]


def test_cpu_busy_seconds_counts_the_work_done_in_between():
    before = harness.cpu_busy_seconds()
    burn_until = time.process_time() + 0.3
    while time.process_time() < burn_until:
        pass
    after = harness.cpu_busy_seconds()
    assert after - before >= 0.25  # this process alone was busy 0.3 s (the clock ticks every 10 ms)


def test_machine_info_names_the_cpu_and_versions():
    info = harness.machine_info()
    assert info["cores"] >= 1 and info["cpu"] and info["torch"] and info["ray"]
    assert len(info["load_avg_at_start"]) == 3 and info["memory_gib"] > 0
