"""run.tracking against real trackers: a real `mlflow server` process (SQLite, HTTP on a free port) and W&B's
offline mode. One tracker run per raytrain run across a kill -9 and a resume, its metric history equal to
metrics.jsonl (the dead attempt's uncommitted rows never sent); a tracker that is down costs training nothing and
gets the points later.

    .venv/bin/pytest -m integration tests/integration/test_tracking.py -v --durations=0
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from raytrain.checkpoint import checkpoints
from raytrain.cluster import localcluster
from raytrain.cluster.raynode import free_port
from raytrain.rundir import goodput
from tests.support import checks
from tests.support.trackers import (expected_history, mlflow_history, mlflow_runs, mlflow_server, wandb_history,
                                    wandb_offline_runs)

pytestmark = pytest.mark.integration
pytest.importorskip("mlflow", reason="the dev extra's mlflow (pip install -e '.[dev]')")

REPO = Path(__file__).resolve().parents[2]
RAYTRAIN = [sys.executable, "-m", "raytrain.cli"]
ENV = {**os.environ, "RAYTRAIN_LEASE_TTL_S": "10"}  # a killed holder is taken over 10 s after its last renewal


def mlflow_sets(uri: str, experiment: str) -> list[str]:
    return ["--set", f"run.tracking.mlflow.uri={uri}", "--set", f"run.tracking.mlflow.experiment={experiment}",
            "--set", "run.tracking.sync_every_s=0.5"]


def raytrain(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([*RAYTRAIN, *args], capture_output=True, text=True, timeout=timeout, env=ENV)


def start(*args: str) -> subprocess.Popen:
    return subprocess.Popen([*RAYTRAIN, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, env=ENV)


def kill_everything(proc: subprocess.Popen) -> None:
    """SIGKILL the driver and all it started at once, as when its node is lost: nothing writes afterwards."""
    pids = localcluster.tree_pids(proc.pid)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()
    deadline = time.monotonic() + 20
    while any(localcluster.process_start(pid) is not None for pid in pids[1:]) and time.monotonic() < deadline:
        time.sleep(0.2)


def newest_epoch(run_dir: Path) -> int:
    newest = checkpoints.newest_complete(run_dir)
    return checkpoints.position_of(newest).epoch if newest is not None else 0


def result_of(run_dir: Path) -> dict:
    return json.loads((run_dir / "result.json").read_text())


def wait_until(condition, proc: subprocess.Popen, what: str, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if proc.poll() is not None:
            raise AssertionError(f"the run ended before {what}:\n{proc.stdout.read()[-3000:]}")
        if time.monotonic() > deadline:
            kill_everything(proc)
            raise AssertionError(f"never saw {what}:\n{proc.stdout.read()[-3000:]}")
        time.sleep(0.2)


def assert_one_run_equal_to_metrics(uri: str, experiment: str, run_dir: Path):
    """The experiment holds one run, whose every metric's history is metrics.jsonl's column, step = epoch."""
    found = mlflow_runs(uri, experiment)
    assert len(found) == 1, [r.info.run_id for r in found]
    run = found[0]
    history = mlflow_history(uri, run.info.run_id)
    # Besides the rows: the run's goodput at each attempt's end that closed the tracker run (step = the attempt)
    logged = {key: history.pop(key) for key in list(history) if key == "goodput" or key.startswith("goodput/")}
    assert history == expected_history(run_dir / "metrics.jsonl")
    assert set(logged) == {"goodput", "goodput/wall_s", *(f"goodput/{cause}_s" for cause in goodput.CAUSES)}, logged
    newest = {key: points[-1][1] for key, points in logged.items()}
    assert 0 < newest["goodput"] <= 1 and newest["goodput/training_s"] > 0, newest
    assert sum(newest[f"goodput/{cause}_s"] for cause in goodput.CAUSES) == pytest.approx(newest["goodput/wall_s"],
                                                                                          abs=0.05)
    state = json.loads((run_dir / "tracking.json").read_text())
    assert state["mlflow"]["run_id"] == run.info.run_id
    return run


def rayjob(path: Path, entrypoint: str) -> Path:
    """A RayJob whose cluster is one head pod (1 CPU) and whose entrypoint is `entrypoint`."""
    container = {"name": "ray", "image": "ghcr.io/raytrain/raytrain:0.1.0-ray2.60.0",
                 "resources": {"limits": {"cpu": "1", "memory": "2Gi"}}}
    path.write_text(yaml.safe_dump({
        "apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": "tracked"},
        "spec": {"entrypoint": entrypoint, "rayClusterSpec": {
            "rayVersion": "2.60.0", "headGroupSpec": {"rayStartParams": {}, "template": {"spec": {
                "containers": [container]}}}}}}))
    return path


EVERY = 6  # the killed driver's checkpoint interval, in epochs


def test_one_mlflow_run_across_a_killed_driver_and_a_resubmitted_rayjob(tmp_path):
    """A driver sends epochs while it trains and is killed -9 with rows past its newest checkpoint, which a resume
    drops and trains again. The run is resubmitted as a RayJob (`raytrain emulate`; its entrypoint, `raytrain run`,
    is the driver on the head, its rows written by a Ray Train worker; loopback isolation, so that the head reaches
    the test's server): one MLflow run, no point twice, none of the dead attempt's uncommitted rows, params once
    (the first attempt's), the newest checkpoint named. The killed driver is `raytrain local`'s (the same attempt
    as `raytrain run`'s, without Ray's start: this test already starts a cluster)."""
    from raytrain.cluster.emulate import emulate
    from raytrain.validator.crds import CRDS_ENV, resolve_crd_dir

    shared, name, experiment = tmp_path / "shared", "tracked", "lost-head"
    run_dir = shared / "runs" / name
    with mlflow_server(tmp_path / "mlflow") as uri:
        first = start("local", "linear", "--storage", str(shared / "runs"), "--name", name, "--set",
                      "train.epochs=400", "--set", "data.num_samples=6000", "--set", f"run.checkpoint_every={EVERY}",
                      *mlflow_sets(uri, experiment))

        def sent() -> bool:
            found = mlflow_runs(uri, experiment)
            return len(mlflow_history(uri, found[0].info.run_id).get("epoch", []) if found else []) >= 3

        def early_in_a_checkpoint_interval() -> bool:
            # One or two rows past the newest checkpoint, so the kill lands at least 3 epochs before the next one
            # (CI: a row seen just before its epoch's checkpoint committed left no uncommitted row)
            newest_row = max(checks.metrics_epochs(run_dir) or [0])
            return 1 <= newest_row - newest_epoch(run_dir) <= 2 and newest_row % EVERY != 0

        wait_until(sent, first, "3 epochs in MLflow")
        wait_until(early_in_a_checkpoint_interval, first, "a row or two past the newest checkpoint")
        kill_everything(first)
        committed = newest_epoch(run_dir)
        uncommitted = [e for e in checks.metrics_epochs(run_dir) if e > committed]
        [before] = mlflow_runs(uri, experiment)
        sent = [step for step, _ in mlflow_history(uri, before.info.run_id)["epoch"]]
        assert uncommitted and max(sent) <= committed, (sent, committed, uncommitted)  # only final rows were sent

        epochs = committed + 3
        job = rayjob(tmp_path / "rayjob.yaml", " ".join([
            f"raytrain run linear --name {name} --storage /mnt/shared/runs --address auto --wait-for-lease",
            f"--set train.epochs={epochs} --set data.num_samples=6000 --set run.checkpoint_every={EVERY}",
            "--set scaling.num_workers=1",
            *mlflow_sets(uri, experiment)]))
        with open(tmp_path / "emulate.txt", "w+") as out:
            code = emulate(job, None, False, resolve_crd_dir(None, os.environ.get(CRDS_ENV)), out=out,
                           shared_dir=shared, isolation="loopback")
            out.seek(0)
            output = out.read()
        assert code == 0, output[-4000:]
        assert checks.metrics_epochs(run_dir) == list(range(1, epochs + 1))
        run = assert_one_run_equal_to_metrics(uri, experiment, run_dir)
        params = run.data.params
        assert params["train.epochs"] == "400" and params["scaling.num_workers"] == "3"  # the first attempt's, once
        assert result_of(run_dir)["worker_group_starts"] == 1 and result_of(run_dir)["attempt"] == 2
        assert params["model._component_"] == "raytrain.models.mlp" and params["run.name"] == name
        assert run.data.tags["raytrain.checkpoint"] == str(checkpoints.newest_complete(run_dir))
        assert run.data.tags["raytrain.checkpoint_epoch"] == str(epochs)
        assert run.info.status == "FINISHED"
        result = result_of(run_dir)
        assert result["tracking"] == {"mlflow": run.info.run_id} and result["resumed_from_epoch"] == committed


@pytest.mark.serial  # it compares two runs' times: another test's load between them would skew that
def test_a_tracker_that_is_down_costs_training_nothing_and_gets_the_points_later(tmp_path):
    """Nothing listens on the tracker's port while `raytrain local` trains: it finishes in its usual time, saying
    once that MLflow is down and how the points get there. With the server up, `raytrain track` sends them; the
    run's next attempt sends its own into the same MLflow run."""
    storage, experiment = tmp_path / "runs", "down"
    port = free_port("127.0.0.1")
    uri = f"http://127.0.0.1:{port}"
    common = ["local", "linear", "--storage", str(storage), "--set", "data.num_samples=2000"]
    began = time.monotonic()
    plain = raytrain(*common, "--name", "untracked", "--set", "train.epochs=6")
    usual = time.monotonic() - began
    assert plain.returncode == 0, plain.stdout[-3000:] + plain.stderr[-3000:]

    began = time.monotonic()
    down = raytrain(*common, "--name", "tracked", "--set", "train.epochs=6", *mlflow_sets(uri, experiment))
    took = time.monotonic() - began
    assert down.returncode == 0, down.stdout[-3000:] + down.stderr[-3000:]
    # said, with what is unsent and how it gets there
    assert f"warning: tracking: epochs 1..6 of run tracked are not in MLflow at {uri} yet" in down.stdout, down.stdout
    assert f"raytrain track {storage / 'tracked'}" in down.stdout, down.stdout[-3000:]
    assert took < usual + 15, (took, usual)  # at most the bounded last sync (10 s) more
    refused = raytrain("track", str(storage / "tracked"))
    assert refused.returncode == 1 and uri in refused.stderr and "Fix:" in refused.stderr, \
        refused.stdout + refused.stderr

    with mlflow_server(tmp_path / "mlflow", port=port):
        tracked = raytrain("track", str(storage / "tracked"))
        assert tracked.returncode == 0, tracked.stdout[-3000:] + tracked.stderr[-3000:]
        assert "mlflow holds epochs up to 6" in tracked.stdout, tracked.stdout
        run = assert_one_run_equal_to_metrics(uri, experiment, storage / "tracked")
        assert run.info.status == "FINISHED" and run.data.params["train.epochs"] == "6"

        more = raytrain(*common, "--name", "tracked", "--set", "train.epochs=9", *mlflow_sets(uri, experiment))
        assert more.returncode == 0, more.stdout[-3000:] + more.stderr[-3000:]
        assert "warning" not in more.stdout, more.stdout[-3000:]
        assert checks.metrics_epochs(storage / "tracked") == list(range(1, 10))
        assert_one_run_equal_to_metrics(uri, experiment, storage / "tracked")


def test_wandb_offline_keeps_one_run_id_across_a_kill_and_a_resume(tmp_path):
    """W&B in offline mode: each attempt writes an offline run directory; all of them carry the one run id that
    tracking.json keeps (W&B's `wandb sync` uploads them into one run), and together they hold every epoch of
    metrics.jsonl with its values, the killed attempt none of its uncommitted rows."""
    storage, name, wandb_dir = tmp_path / "runs", "wb", tmp_path / "wandb-files"
    run_dir = storage / name
    sets = ["--set", "run.tracking.wandb.project=raytrain-tests", "--set", "run.tracking.wandb.mode=offline",
            "--set", f"run.tracking.wandb.dir={wandb_dir}", "--set", "run.tracking.sync_every_s=0.5",
            "--set", "run.checkpoint_every=3", "--set", "data.num_samples=6000"]
    first = start("local", "linear", "--storage", str(storage), "--name", name, "--set", "train.epochs=400", *sets)

    def sent_and_uncommitted() -> bool:
        try:
            sent = json.loads((run_dir / "tracking.json").read_text())["wandb"].get("sent_epoch", 0)
        except (OSError, ValueError, KeyError):
            return False
        return sent >= 3 and max(checks.metrics_epochs(run_dir) or [0]) > newest_epoch(run_dir)

    wait_until(sent_and_uncommitted, first, "3 epochs sent to W&B and a row past the newest checkpoint")
    kill_everything(first)
    committed = newest_epoch(run_dir)
    killed_rows = {row["epoch"]: row for row in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())}
    assert any(epoch > committed for epoch in killed_rows)
    epochs = committed + 3
    resumed = raytrain("local", "linear", "--storage", str(storage), "--name", name, "--set", f"train.epochs={epochs}",
                       *sets)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]

    run_id = json.loads((run_dir / "tracking.json").read_text())["wandb"]["id"]
    offline = wandb_offline_runs(wandb_dir)
    assert len(offline) == 2 and all(path.name.endswith(f"-{run_id}") for path in offline), offline
    histories = [wandb_history(path) for path in offline]
    assert max(row["_step"] for row in histories[0]) <= committed  # the killed attempt sent only committed rows
    rows = {row["epoch"]: row for row in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())}
    logged = {}
    for history in histories:
        for point in history:
            row = rows[point["_step"]]
            # a point sent twice (the resume repeats what the killed attempt sent after its last save) is the same
            assert point["train_loss"] == pytest.approx(row["train_loss"]) and point["epoch"] == row["epoch"]
            logged[point["_step"]] = point
    assert sorted(logged) == list(range(1, epochs + 1))
    result = json.loads((run_dir / "result.json").read_text())
    assert result["tracking"] == {"wandb": run_id}
