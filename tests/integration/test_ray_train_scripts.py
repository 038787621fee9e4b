"""Ray Train scripts run unchanged under `raytrain run` (raytrain.worker.raytrain_function), on the embedded Ray, through
the real CLI: Ray's own examples as installed (ray/train/examples/pytorch; only their data pointed at local files),
the docs-style example (examples/ray-train-script) stopped gracefully and resumed through ray.train.get_checkpoint().
Tiny epochs: the machine has 2 shared cores.

    .venv/bin/python -m pytest -m integration tests/integration/test_ray_train_scripts.py -v --durations=0
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from raytrain.checkpoint import checkpoints
from raytrain.rundir import runrecords
from tests.support import podloss

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
RAYTRAIN = [sys.executable, "-m", "raytrain.cli"]
TTL_S = 15  # a SIGKILLed driver's lease is taken over after this (shorter loses leases on a busy machine)
EXAMPLES = "ray.train.examples.pytorch"


def env(**extra: str) -> dict:
    return {**os.environ, "RAYTRAIN_LEASE_TTL_S": str(TTL_S), **extra}


def start(cwd: Path, *args: str, **extra: str) -> subprocess.Popen:
    return subprocess.Popen([*RAYTRAIN, "run", "job.yaml", *args], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True, env=env(**extra))


def run(cwd: Path, *args: str, expect: int = 0, **extra: str) -> subprocess.CompletedProcess:
    done = subprocess.run([*RAYTRAIN, "run", "job.yaml", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=500, env=env(**extra))
    assert done.returncode == expect, f"exit {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def wait_for_checkpoint(proc: subprocess.Popen, run_dir: Path, at_least: int, timeout: float = 300) -> int:
    """Until a committed checkpoint at position >= at_least exists; returns the newest position."""
    deadline = time.time() + timeout
    while True:
        found = [checkpoints.position_of(p).epoch for p in checkpoints.committed(run_dir)]
        if found and max(found) >= at_least:
            return max(found)
        assert proc.poll() is None, proc.stdout.read()[-3000:]
        assert time.time() < deadline, "no checkpoint"
        time.sleep(0.1)


def stop_group(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        podloss.kill_session(proc)


def assert_checkpoints_sound(run_dir: Path, keep: int) -> list[Path]:
    found = checkpoints.committed(run_dir)
    assert 0 < len(found) <= keep and not checkpoints.staging_dirs(run_dir)
    for path in found:
        checkpoints.verify_hash(path)
        assert json.loads((path / "meta.json").read_text())["kind"] == "directory"
    return found


def job(tmp_path: Path, text: str) -> Path:
    project = tmp_path / "project"
    project.mkdir(exist_ok=True)
    (project / "job.yaml").write_text(textwrap.dedent(text))
    return project


def test_rays_linear_example_unchanged_reports_rows_and_pruned_checkpoints(tmp_path):
    """torch_linear_example.train_func reports a checkpoint every epoch and never asks for one back: each report is
    a metrics row, its checkpoints are committed and pruned to run.keep_checkpoints. (A rerun of such a function
    starts over, saying so: tests/worker/test_raytrain_function.py; a stop and resume: the docs-style test below.)"""
    project = job(tmp_path, f"""
        loop:
          _component_: {EXAMPLES}.torch_linear_example:train_func
          train_loop_config: {{lr: 0.01, epochs: 4, batch_size: 4, data_size: 200}}
        scaling: {{num_workers: 2}}
        run: {{storage_path: {tmp_path / 'runs'}, name: linear, keep_checkpoints: 2}}
    """)
    run_dir = tmp_path / "runs" / "linear"
    run(project)
    result = json.loads((run_dir / "result.json").read_text())
    assert result["status"] == "succeeded" and result["attempt"] == 1
    rows = runrecords.read_metrics(run_dir)
    assert [r["epoch"] for r in rows] == [1, 2, 3, 4] and all(isinstance(r["loss"], float) for r in rows)
    found = assert_checkpoints_sound(run_dir, keep=2)
    assert [checkpoints.position_of(p).epoch for p in found] == [4, 3]
    assert set(json.loads((found[0] / "meta.json").read_text())["files"]) == {"model.pt"}
    assert result["checkpoint"] == str(found[0])


def test_a_docs_style_script_stops_gracefully_and_resumes_through_get_checkpoint(tmp_path):
    """SIGTERM (a deleted pod) ends the function at its next report, whose checkpoint is committed first; the rerun's
    ray.train.get_checkpoint() returns it and the function trains on from there. (A SIGKILL's lease takeover is
    tests/integration/test_attempt.py's, the same attempt code for every loop; what a kill leaves, a torn write and
    rows past the newest commit, and what get_checkpoint() offers then: tests/worker/test_raytrain_function.py.)"""
    project = tmp_path / "project"
    shutil.copytree(REPO / "examples" / "ray-train-script", project)
    storage = tmp_path / "runs"
    run_dir = storage / "job"
    options = ("--storage", str(storage), "--set", "loop.train_loop_config.num_samples=1024")

    proc = start(project, *options, "--set", "loop.train_loop_config.epochs=200")
    try:
        wait_for_checkpoint(proc, run_dir, 1)
        os.kill(proc.pid, signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    finally:
        stop_group(proc)
    assert proc.returncode == 128 + signal.SIGTERM, out[-3000:]
    result = json.loads((run_dir / "result.json").read_text())
    assert result["status"] == "stopped"
    last = runrecords.read_metrics(run_dir)[-1]["epoch"]
    newest = checkpoints.committed(run_dir)[0]
    assert checkpoints.position_of(newest).epoch == last  # stopped at a report

    done = run(project, *options, "--set", f"loop.train_loop_config.epochs={last + 3}")
    assert f"resuming after epoch {last} from {newest.name}" in done.stdout, done.stdout[-3000:]
    result = json.loads((run_dir / "result.json").read_text())
    assert result["status"] == "succeeded" and result["resumed_from_epoch"] == last
    rows = runrecords.read_metrics(run_dir)
    assert [r["epoch"] for r in rows] == list(range(0, last + 3))  # every epoch once, across both attempts
    assert [r["resumed_from_epoch"] for r in rows[-2:]] == [last, last]
    assert_checkpoints_sound(run_dir, keep=2)


# ---------------------------------------------------------------------------------------------- the other examples


def write_fashion_mnist(root: Path, count: int = 256) -> None:
    """FashionMNIST's four raw files (random pixels, `count` images each) where torchvision looks before it
    downloads: ROOT/FashionMNIST/raw."""
    raw = root / "FashionMNIST" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    pixels = bytes((i * 37) % 256 for i in range(count * 28 * 28))
    labels = bytes(i % 10 for i in range(count))
    for prefix in ("train", "t10k"):
        (raw / f"{prefix}-images-idx3-ubyte").write_bytes(struct.pack(">IIII", 2051, count, 28, 28) + pixels)
        (raw / f"{prefix}-labels-idx1-ubyte").write_bytes(struct.pack(">II", 2049, count) + labels)


REGRESSION_DATA = '''
import pandas as pd
import ray.data


def regression_datasets(path: str, split: float = 0.7):
    """torch_regression_example.get_datasets with its S3 CSV read from a local file."""
    dataset = ray.data.read_csv(path)

    def combine_x(batch):
        return pd.DataFrame({"x": batch[[f"x{i:03d}" for i in range(100)]].values.tolist(), "y": batch["y"]})

    dataset = dataset.map_batches(combine_x, batch_format="pandas")
    train, validation = dataset.repartition(num_blocks=4).train_test_split(split, shuffle=True)
    return {"train": train, "validation": validation}
'''


def test_rays_regression_example_unchanged_with_its_datasets_from_a_local_csv(tmp_path):
    import numpy as np

    project = job(tmp_path, f"""
        loop:
          _component_: {EXAMPLES}.torch_regression_example:train_func
          train_loop_config: {{lr: 0.01, hidden_size: 20, batch_size: 16, epochs: 2}}
          datasets_to_split: [train]    # the example's DataConfig(datasets_to_split=["train"]): rank 0 validates
        data: {{_component_: local_data.regression_datasets, loader: ray, path: {tmp_path / 'regression.csv'}}}
        scaling: {{num_workers: 2}}
        run: {{storage_path: {tmp_path / 'runs'}, name: regression}}
    """)
    (project / "local_data.py").write_text(REGRESSION_DATA)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 100))
    columns = {f"x{i:03d}": x[:, i] for i in range(100)}
    import pandas as pd

    pd.DataFrame({**columns, "y": x[:, :3].sum(axis=1)}).to_csv(tmp_path / "regression.csv", index=False)
    run(project)
    run_dir = tmp_path / "runs" / "regression"
    rows = runrecords.read_metrics(run_dir)
    assert [r["epoch"] for r in rows] == [1, 2] and all(isinstance(r["loss"], float) for r in rows)
    assert_loaders_timed(run_dir, rows)  # Ray Data: its shard's iter_torch_batches, and validation under no_grad
    found = assert_checkpoints_sound(run_dir, keep=2)
    assert set(json.loads((found[0] / "meta.json").read_text())["files"]) == {"model.pt"}


def test_rays_fashion_mnist_example_unchanged_with_home_pointed_at_local_data(tmp_path):
    """It reads ~/data (HOME: the knob it has) and reports loss and accuracy each epoch, no checkpoint."""
    home = tmp_path / "home"
    write_fashion_mnist(home / "data")
    project = job(tmp_path, f"""
        loop:
          _component_: {EXAMPLES}.torch_fashion_mnist_example:train_func_per_worker
          train_loop_config: {{lr: 0.001, epochs: 2, batch_size_per_worker: 16}}
        scaling: {{num_workers: 2}}
        run: {{storage_path: {tmp_path / 'runs'}, name: fashion}}
    """)
    run(project, HOME=str(home))
    rows = runrecords.read_metrics(tmp_path / "runs" / "fashion")
    assert [r["epoch"] for r in rows] == [1, 2] and {"loss", "accuracy"} <= set(rows[0])
    assert_loaders_timed(tmp_path / "runs" / "fashion", rows)  # DataLoaders through prepare_data_loader


def assert_loaders_timed(run_dir: Path, rows: list[dict]) -> None:
    """Goodput of a function (raytrain.worker.loadertiming): each row's data wait and evaluation, from the loaders
    it iterated; its start-up ended at its first batch, before its first report recorded the group's start."""
    for before, row in zip([None, *rows], rows):
        timing = row["timing"]
        assert timing["data_s"] > 0 and timing["val_s"] > 0, row
        if before is not None:  # within the time since the row before
            assert timing["data_s"] + timing["val_s"] <= timing["time"] - before["timing"]["time"], rows
    [start] = [e for e in runrecords.read_events(run_dir) if e["event"] == "start"]
    assert start["began"] < start["first_batch"] < start["time"], start


def test_the_docs_style_script_runs_as_a_rayjob_through_emulate(tmp_path):
    """examples/ray-train-script as `kubectl apply -k` applies it, run by `raytrain emulate` on a local multi-node
    cluster: the function reaches the head and the workers only through the job's working_dir."""
    import yaml

    project = tmp_path / "project"
    shutil.copytree(REPO / "examples" / "ray-train-script", project)
    job_file = project / "job.yaml"
    job_config = yaml.safe_load(job_file.read_text())
    job_config["loop"]["train_loop_config"].update(epochs=2, num_samples=256)
    job_file.write_text(yaml.safe_dump(job_config))
    shared = tmp_path / "shared"
    values = REPO / "helm" / "raytrain-cluster" / "values-kind.yaml"
    done = subprocess.run([*RAYTRAIN, "emulate", ".", "--values", str(values), "--shared", str(shared)], cwd=project,
                          capture_output=True, text=True, timeout=900, env=env())
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    run_dir = shared / "runs" / "ray-train-script"
    assert json.loads((run_dir / "result.json").read_text())["status"] == "succeeded"
    assert [r["epoch"] for r in runrecords.read_metrics(run_dir)] == [0, 1]
    assert_checkpoints_sound(run_dir, keep=2)


EVERY_RANK = '''
import json, os, tempfile
import ray.train

def train_func(config):
    rank = ray.train.get_context().get_world_rank()
    start = 0
    checkpoint = ray.train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as d:
            start = json.load(open(os.path.join(d, "state.json")))["epoch"] + 1
            assert os.path.exists(os.path.join(d, "rank-1.bin")), sorted(os.listdir(d))  # every rank's files
    for epoch in range(start, config["epochs"]):
        with tempfile.TemporaryDirectory() as tmp:
            json.dump({"epoch": epoch}, open(os.path.join(tmp, "state.json"), "w"))  # the same on every rank
            open(os.path.join(tmp, f"rank-{rank}.bin"), "wb").write(bytes([rank, epoch]) * 1000)
            # the last epoch: rank 1 alone reports one (the others report metrics only)
            reported = rank == 1 or epoch < config["epochs"] - 1
            print(f"rank {rank} trained epoch {epoch}")  # rank 0's on the console and in the run's logs
            ray.train.report({"epoch": epoch, "loss": 1.0 / (epoch + 1)},
                             checkpoint=ray.train.Checkpoint.from_directory(tmp) if reported else None)
'''


def test_on_s3_every_ranks_reported_files_reach_the_bucket_and_a_rerun_resumes_from_them(tmp_path, s3_prefix,
                                                                                      request):
    """Issue 40, 9 and 12: a function whose every rank reports a directory (a shared state.json and a file of its
    own) on S3: each committed checkpoint holds every rank's files (on an object store each worker stages on its
    own node and uploads its own), rank 1's alone when only it reports, keep_checkpoints is honoured, no staged
    copy stays in the temporary directory, and a rerun with more epochs resumes from them. Issue 38: what rank 0
    prints is on the driver's console, each line before its report's row, and kept in the bucket (worker-logs/
    as it is written, driver-logs/ with the console); rank 1's is kept in its own log, not on the console; and
    `raytrain why` reads the bucket's run: each attempt and how it ended."""
    (tmp_path / "project").mkdir()
    (tmp_path / "project" / "every_rank.py").write_text(EVERY_RANK)
    text = f"""
        loop: {{_component_: every_rank:train_func, train_loop_config: {{epochs: {{epochs}}}}}}
        scaling: {{num_workers: 2}}
        run: {{storage_path: {s3_prefix}, name: ranks, keep_checkpoints: 2}}
    """
    project = job(tmp_path, text.replace("{epochs}", "4"))
    # This run's own temporary directory, short (Ray puts its AF_UNIX sockets under it: 107 bytes at most)
    tmpdir = Path(tempfile.mkdtemp(prefix="rt-", dir="/tmp"))
    request.addfinalizer(lambda: shutil.rmtree(tmpdir, ignore_errors=True))
    done = run(project, TMPDIR=str(tmpdir))
    run_dir = runrecords.run_dir_of(s3_prefix, "ranks")
    lines = done.stdout.splitlines()
    assert [line for line in lines if line.startswith("rank ")] == [f"rank 0 trained epoch {e}" for e in range(4)]
    for epoch in range(4):  # each print before its report's row (a poll prints its new lines, then its new rows)
        row = lines.index(f"epoch {epoch}  loss {1.0 / (epoch + 1):.4g}")
        assert lines.index(f"rank 0 trained epoch {epoch}") < row, done.stdout
    assert (run_dir / "worker-logs" / "attempt-1-rank0.log").read_text() == \
        "".join(f"rank 0 trained epoch {epoch}\n" for epoch in range(4))
    assert (run_dir / "worker-logs" / "attempt-1-rank1.log").read_text() == \
        "".join(f"rank 1 trained epoch {epoch}\n" for epoch in range(4))
    [driver_log] = list((run_dir / "driver-logs").iterdir())
    assert "rank 0 trained epoch 3\n" in driver_log.read_text()
    found = checkpoints.committed(run_dir)
    assert [checkpoints.position_of(p).epoch for p in found] == [3, 2]
    for path in found:
        checkpoints.verify_hash(path)
    names = [set(json.loads((p / "meta.json").read_text())["files"]) for p in found]
    assert names == [{"state.json", "rank-1.bin"}, {"state.json", "rank-0.bin", "rank-1.bin"}]
    assert (found[1] / "data" / "rank-1.bin").read_bytes() == bytes([1, 2]) * 1000
    assert not [p for p in (tmpdir / "raytrain-local").rglob(".staging-*")]  # every rank's staged copy removed
    project = job(tmp_path, text.replace("{epochs}", "6"))
    run(project, TMPDIR=str(tmpdir))
    assert [r["epoch"] for r in runrecords.read_metrics(run_dir)] == [0, 1, 2, 3, 4, 5]
    assert runrecords.read_metrics(run_dir)[-1]["resumed_from_epoch"] == 3
    why = subprocess.run([*RAYTRAIN, "why", str(run_dir)], capture_output=True, text=True, timeout=120, env=env(),
                         check=False)
    assert why.returncode == 0, why.stderr
    assert "2 attempt(s); the last: succeeded" in why.stdout and "attempt 1: succeeded" in why.stdout, why.stdout
    assert "first failure" not in why.stdout
