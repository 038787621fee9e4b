"""bench/cli.py: the command line's checks, a whole (GPU-only, so quick) invocation writing its three outputs,
and the benchmark staying out of what is shipped."""

from __future__ import annotations

import io
import json
import tomllib
from pathlib import Path

import pytest
import torch

from bench import cli
from bench.harness import ALL_PARTS, BenchSettings

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("argv, message", [
    (["p9"], "unknown part(s) p9"),
    (["--rounds", "0"], "--rounds and --threads must be >= 1"),
    (["--threads", "0"], "--rounds and --threads must be >= 1"),
    (["--steps", "1"], "--steps >= 2"),
])
def test_bench_rejects_bad_arguments(argv, message, capsys):
    assert cli.main(argv) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert message in err and "Fix:" in err


def test_the_options_become_settings():
    s = cli.settings_from(["p1", "p3", "--rounds", "5", "--out", "/tmp/b", "--steps", "7", "--threads", "2",
                           "--preset", "linear"])
    assert s == BenchSettings(rounds=5, parts=("p1", "p3"), out_dir="/tmp/b", steps=7, torch_threads=2,
                              p3_preset="linear")
    assert cli.settings_from([]).parts == ALL_PARTS


def test_an_invocation_prints_json_lines_and_writes_results_json_md_and_png(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: the GPU part would run for real (scripts/bench gpu)")
    out, err = io.StringIO(), io.StringIO()
    assert cli.run_bench(BenchSettings(parts=("gpu",), rounds=1, out_dir=str(tmp_path / "out")), out, err) == 0
    assert [json.loads(line) for line in out.getvalue().splitlines()] == [
        {"figure": "gpu", "skipped": "no CUDA device"}]
    stored = json.loads((tmp_path / "out" / "results.json").read_text())
    assert stored["figures"] == [{"figure": "gpu", "skipped": "no CUDA device"}]
    assert "skipped: no CUDA device" in (tmp_path / "out" / "results.md").read_text()
    assert (tmp_path / "out" / "bench.png").read_bytes()[:4] == b"\x89PNG"
    assert "bench: results" in err.getvalue()


def test_the_benchmark_is_not_shipped_with_the_package_or_the_image():
    packages = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    assert not any(p == "bench" or p.startswith(("bench.", "raytrain.bench")) for p in packages)
    context = [line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")]
    assert context[0] == "*" and not any(line.startswith("!bench") for line in context)  # an allow-list without it


def test_raytrain_has_no_bench_command(capsys):
    from raytrain.cli import main

    with pytest.raises(SystemExit):
        main(["bench"])
    assert "invalid choice: 'bench'" in capsys.readouterr().err
