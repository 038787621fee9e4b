"""raytrain.rundir.goodput: a run's wall time split into productive training and badput by cause, over
hand-written records (times in seconds from 0): one clean attempt, a worker group restarted within an attempt, a
driver killed without a result then resumed, a resize, a start that failed, a running attempt, a timing that
exceeds its segment, rows written before `timing`, and none at all; damaged files read from a directory. The
records' writers: tests/worker/test_session.py; `raytrain report`'s table: tests/driver/test_report.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from raytrain.rundir import goodput, layout


def row(epoch: int, t: float, data: float = 0.0, val: float = 0.0, ckpt: float = 0.0, attempt: int = 1) -> dict:
    return {"epoch": epoch, "train_loss": 1.0, "attempt": attempt,
            "timing": {"time": t, "data_s": data, "val_s": val, "checkpoint_s": ckpt}}


def event(name: str, t: float, **fields) -> dict:
    return {"event": name, "time": t, **fields}


def result(attempt: int, t: float, duration: float, status: str = "succeeded") -> dict:
    return {"attempt": attempt, "time": t, "duration_s": duration, "status": status}


NOTHING = {"training": 0.0}

CASES = {
    "one clean attempt": (
        dict(claims={1: 0.0}, results=[result(1, 55, 55)],
             events=[event("start", 10, attempt=1), event("trained", 53, checkpoint_s=1, attempt=1)],
             rows=[row(1, 30, data=1, val=2), row(2, 50, data=1, val=2, ckpt=3)], epochs=2),
        {"startup": 10, "training": 31, "data": 2, "evaluation": 4, "checkpoint": 4, "stopping": 4},
        {1: {"startup": 10, "training": 31, "data": 2, "evaluation": 4, "checkpoint": 4, "stopping": 4}},
        {"epochs_done": 2, "percent": 100.0, "time_left_s": 0.0}),
    # A worker killed: Ray Train restarts the group, which drops the row it trains again (epoch 3, written at 70).
    "a worker group restarted": (
        dict(claims={1: 0.0}, results=[result(1, 120, 120)],
             events=[event("start", 10, attempt=1), event("restored", 94, restore_s=4),
                     event("rows_dropped", 94.5, epoch=2, step=0, rows=1, until=70), event("start", 95, attempt=1),
                     event("trained", 115, checkpoint_s=0, attempt=1)],
             rows=[row(1, 30), row(2, 50), row(3, 115)], epochs=3),
        {"startup": 10, "training": 60, "lost": 20, "recovery": 21, "restore": 4, "stopping": 5},
        {1: {"startup": 10, "training": 60, "lost": 20, "recovery": 21, "restore": 4, "stopping": 5}},
        {"epochs_done": 3, "percent": 100.0}),
    # A rerun that found the newest checkpoint damaged drops the rows after the one before (epochs 3-4, written at 30
    # and 40): their time is progress lost, whole, however long the last checkpoint took (CI once saw 12 ms of it
    # taken from the lost time, when the checkpoint sat right after the last row kept)
    "rows dropped by a rerun, the last checkpoint kept in place": (
        dict(claims={1: 0.0, 2: 50.0}, results=[result(1, 45, 45), result(2, 70, 20)],
             events=[event("start", 5, attempt=1), event("trained", 43, checkpoint_s=2, attempt=1),
                     event("rows_dropped", 52, epoch=2, step=0, rows=2, until=40),
                     event("start", 55, attempt=2), event("trained", 68, checkpoint_s=0, attempt=2)],
             rows=[row(1, 10), row(2, 20), row(3, 60, attempt=2), row(4, 65, attempt=2)], epochs=4),
        {"startup": 10, "training": 25, "lost": 20, "checkpoint": 2, "stopping": 8, "waiting": 5},
        {1: {"startup": 5, "training": 15, "lost": 20, "checkpoint": 2, "stopping": 3},
         2: {"startup": 5, "training": 10, "stopping": 5}},
        {"epochs_done": 4, "percent": 100.0}),
    # The driver SIGKILLed after epoch 3's row (at 65; its checkpoint never landed): no result. The rerun's driver
    # drops that row; lease.json names the rerun.
    "a killed attempt, resumed": (
        dict(claims={1: 0.0, 2: 100.0}, results=[result(2, 152, 52)],
             events=[event("start", 5, attempt=1), event("rows_dropped", 101, epoch=2, step=0, rows=1, until=65),
                     event("restored", 109, restore_s=3), event("start", 110, attempt=2),
                     event("trained", 150, checkpoint_s=0, attempt=2)],
             rows=[row(1, 25), row(2, 45), row(3, 130, attempt=2), row(4, 150, attempt=2)],
             lease={"token": 2, "renewed": 152, "ttl_s": 30, "released": True}, epochs=4),
        {"startup": 12, "training": 80, "lost": 20, "recovery": 35, "restore": 3, "stopping": 2},
        {1: {"startup": 5, "training": 40, "lost": 20}, 2: {"startup": 7, "restore": 3, "training": 40, "stopping": 2}},
        {"epochs_done": 4, "percent": 100.0}),
    # Its lease renewed at 70 after its last record (45), then the driver died: the tail is progress lost.
    "a killed attempt, last seen by its lease": (
        dict(claims={1: 0.0}, results=[], events=[event("start", 5, attempt=1)], rows=[row(1, 25), row(2, 45)],
             lease={"token": 1, "renewed": 70, "ttl_s": 30}, epochs=4, now=1000),
        {"startup": 5, "training": 40, "lost": 25},
        {1: {"startup": 5, "training": 40, "lost": 25}},
        {"epochs_done": 2, "percent": 50.0, "time_left_s": 40.0}),
    "an elastic resize": (
        dict(claims={1: 0.0}, results=[result(1, 66, 66)],
             events=[event("start", 10, attempt=1, world_size=2), event("resizing", 31, workers=3),
                     event("restored", 43.5, restore_s=2), event("resize", 43.8, previous=2, workers=3),
                     event("start", 44, attempt=1, world_size=3)],
             rows=[row(1, 30), row(2, 64)], epochs=2),
        {"startup": 10, "training": 40, "resize": 12, "restore": 2, "stopping": 2}, None, {"epochs_done": 2}),
    # A Ray Train function's group start is written at its first report (30): its start-up ends at its first batch
    # (12), and the time to the report is that row's (its data wait and evaluation from the function's loaders)
    "a Ray Train function's start at its first batch": (
        dict(claims={1: 0.0}, results=[result(1, 52, 52)],
             events=[event("start", 30, attempt=1, first_batch=12), event("trained", 50, checkpoint_s=0, attempt=1)],
             rows=[row(1, 30, data=3, val=2), row(2, 50, data=3, val=2)], epochs=2),
        {"startup": 12, "training": 28, "data": 6, "evaluation": 4, "stopping": 2}, None, {"epochs_done": 2}),
    # ...and an elastic function's new group: its resize and restore are written after its first batch, still its
    "an elastic Ray Train function's resize": (
        dict(claims={1: 0.0}, results=[result(1, 70, 70)],
             events=[event("start", 20, attempt=1, world_size=2, first_batch=10),
                     event("restored", 46, restore_s=0), event("resize", 47, previous=2, workers=3),
                     event("start", 48, attempt=1, world_size=3, first_batch=45)],
             rows=[row(1, 20), row(2, 30), row(3, 60)], epochs=3),
        {"startup": 10, "training": 35, "resize": 15, "stopping": 10}, None, {"epochs_done": 3}),
    "a start that failed before any worker group": (
        dict(claims={1: 0.0}, results=[result(1, 8, 8, "failed")], events=[], rows=[], epochs=5),
        {"startup": 8}, {1: {"startup": 8}}, {"epochs_done": 0, "percent": 0.0, "time_left_s": None}),
    "a rerun after a stop waits between attempts": (
        dict(claims={1: 0.0, 2: 50.0}, results=[result(1, 20, 20, "stopped"), result(2, 70, 20)],
             events=[event("start", 5, attempt=1), event("start", 55, attempt=2)],
             rows=[row(1, 15), row(2, 65, attempt=2)], epochs=2),
        {"startup": 10, "training": 20, "stopping": 10, "waiting": 30}, None, {"epochs_done": 2}),
    # SIGTERM mid-epoch 2 (a deleted pod, a suspend): the group checkpoints at its step and marks it (25); what it
    # trained since epoch 1's row is kept, as the rerun resumes at that step, so it is training, not stopping
    "a stop at a step keeps what it trained": (
        dict(claims={1: 0.0, 2: 60.0}, results=[result(1, 30, 30, "stopped"), result(2, 90, 30)],
             events=[event("start", 5, attempt=1),
                     event("progress_saved", 25, attempt=1, timing={"data_s": 1, "checkpoint_s": 2}),
                     event("start", 65, attempt=2), event("trained", 88, checkpoint_s=0, attempt=2)],
             rows=[row(1, 15), row(2, 80, attempt=2)], epochs=2),
        {"startup": 10, "training": 32, "data": 1, "checkpoint": 2, "stopping": 15, "waiting": 30},
        {1: {"startup": 5, "training": 17, "data": 1, "checkpoint": 2, "stopping": 5},
         2: {"startup": 5, "training": 15, "stopping": 10}},
        {"epochs_done": 2, "percent": 100.0}),
    # A Ray Train function may report a metric named `event`: its row is a row all the same
    "a row with a metric named event": (
        dict(claims={1: 0.0}, results=[result(1, 25, 25)], events=[event("start", 5, attempt=1)],
             rows=[{**row(1, 20), "event": "start"}], epochs=1),
        {"startup": 5, "training": 15, "stopping": 5}, None, {"epochs_done": 1}),
    # A finished run started again writes no result (the one that trained stands): a clean end all the same.
    "a finished run started again": (
        dict(claims={1: 0.0, 2: 40.0}, results=[result(1, 30, 30)],
             events=[event("start", 5, attempt=1), event("nothing_to_train", 41, attempt=2, epoch=1)],
             rows=[row(1, 25)], lease={"token": 2, "renewed": 41.5, "ttl_s": 30, "released": True}, epochs=1),
        {"startup": 6.5, "training": 20, "stopping": 5, "waiting": 10},
        {1: {"startup": 5, "training": 20, "stopping": 5}, 2: {"startup": 1.5}}, {"epochs_done": 1}),
    "an attempt running now": (
        dict(claims={1: 0.0}, results=[], events=[event("start", 4, attempt=1)], rows=[row(1, 14)],
             lease={"token": 1, "renewed": 18, "ttl_s": 30}, epochs=3, now=20),
        {"startup": 4, "training": 16}, {1: {"startup": 4, "training": 16}},
        {"epochs_done": 1, "percent": 33.3, "time_left_s": 20.0}),
    "a timing larger than its segment is clamped": (
        dict(claims={1: 0.0}, results=[result(1, 25, 25)], events=[event("start", 10, attempt=1)],
             rows=[row(1, 20, data=50, val=50)], epochs=1),
        {"startup": 10, "data": 10, "stopping": 5}, None, {"epochs_done": 1}),
    "rows written before timing": (
        dict(claims={1: 0.0}, results=[result(1, 30, 30)], events=[event("start", 5, attempt=1)],
             rows=[{"epoch": 1, "train_loss": 1.0, "attempt": 1}], epochs=1),
        {"startup": 5, "other": 25}, None, {"epochs_done": 1}),
    "no records yet": (
        dict(claims={}, results=[], events=[], rows=[], epochs=3),
        NOTHING, {}, {"epochs_done": 0, "percent": 0.0, "time_left_s": None}),
}


@pytest.mark.parametrize("name", list(CASES))
def test_causes_sum_to_the_wall_time(name: str) -> None:
    given, expected, per_attempt, progress = CASES[name]
    given = {"lease": {}, **given}
    found = goodput.compute(**given)
    assert {c: round(s, 6) for c, s in found.seconds.items() if s} == {c: s for c, s in expected.items() if s}
    assert sum(found.seconds.values()) == pytest.approx(found.wall_s)
    for attempt in found.attempts:
        assert sum(attempt.seconds.values()) == pytest.approx(attempt.wall_s), attempt
    if per_attempt is not None:
        assert {a.attempt: {c: round(s, 6) for c, s in a.seconds.items() if s} for a in found.attempts} == per_attempt
    assert {k: found.progress[k] for k in progress} == progress
    assert json.loads(json.dumps(found.to_dict()))["wall_s"] == round(found.wall_s, 3)


def test_the_table_names_each_cause_that_took_time() -> None:
    given, *_ = CASES["a killed attempt, resumed"]
    lines = goodput.table(goodput.compute(**{"lease": {}, **given}))
    assert lines[0] == "goodput 52.6% of 2m32s"
    text = "\n".join(lines)
    for label in ("productive training", "progress lost (trained again)", "recovery (failure to restart)",
                  "checkpoint restore", "attempt 1", "attempt 2: succeeded", "attempt 1: no result"):
        assert label in text
    assert "data wait" not in text  # no time: not shown
    assert "progress: epoch 4/4 (100%), done" in text
    assert goodput.table(goodput.compute(claims={}, results=[], events=[], rows=[], lease={})) == [
        "goodput: no records with times yet (the run has not started an attempt)"]


@pytest.mark.parametrize("events, results, phases", [
    # The driver's launch at 3 (Ray up, the cluster sized), rank 0's session at 6, the restore (1 s) ending at 10
    ([event("launch", 3, attempt=1), event("restored", 10, restore_s=1), event("start", 10, attempt=1, began=6)],
     [result(1, 12, 12)], {"launch": 3, "workers": 3, "setup": 3}),
    # No launch mark (a local run, or records from before it): that phase counts in the next
    ([event("start", 10, attempt=1, began=6)], [result(1, 12, 12)], {"launch": 0, "workers": 6, "setup": 4}),
    # Neither mark: all of it is the last phase's
    ([event("start", 10, attempt=1)], [result(1, 12, 12)], {"launch": 0, "workers": 0, "setup": 10}),
    # rank 0's clock behind the driver's (another node): clamped into order, never negative
    ([event("launch", 3, attempt=1), event("start", 10, attempt=1, began=2)], [result(1, 12, 12)],
     {"launch": 3, "workers": 0, "setup": 7}),
    # Launched, and the worker group never came (no resources): the rest is the worker group's
    ([event("launch", 4, attempt=1)], [result(1, 20, 20, status="failed")], {"launch": 4, "workers": 16, "setup": 0}),
    # Failed before the launch (Ray did not start): all launch
    ([], [result(1, 20, 20, status="failed")], {"launch": 20, "workers": 0, "setup": 0}),
])
def test_start_up_is_split_by_phase_and_the_phases_sum_to_it(events: list, results: list, phases: dict) -> None:
    found = goodput.compute(claims={1: 0.0}, results=results, events=events, rows=[], lease={})
    [attempt] = found.attempts
    assert {k: round(v, 6) for k, v in attempt.startup.items()} == phases
    assert sum(attempt.startup.values()) == pytest.approx(attempt.seconds["startup"])
    assert found.startup == attempt.startup
    assert json.loads(json.dumps(found.to_dict()))["attempts"][0]["startup"] == phases
    text = "\n".join(goodput.table(found))
    assert "    worker group" in text and "    data and model" in text


@pytest.mark.parametrize("progress, text", [
    ({"epochs_done": 3, "epochs": 10, "percent": 30.0, "time_left_s": 65.0}, "(30%), about 1m05s left"),
    ({"epochs_done": 10, "epochs": 10, "percent": 100.0, "time_left_s": 0.0}, "(100%), done"),
    ({"epochs_done": 0, "epochs": 10, "percent": 0.0, "time_left_s": None}, "(0%)"),  # no pace yet
    ({"epochs_done": 3, "epochs": None, "percent": None, "time_left_s": None}, ""),  # no train.epochs
    ({}, ""),
])
def test_progress_text_is_what_the_console_and_the_table_write(progress: dict, text: str) -> None:
    assert goodput.progress_text(progress) == text


def test_damaged_records_are_named_and_skipped(tmp_path: Path) -> None:
    (tmp_path / layout.CLAIMS_DIR).mkdir()
    (tmp_path / layout.CLAIMS_DIR / "1.json").write_text('{"since": 100.0}')
    (tmp_path / layout.CLAIMS_DIR / "2.json").write_text("not json")
    (tmp_path / layout.CLAIMS_DIR / "x.json").write_text('{"since": 1}')
    (tmp_path / layout.EVENTS_FILE).write_bytes(
        b'{"event": "start", "time": 105.0, "attempt": 1}\n[1, 2]\n\xff\xfe\n'
        b'{"event": "restored", "time": "soon", "restore_s": 3}\n{"event": "rows_dropped", "time": 106, "until": "x"}\n')
    (tmp_path / layout.METRICS_FILE).write_text(
        json.dumps(row(1, 120.0, data="much")) + "\n{broken\n" + json.dumps({"epoch": "two", "timing": 5}) + "\n"
        + json.dumps({"epoch": 3, "timing": {"time": None}}) + "\n"
        + '{"epoch": 3, "timing": {"time": Infinity, "val_s": NaN}}\n' + json.dumps(row(2, 120.0)) + "\n")
    (tmp_path / layout.RESULTS_HISTORY_FILE).write_text('{"attempt": 1, "time": "late"}\n' + json.dumps(
        result(1, 130.0, 30.0)) + "\n")
    (tmp_path / layout.RESULT_FILE).write_text("{")
    (tmp_path / layout.LEASE_FILE).write_text("[]")
    found = goodput.read(tmp_path, epochs=4)
    assert found.wall_s == pytest.approx(30.0)
    assert {c: s for c, s in found.seconds.items() if s} == pytest.approx(
        {"startup": 5.0, "training": 15.0, "stopping": 10.0})
    assert len(found.notes) == 3 and all(str(tmp_path) in note and "line" in note for note in found.notes), found.notes
    assert found.progress["epochs_done"] == 3


def test_an_empty_or_missing_directory_has_no_time(tmp_path: Path) -> None:
    for path in (tmp_path, tmp_path / "missing"):
        found = goodput.read(path)
        assert (found.wall_s, found.attempts, found.goodput) == (0.0, [], None)
