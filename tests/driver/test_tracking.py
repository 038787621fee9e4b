"""training/raytrain/driver/tracking.py: which rows are final, each sent once across syncs and attempts, a tracker that is
down or slow, the fence, tracking.json, and `raytrain track`'s refusals. The trackers here are fakes that record what
they are sent; MLflow's own tracker on MLflow's SQLite store is the last test here; the real MLflow server and W&B's
offline files are in tests/integration/test_tracking.py."""

from __future__ import annotations

import io
import json
import threading
import time
from pathlib import Path

import pytest

from raytrain.driver import preflight, tracking
from raytrain.errors import UsageError
from raytrain.lifecycle.endings import AttemptEnded, Ending
from raytrain.rundir import layout, runrecords
from raytrain.spec.config import load_config


class Fence:
    token = 1

    def __init__(self):
        self.open = True

    def check(self):
        if not self.open:
            raise AttemptEnded(Ending.LEASE_LOST, "attempt 2 took the run over")

    def poll(self):
        return None


class FakeTracker:
    """A tracker that keeps what it is sent, refuses while `down` says so, and can be slow."""

    name, label = "mlflow", "the fake tracker"

    def __init__(self, holds: dict | None = None, down: int = 0, slow_s: float = 0.0):
        self.points: dict[int, dict] = dict(holds or {})
        self.sends: list[list[int]] = []
        self.down, self.slow_s = down, slow_s
        self.checkpoint, self.closed = None, None

    def open(self, state, save):
        if self.down:
            self.down -= 1
            raise ConnectionError("HTTPConnectionPool(...): Max retries exceeded (Caused by NewConnectionError("
                                  "'...: Failed to establish a new connection: [Errno 111] Connection refused'))")
        state.setdefault("run_id", "run-1")
        save()
        return max(self.points, default=0)

    def send(self, rows):
        time.sleep(self.slow_s)
        epochs = [row["epoch"] for row in rows]
        assert not set(epochs) & set(self.points), f"sent twice: {epochs}"
        self.sends.append(epochs)
        self.points.update({row["epoch"]: tracking.metric_values(row) for row in rows})

    def settle(self):
        pass

    def reference(self, checkpoint, position):
        self.checkpoint = (checkpoint.name, position.epoch)

    def close(self, status):
        self.closed = status


def commit_checkpoint(run_dir: Path, epoch: int, step: int = 0) -> Path:
    """A committed checkpoint as newest_complete sees one (a manifest whose size matches its state.pt)."""
    at = f"_step{step:08d}" if step else ""
    directory = run_dir / f"checkpoint_epoch{epoch:06d}{at}_{epoch:08x}"
    directory.mkdir(parents=True)
    (directory / "state.pt").write_bytes(b"x" * 10)
    (directory / "meta.json").write_text(json.dumps({"format": 2, "epoch": epoch, "step": step, "sha256": "0" * 64,
                                                     "size": 10}))
    return directory


def rows(records: runrecords.Records, *epochs: int, loss: float = 1.0) -> None:
    for epoch in epochs:
        records.append_metrics({"epoch": epoch, "train_loss": loss / epoch, "samples_per_s": 100,
                                "resumed_from_epoch": None})


def syncer(run_dir: Path, tracker: FakeTracker, fence: Fence | None = None, every_s: float = 0.05,
           out: io.StringIO | None = None) -> tracking.Syncer:
    return tracking.Syncer(runrecords.Records(run_dir, fence or Fence()), [tracker], {"mlflow": {}}, every_s,
                           out or io.StringIO())


# ---------------------------------------------------------------------------------------------- what is final

ROW = {"epoch": 3, "train_loss": 0.5, "val_accuracy": 1, "samples_per_s": 10.0, "resumed_from_epoch": 2,
       "attempt": 4, "note": "text", "flag": True, "diverged": float("inf"), "missing": None}


def test_a_rows_measurements_are_its_finite_numbers_the_epoch_included():
    assert tracking.metric_values(ROW) == {"epoch": 3.0, "train_loss": 0.5, "val_accuracy": 1.0,
                                           "samples_per_s": 10.0}


@pytest.mark.parametrize("checkpoint, everything, final", [
    (None, False, []),  # nothing committed: every row may still be trained again
    ((2, 0), False, [1, 2]),
    ((2, 40), False, [1, 2]),  # a mid-epoch checkpoint completed the epochs before its own
    ((5, 0), False, [1, 2, 3]),  # rows not written yet are sent when they are
    (None, True, [1, 2, 3]),  # the attempt succeeded: its rows are final
])
def test_final_rows_are_those_at_or_before_the_newest_checkpoint(tmp_path, checkpoint, everything, final):
    records = runrecords.Records(tmp_path)
    rows(records, 1, 2, 3)
    newest = commit_checkpoint(tmp_path, *checkpoint) if checkpoint else None
    assert [row["epoch"] for row in tracking.final_rows(runrecords.read_metrics(tmp_path), newest, everything)] == final


def test_a_retrained_epochs_later_row_wins():
    given = [{"epoch": 1, "v": 1}, {"epoch": 2, "v": 2}, {"epoch": 2, "v": 3}]
    assert tracking.final_rows(given, None, everything=True) == [{"epoch": 1, "v": 1}, {"epoch": 2, "v": 3}]


def test_the_config_is_flattened_to_dotted_text():
    assert tracking.flat_config({"train": {"lr": 0.01, "betas": [0.9, 0.95], "loss": "mse"}, "run": {"name": "x",
                                 "tracking": None, "empty": {}}}) == {
        "train.lr": "0.01", "train.betas": "[0.9, 0.95]", "train.loss": "mse", "run.name": "x",
        "run.tracking": "null", "run.empty": "{}"}


# ---------------------------------------------------------------------------------------------- exactly once

def test_each_final_row_is_sent_once_across_syncs_and_attempts(tmp_path):
    records = runrecords.Records(tmp_path)
    rows(records, 1, 2, 3)
    tracker = FakeTracker()
    first = syncer(tmp_path, tracker)
    first.sync()
    assert tracker.sends == []  # no checkpoint yet
    commit_checkpoint(tmp_path, 2)
    first.sync()
    first.sync()
    assert tracker.sends == [[1, 2]] and tracker.checkpoint == ("checkpoint_epoch000002_00000002", 2)
    # a new attempt (a kill came between a send and anything else) asks the tracker what it holds
    records.truncate_metrics(2)  # the resume drops row 3, which was never final, and trains it again
    rows(records, 3, 4, loss=2.0)
    second = syncer(tmp_path, tracker)
    second.finish(Ending.SUCCEEDED.value)
    assert tracker.sends == [[1, 2], [3, 4]] and tracker.closed == "succeeded"
    assert tracker.points[3]["train_loss"] == pytest.approx(2.0 / 3)  # the retrained row, not the dead attempt's
    assert json.loads((tmp_path / layout.TRACKING_FILE).read_text()) == {"mlflow": {"run_id": "run-1"}}


def test_a_stopped_attempt_sends_only_final_rows_at_its_end(tmp_path):
    records = runrecords.Records(tmp_path)
    rows(records, 1, 2, 3)
    commit_checkpoint(tmp_path, 2)
    tracker = FakeTracker()
    syncer(tmp_path, tracker).finish(Ending.STOPPED.value)
    assert tracker.sends == [[1, 2]] and tracker.closed == "stopped"


# ---------------------------------------------------------------------------------------------- tracker trouble

def test_a_tracker_that_is_down_is_retried_said_once_and_sent_to_when_back(tmp_path):
    records = runrecords.Records(tmp_path)
    rows(records, 1, 2)
    commit_checkpoint(tmp_path, 2)
    out = io.StringIO()
    tracker = FakeTracker(down=3)
    sync = syncer(tmp_path, tracker, out=out, every_s=0.01).start()
    deadline = time.monotonic() + 10
    while tracker.sends != [[1, 2]] and time.monotonic() < deadline:
        time.sleep(0.01)
    sync.finish(Ending.SUCCEEDED.value)
    said = out.getvalue()
    assert tracker.sends == [[1, 2]] and tracker.down == 0
    assert said.count("warning: tracking: the fake tracker failed ([Errno 111] Connection refused); training goes "
                      "on") == 1, said
    assert "tracking: the fake tracker answers again; it holds epochs up to 2" in said
    assert "not in" not in said  # nothing left unsent


def test_what_a_down_tracker_missed_at_the_end_is_named_with_who_sends_it(tmp_path):
    records = runrecords.Records(tmp_path)
    rows(records, 1, 2, 3)
    out = io.StringIO()
    syncer(tmp_path, FakeTracker(down=99), out=out).start().finish(Ending.SUCCEEDED.value)
    assert (f"warning: tracking: epochs 1..3 of run {tmp_path.name} are not in the fake tracker yet (it did not "
            f"answer); the run's next attempt sends them, or now: raytrain track {tmp_path}") in out.getvalue()


def test_the_last_sync_is_bounded_however_slow_the_tracker(tmp_path):
    records = runrecords.Records(tmp_path)
    rows(records, 1, 2)
    out = io.StringIO()
    sync = syncer(tmp_path, FakeTracker(slow_s=5), out=out).start()
    began = time.monotonic()
    sync.finish(Ending.SUCCEEDED.value, timeout_s=0.3)
    assert time.monotonic() - began < 2
    assert "epochs 1..2 of run" in out.getvalue() and "the last sync ran out of time" in out.getvalue()


def test_an_attempt_that_lost_the_run_sends_and_writes_nothing(tmp_path):
    records = runrecords.Records(tmp_path)
    rows(records, 1, 2)
    commit_checkpoint(tmp_path, 2)
    fence, tracker = Fence(), FakeTracker()
    fence.open = False
    sync = syncer(tmp_path, tracker, fence).start()
    sync.finish(Ending.SUCCEEDED.value)
    assert tracker.sends == [] and tracker.closed is None and sync.fenced == "attempt 2 took the run over"
    assert not (tmp_path / layout.TRACKING_FILE).exists()


def test_the_syncer_thread_never_holds_up_the_caller(tmp_path):
    records = runrecords.Records(tmp_path)
    rows(records, 1)
    commit_checkpoint(tmp_path, 1)
    gate = threading.Event()
    tracker = FakeTracker()
    tracker.open = lambda state, save: gate.wait(10) and 0  # a tracker that hangs until released
    began = time.monotonic()
    sync = syncer(tmp_path, tracker).start()
    assert time.monotonic() - began < 0.5
    sync.abandon()
    gate.set()


# ---------------------------------------------------------------------------------------------- tracking.json

def test_a_runs_tracker_run_is_kept_while_its_settings_stay(tmp_path):
    cfg = load_config("linear", ["run.tracking.mlflow.uri=http://m:5000", f"run.storage_path={tmp_path}"])
    records = runrecords.Records(tmp_path)
    first = tracking.Syncer.for_run(cfg, records)
    assert first.state["mlflow"]["settings"] == {"uri": "http://m:5000", "experiment": "raytrain"}
    assert first.state["mlflow"]["config"]["train"]["epochs"] == cfg.train.epochs  # until the tracker logs it
    first.state["mlflow"].update(run_id="abc", config_logged=True)
    first.save()
    again = tracking.Syncer.for_run(cfg, records)
    assert again.state["mlflow"]["run_id"] == "abc"
    out = io.StringIO()
    moved = load_config("linear", ["run.tracking.mlflow.uri=http://other:5000", f"run.storage_path={tmp_path}"])
    fresh = tracking.Syncer.for_run(moved, records, out)
    assert "run_id" not in fresh.state["mlflow"] and "a new tracker run starts" in out.getvalue()
    assert tracking.Syncer.for_run(load_config("linear"), records) is None


def test_a_missing_client_package_is_named_with_its_install_command(monkeypatch):
    monkeypatch.setitem(tracking.PACKAGES, "wandb", ("raytrain_no_such_module", "pip install wandb"))
    with pytest.raises(UsageError, match=r"run.tracking.wandb is set, but the raytrain_no_such_module package is "
                                         r"not installed. Fix: pip install wandb, or remove run.tracking.wandb"):
        tracking.check_installed(["wandb"])
    tracking.check_installed([])


def test_a_run_whose_tracker_client_is_missing_is_refused_before_it_starts(raytrain, tmp_path, monkeypatch):
    monkeypatch.setitem(tracking.PACKAGES, "mlflow", ("raytrain_no_such_module", "pip install mlflow-skinny"))
    done = raytrain("local", "linear", "--storage", str(tmp_path), "--set", "run.tracking.mlflow.uri=http://m:5000")
    assert done.returncode == 2 and "Fix: pip install mlflow-skinny" in done.stderr, done
    assert not (tmp_path / "linear" / "lease.json").exists() and not (tmp_path / "linear" / "config.yaml").exists()


def test_mlflow_without_a_uri_anywhere_is_refused_before_it_writes_mlflow_db_here(raytrain, tmp_path, monkeypatch):
    """Issue 40, item 14: `run.tracking: {mlflow: {}}` with no URI silently wrote ./mlflow.db wherever the driver
    ran. Refused with the fix before the run starts; with MLFLOW_TRACKING_URI set, the same config is fine."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    workdir = tmp_path / "cwd"
    workdir.mkdir()
    done = raytrain("local", "linear", "--storage", str(tmp_path / "runs"), "--set", "run.tracking.mlflow={}",
                    "--set", "train.epochs=1", cwd=workdir)
    assert done.returncode == 2, done
    assert "run.tracking.mlflow has no uri and MLFLOW_TRACKING_URI is not set" in done.stderr
    assert "Fix: set run.tracking.mlflow.uri" in done.stderr and "Traceback" not in done.output
    assert not list(workdir.iterdir()) and not (tmp_path / "runs" / "linear" / "lease.json").exists()
    cfg = load_config("linear", ["run.tracking.mlflow={}"])
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'elsewhere.db'}")
    preflight.check_tracking_destination(cfg)
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    preflight.check_tracking_destination(load_config("linear", ["run.tracking.mlflow.uri=http://m:5000"]))


@pytest.mark.parametrize("made, fragments", [
    (None, ["is not a run directory", "Fix:"]),
    ("{}", ["no tracking.json naming a tracker", "run.tracking"]),
    ("[1, 2]", ["no tracking.json naming a tracker"]),
])
def test_track_refuses_a_directory_without_a_tracker(raytrain, tmp_path, made, fragments):
    run_dir = tmp_path / "run"
    if made is not None:
        run_dir.mkdir()
        (run_dir / layout.TRACKING_FILE).write_text(made)
    done = raytrain("track", str(run_dir))
    assert done.returncode == 2, done
    for fragment in fragments:
        assert fragment in done.stderr, done.stderr


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # SQLAlchemy's, inside MLflow's store
# No Ray and no server, so the unit tier; MLflow's first SQLite store runs its schema migrations: seconds, and
# more than the unit limit on a loaded machine.
@pytest.mark.timeout(180)
def test_an_mlflow_run_created_just_before_a_kill_is_found_again_and_asked_what_it_holds(tmp_path):
    """The MLflow tracker itself, on MLflow's own SQLite store (no server needed for this): a kill between creating
    the run and saving its id in tracking.json leaves only the uid saved; the next attempt finds that run by its
    uid tag instead of making a second one, logs the config once, and learns the newest epoch it holds."""
    pytest.importorskip("mlflow", reason="the dev extra's mlflow (pip install -e '.[dev]')")
    from mlflow.tracking import MlflowClient

    from raytrain.driver.tracking import Mlflow
    from raytrain.spec.sections import MlflowTracking

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    experiment = client.create_experiment("found")
    made = client.create_run(experiment, tags={"raytrain.uid": "u-1"}).info.run_id
    state = {"uid": "u-1", "config": {"train": {"lr": 0.01}}}
    saved = []
    tracker = Mlflow(MlflowTracking(uri=uri, experiment="found"), "killed", tmp_path)
    assert tracker.open(state, lambda: saved.append(dict(state))) == 0
    assert state["run_id"] == made and state["config_logged"] and "config" not in state
    tracker.send([{"epoch": 1, "train_loss": 0.5}, {"epoch": 2, "train_loss": 0.25, "bad name!": 1.0}])
    again = Mlflow(MlflowTracking(uri=uri, experiment="found"), "killed", tmp_path)
    assert again.open(state, lambda: None) == 2  # what MLflow holds, whatever tracking.json says
    assert [r.info.run_id for r in client.search_runs([experiment])] == [made]
    assert client.get_run(made).data.params == {"train.lr": "0.01"}
    assert sorted(client.get_run(made).data.metrics) == ["epoch", "train_loss"]  # an invalid name is not sent
