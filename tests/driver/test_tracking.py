"""training/raytrain/driver/tracking.py: which rows are final, each sent once across syncs and attempts, a tracker that is
down or slow, the fence, tracking.json, and `raytrain track`'s refusals. The trackers here are fakes that record what
they are sent; MLflow's own tracker on MLflow's SQLite store is in tests/driver/test_trackers.py, the real MLflow
server and W&B's offline files in tests/integration/test_tracking.py."""

from __future__ import annotations

import io
import json
import threading
import time
from pathlib import Path

import pytest

from raytrain.driver import trackers, tracking
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
        self.checkpoint, self.closed, self.summary = None, None, None

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
        self.points.update({row["epoch"]: trackers.metric_values(row) for row in rows})

    def settle(self):
        pass

    def reference(self, checkpoint, position):
        self.checkpoint = (checkpoint.name, position.epoch)

    def summarize(self, summary, attempt):
        self.summary = (summary, attempt)

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


def test_an_attempts_end_sends_the_runs_goodput_by_cause_before_closing(tmp_path):
    """Issue 38: the tracker gets what `raytrain report` shows, as of the attempt's end: the fraction, and every
    cause's seconds, which sum to the wall time; at the attempt's step."""
    from raytrain.rundir import goodput

    records = runrecords.Records(tmp_path, Fence())
    began = time.time() - 3
    records.append_event("start", epoch=1, attempt=Fence.token, time=began)
    for epoch in (1, 2):
        records.append_metrics({"epoch": epoch, "train_loss": 1.0, "timing": {
            "time": began + epoch, "data_s": 0.25, "val_s": 0.1, "checkpoint_s": 0.0}})
    tracker = FakeTracker()
    syncer(tmp_path, tracker).finish(Ending.SUCCEEDED.value)
    summary, attempt = tracker.summary
    assert attempt == Fence.token and tracker.closed == "succeeded"
    assert set(summary) == {"goodput", "goodput/wall_s", *(f"goodput/{cause}_s" for cause in goodput.CAUSES)}
    assert sum(summary[f"goodput/{cause}_s"] for cause in goodput.CAUSES) == pytest.approx(summary["goodput/wall_s"],
                                                                                          abs=0.01)
    assert summary["goodput/data_s"] == pytest.approx(0.5) and 0 < summary["goodput"] < 1


def test_an_attempts_end_closes_the_tracker_run_when_its_goodput_cannot_be_read(tmp_path):
    """Storage that fails between the last sync and the goodput read costs the summary, not the run's close."""
    records = runrecords.Records(tmp_path, Fence())
    records.append_event("start", epoch=1, attempt=Fence.token, time=time.time() - 3)
    tracker, out = FakeTracker(), io.StringIO()
    ending = syncer(tmp_path, tracker, out=out)
    ending.sync()  # opens the tracker's run
    (tmp_path / "events.jsonl").unlink()
    (tmp_path / "events.jsonl").mkdir()  # reading it now fails as an unreachable file would
    ending.finish(Ending.FAILED.value)
    assert tracker.closed == "failed" and tracker.summary is None
    assert "goodput is not sent" in out.getvalue() and f"raytrain report {tmp_path}" in out.getvalue()


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
