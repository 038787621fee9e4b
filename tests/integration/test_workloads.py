"""The workload presets end to end through the real CLI: the three ViT steps (local, DataLoader, Ray Data from
Parquet written by `raytrain data`), the text-rnn run and a two-trial `raytrain tune`, and the streaming run with
more data than the object store holds.

Every `raytrain run`/`tune` joins the session's shared Ray head (tests/integration/conftest.py: own temp dir, free
ports, 2 CPUs, a deliberately small object store) with --address, which saves each run Ray's start-up.

    .venv/bin/python -m pytest -m integration tests/integration/test_workloads.py -v --durations=0
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
RAYTRAIN = str(Path(sys.executable).parent / "raytrain")
STREAM_GB = 0.4
TIMEOUT_S = 300


@pytest.fixture
def cluster(ray_head) -> str:
    """The session's shared Ray head (tests/integration/conftest.py), as the address `--address` takes."""
    return ray_head.address


@pytest.fixture
def object_store_bytes(ray_head) -> int:
    return ray_head.object_store_bytes


def raytrain(*args: str, timeout: int = TIMEOUT_S) -> subprocess.CompletedProcess:
    began = time.monotonic()
    proc = subprocess.run([RAYTRAIN, *args], capture_output=True, text=True, timeout=timeout, cwd=REPO)
    print(f"raytrain {' '.join(args)}: exit {proc.returncode} in {time.monotonic() - began:.1f}s")
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}"
    return proc


def finished_run(run_dir: Path, epochs: int) -> tuple[list[dict], dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    result = json.loads((run_dir / "result.json").read_text())
    assert result["status"] == "succeeded" and result["epochs_completed"] == epochs
    assert [row["epoch"] for row in rows] == list(range(1, epochs + 1))
    return rows, result


def test_vit_three_ways_and_both_ray_paths_see_the_same_samples_per_epoch(cluster, tmp_path):
    storage = str(tmp_path / "runs")
    raytrain("local", "cifar10-vit", "--smoke-test", "--storage", storage, "--name", "vit-local")
    raytrain("run", "cifar10-vit", "--smoke-test", "--storage", storage, "--name", "vit-torch",
             "--set", "data.loader=torch", "--address", cluster)
    # Step 3 reads the Parquet form that `raytrain data cifar10 --to-parquet` writes (here from synthetic data).
    parquet = tmp_path / "cifar10-parquet"
    raytrain("data", "cifar10", "--synthetic", "--synthetic-train", "512", "--synthetic-val", "128",
             "--root", str(tmp_path / "data"), "--to-parquet", str(parquet))
    raytrain("run", "cifar10-vit", "--smoke-test", "--storage", storage, "--name", "vit-ray",
             "--set", "data.loader=ray", "--set", f"data.parquet_dir={parquet}", "--address", cluster)

    per_epoch = {}
    for name in ("vit-local", "vit-torch", "vit-ray"):
        rows, result = finished_run(Path(storage) / name, epochs=2)
        per_epoch[name] = [row["samples"] for row in rows]
        assert all(0.0 <= row["val_accuracy"] <= 1.0 for row in rows)
    assert per_epoch["vit-torch"] == per_epoch["vit-ray"] == per_epoch["vit-local"] == [512, 512]
    assert sorted(p.name for p in (parquet / "train").iterdir()) == ["_COMPLETE", "part-00000.parquet"]


def test_text_rnn_smoke_run_learns_the_generated_classes(cluster, tmp_path):
    storage = tmp_path / "runs"
    raytrain("run", "text-rnn", "--smoke-test", "--storage", str(storage), "--address", cluster)
    rows, result = finished_run(storage / "text-rnn", epochs=2)
    assert rows[-1]["val_accuracy"] > 0.5  # 4 classes: chance is 0.25
    assert (storage / "datasets").is_dir() and any((storage / "datasets").glob("text-synthetic-*/vocab-2000.json"))


def test_tune_two_trials_reports_and_writes_the_best(cluster, tmp_path):
    storage = tmp_path / "runs"
    proc = raytrain("tune", "text-rnn", "--smoke-test", "--storage", str(storage), "--name", "sweep",
                    "--address", cluster, timeout=2 * TIMEOUT_S)
    summary = json.loads((storage / "sweep" / "tune.json").read_text())
    assert summary["status"] == "succeeded" and len(summary["trials"]) == 2
    scores = [t["metrics"]["val_accuracy"] for t in summary["trials"]]
    assert summary["best"]["metrics"]["val_accuracy"] == max(scores)
    assert "best trial" in proc.stdout and str(storage / "sweep" / "best_config.yaml") in proc.stdout
    for trial in summary["trials"]:
        assert 1e-3 <= trial["params"]["train.lr"] <= 1e-2 and trial["params"]["train.epochs"] in (1, 2)
        finished_run(storage / f"sweep-trial-{trial['trial_id']}", epochs=trial["params"]["train.epochs"])
    best = (storage / "sweep" / "best_config.yaml").read_text()
    assert f"lr: {summary['best']['params']['train.lr']}" in best
    assert json.loads((storage / "sweep" / "result.json").read_text())["status"] == "succeeded"


def test_streaming_more_data_than_the_object_store_completes_in_bounded_memory(cluster, object_store_bytes, tmp_path):
    storage = tmp_path / "runs"
    proc = raytrain("run", "streaming", "--smoke-test", "--storage", str(storage), "--address", cluster,
                    "--set", f"data.data_size_gb={STREAM_GB}")
    rows, result = finished_run(storage / "streaming", epochs=1)
    images = round(STREAM_GB * 1e9) // (256 * 256 * 3)
    assert STREAM_GB * 1e9 >= 4 * object_store_bytes
    assert rows[0]["samples"] == images  # every generated image reached a worker (2 workers, equal split)
    # Materialising the raw data would take 400 MB in some process; the workers never hold more than a few blocks.
    assert rows[0]["peak_rss_mb"] < 2000
    assert "peak worker RSS" in proc.stdout and "samples/s" in proc.stdout
