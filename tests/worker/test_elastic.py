"""Elastic runs (raytrain.worker.elastic) in one process: the resize request between Ray Train's controller and rank 0
(fuzzed files, requests of other attempts or to the same size ignored), the step decision that checkpoints and
holds for it, the answer the controller waits for, and the resize event of a group that starts at a new size.
The whole path on a real multi-node Ray cluster: tests/integration/test_elastic.py."""

from __future__ import annotations

import json
import random
import threading
import time

import pytest
import torch

from raytrain.lifecycle.endings import AttemptEnded, Ending
from raytrain.loop import build_optimizer
from raytrain.rundir import layout, runrecords
from raytrain.rundir.runcontrol import UNFENCED
from raytrain.worker import elastic
from raytrain.worker.stepcontrol import StepControl
from tests.worker.test_session_steps import config, session_for


def test_a_request_reaches_its_attempts_group_and_no_other(tmp_path):
    request_id = elastic.request(tmp_path, attempt=3, to_workers=3)
    assert elastic.pending(tmp_path, 3, world_size=2)["id"] == request_id
    assert elastic.pending(tmp_path, 4, world_size=2) is None  # another attempt's group
    assert elastic.pending(tmp_path, 3, world_size=3) is None  # the new group of that size, reading a leftover
    assert elastic.answered(tmp_path, request_id) is None
    elastic.answer(tmp_path, request_id, "checkpoint_x")
    assert elastic.answered(tmp_path, request_id)["checkpoint"] == "checkpoint_x"
    assert elastic.answered(tmp_path, "another") is None
    elastic.clear(tmp_path)
    assert elastic.pending(tmp_path, 3, world_size=2) is None and elastic.answered(tmp_path, request_id) is None
    assert (tmp_path / layout.RESIZE_REQUEST_FILE).exists()  # emptied, never deleted (NFS: see elastic.prepare)


@pytest.mark.parametrize("content", [
    b"", b"{", b"[]", b"null", b'"text"', b"\xff\xfe\x00garbage", b'{"id": 7, "attempt": 3, "to": 2}',
    b'{"id": "a", "attempt": "3", "to": 2}', b'{"id": "a", "attempt": 3, "to": "2"}',
    b'{"id": "a", "attempt": 3, "to": true}', b'{"id": "a", "attempt": 3}', b'{"id": "a", "to": 2}',
])
def test_a_damaged_request_or_answer_is_no_request(tmp_path, content):
    (tmp_path / layout.RESIZE_REQUEST_FILE).write_bytes(content)
    (tmp_path / layout.RESIZE_HELD_FILE).write_bytes(content)
    assert elastic.pending(tmp_path, 3, world_size=3) is None
    assert (elastic.answered(tmp_path, "a") is not None) == (b'"id": "a"' in content)  # an answer: its id alone


def test_random_bytes_never_raise(tmp_path):
    rng = random.Random(27)
    for _ in range(300):
        size = rng.randrange(0, 64)
        blob = bytes(rng.randrange(256) for _ in range(size))
        if rng.random() < 0.5:  # near-JSON as well
            blob = json.dumps({"id": "a", "attempt": 3, "to": rng.choice([2, "2", None, 2.0, [2]])}).encode()[:size or None]
        (tmp_path / layout.RESIZE_REQUEST_FILE).write_bytes(blob)
        result = elastic.pending(tmp_path, 3, world_size=3)
        assert result is None or (result["id"] == "a" and result["to"] == 2)


def test_the_controller_waits_for_the_answer_and_gives_up_after_its_timeout(tmp_path):
    request_id = elastic.request(tmp_path, 3, 3)
    threading.Timer(0.3, elastic.answer, (tmp_path, request_id, None)).start()
    began = time.monotonic()
    assert elastic.wait_answered(tmp_path, request_id, timeout_s=10, poll_s=0.05)
    assert time.monotonic() - began < 5
    assert elastic.wait_answered(tmp_path, "never", timeout_s=0.2, poll_s=0.05) is None


def test_a_held_worker_ends_its_group_when_the_resize_never_comes():
    with pytest.raises(elastic.ResizeNotApplied, match="did not come within 0 s"):
        elastic.hold(0.01)


def test_a_resize_request_checkpoints_and_ends_the_group_and_the_other_endings_win(tmp_path):
    request = {"id": "r", "attempt": 3, "to": 3}
    b = StepControl(UNFENCED, every_steps=0, every_s=0.0, is_rank_zero=True, device=torch.device("cpu"),
                    resize_requested=lambda: request)
    b.control = type("Control", (), {"token": 3, "poll": lambda self: None})()
    decision = b.decide(at_epoch_end=True)
    assert (decision.checkpoint, decision.ending) == (True, Ending.RESIZING) and b.resize_request == request
    b = StepControl(UNFENCED, every_steps=0, every_s=0.0, is_rank_zero=True, device=torch.device("cpu"),
                    node_draining=lambda: True, resize_requested=lambda: request)
    b.control = type("Control", (), {"token": 3, "poll": lambda self: None})()
    assert b.decide(at_epoch_end=True).ending is Ending.DRAINING


def test_the_session_checkpoints_at_the_step_answers_and_ends_for_the_resize(tmp_path):
    cfg = config(tmp_path, "train.epochs=1", "scaling.num_workers=[1, 2]")
    session = session_for(cfg, token=3)
    request_id = elastic.request(session.run_dir, 3, 2)
    session._resize_requested = session._steps.resize_requested = lambda: elastic.pending(session.run_dir, 3, 1)
    model = session.prepare_model(session.build_model())
    optimizer = build_optimizer(cfg, model)
    session.restore(model, optimizer)
    trained = 0
    with pytest.raises(AttemptEnded) as ended:
        for _ in session.batches("train", 1):
            trained += 1
            time.sleep(0.15)  # slow steps: rank 0 reads the request within its poll interval
    assert ended.value.ending is Ending.RESIZING
    [checkpoint] = session.run_dir.glob("checkpoint_*")
    meta = json.loads((checkpoint / "meta.json").read_text())
    assert (meta["epoch"], meta["step"]) == (0, trained) and 0 < trained < 8
    held = json.loads((session.run_dir / layout.RESIZE_HELD_FILE).read_text())
    assert held["id"] == request_id and held["checkpoint"] == checkpoint.name and held["ending"] == "resizing"


@pytest.mark.parametrize("rank, answered", [(0, True), (1, False)])
def test_a_group_that_ends_another_way_answers_an_open_request_with_its_ending(tmp_path, rank, answered):
    cfg = config(tmp_path, "train.epochs=1", "scaling.num_workers=[1, 2]")
    session = session_for(cfg, token=3)
    session.rank = rank
    elastic.prepare(session.run_dir)
    session._resize_requested = lambda: elastic.pending(session.run_dir, 3, 1)
    session.answer_resize("stopped")  # no request open: nothing to answer
    assert json.loads((session.run_dir / layout.RESIZE_HELD_FILE).read_text()) == {"id": None}
    request_id = elastic.request(session.run_dir, 3, 2)
    session.answer_resize("stopped")
    held = elastic.answered(session.run_dir, request_id)
    assert (held is not None and held["ending"] == "stopped") == answered  # rank 0 alone answers


def test_once_the_loop_returned_every_later_request_of_the_attempt_is_answered_finished(tmp_path):
    """Rank 0 lingers after its loop (telemetry) and Ray Train may decide a resize then: the controller must not
    wait out its timeout for a checkpoint no loop will take."""
    cfg = config(tmp_path, "train.epochs=1", "scaling.num_workers=[1, 2]")
    session = session_for(cfg, token=3)
    elastic.prepare(session.run_dir)
    session._resize_requested = lambda: elastic.pending(session.run_dir, 3, 1)
    session.answer_resize(elastic.FINISHED)  # before any request
    later = elastic.request(session.run_dir, 3, 2)
    held = elastic.wait_answered(session.run_dir, later, timeout_s=5, poll_s=0.05, attempt=3)
    assert held is not None and held["ending"] == "finished" and held["attempt"] == 3
    assert elastic.answered(session.run_dir, later, attempt=4) is None  # another attempt's request: not answered
    assert elastic.answered(session.run_dir, later) is None  # nor one asked without its attempt
    elastic.clear(session.run_dir)
    assert elastic.answered(session.run_dir, later, attempt=3) is None  # a resize clears it
    session.answer_resize(elastic.FINISHED)
    session.start()  # a new group of the attempt (a restart after the loop's end): training is ahead of it again
    assert elastic.answered(session.run_dir, later, attempt=3) is None


def test_a_stale_attempts_finished_answer_never_replaces_a_newer_attempts_answer(tmp_path):
    from raytrain.rundir.runcontrol import WorkerControl

    elastic.prepare(tmp_path)
    newer = elastic.request(tmp_path, 4, 2)
    elastic.answer(tmp_path, newer, "checkpoint_x")
    (tmp_path / "lease.json").write_text(json.dumps({"token": 4, "host": "h", "pid": 1, "since": 0,
                                                     "renewed": time.time(), "ttl_s": 30}))
    with pytest.raises(AttemptEnded):
        elastic.answer(tmp_path, elastic.FINISHED, None, "finished", attempt=3, control=WorkerControl(tmp_path, 3))
    assert elastic.answered(tmp_path, newer, attempt=4)["checkpoint"] == "checkpoint_x"


def test_a_fenced_request_is_refused_once_a_newer_attempt_holds_the_run(tmp_path):
    from raytrain.rundir.runcontrol import WorkerControl

    (tmp_path / "lease.json").write_text(json.dumps({"token": 4, "host": "h", "pid": 1, "since": 0,
                                                     "renewed": time.time(), "ttl_s": 30}))
    elastic.prepare(tmp_path)
    with pytest.raises(AttemptEnded):
        elastic.request(tmp_path, 3, 2, WorkerControl(tmp_path, 3))
    assert json.loads((tmp_path / layout.RESIZE_REQUEST_FILE).read_text()) == {"id": None}  # the newer attempt's, intact
    elastic.clear(tmp_path, WorkerControl(tmp_path, 3))  # refused quietly


def test_a_group_that_starts_at_another_size_records_a_resize(tmp_path):
    cfg = config(tmp_path, "train.epochs=1")
    session = session_for(cfg)
    session.records.append_event("start", start_epoch=1, resumed_from_epoch=None, resumed_at_step=0, world_size=3)
    session.resumed_from_epoch, session._resume_step = 0, 5
    session._announce()  # this LocalSession is one worker
    resize = [e for e in runrecords.read_events(session.run_dir) if e["event"] == "resize"]
    assert [(e["previous"], e["workers"], e["epoch"], e["step"]) for e in resize] == [(3, 1, 0, 5)]
    again = session_for(cfg)
    again._announce()  # the same size as the last start: no resize
    assert len([e for e in runrecords.read_events(session.run_dir) if e["event"] == "resize"]) == 1


def test_rank_zeros_running_sums_are_rescaled_when_a_resume_changes_the_worker_count():
    from raytrain.loop import EpochStats

    written = EpochStats(loss_sum=6.0, correct=3.0, samples=5824.0, workers=3).state_dict()
    for workers in (1, 2, 3, 6):
        loaded = EpochStats(workers=workers)
        loaded.load_state_dict(written)
        assert loaded.samples * workers == 5824.0 * 3 and loaded.loss_sum * workers == 18.0
    old = {"loss_sum": 1.0, "correct": 0.0, "samples": 8.0}  # a checkpoint written before the count was kept
    loaded = EpochStats(workers=2)
    loaded.load_state_dict(old)
    assert loaded.samples == 8.0


def test_the_coordinator_callback_refreshes_at_restarts_and_every_few_seconds_and_records_a_failed_start(
        tmp_path, monkeypatch):
    """The callback's policy, in milliseconds: the coordinator call itself runs against a real cluster in
    tests/integration/test_rayinternals.py."""
    from ray.train.v2._internal.exceptions import WorkerGroupStartupTimeoutError
    from ray.train.v2._internal.execution.controller.state import (
        ReschedulingState,
        RestartingState,
        RunningState,
    )
    from ray.train.v2.api.exceptions import ControllerError

    from raytrain.platform import rayinternals

    calls: list[bool] = []
    monkeypatch.setattr(rayinternals, "refresh_autoscaling_coordinator",
                        lambda skip_draining=True: calls.append(skip_draining) or 2)
    monkeypatch.setattr(elastic, "COORDINATOR_REFRESH_S", 3600.0)
    elastic.prepare(tmp_path)
    callback = elastic.coordinator_callback(tmp_path, 3)
    callback.after_controller_start(None)
    callback.after_controller_state_update(RunningState(), RunningState())  # refreshed just now: not again
    assert calls == [True]
    began = time.monotonic()
    restarting = RestartingState(training_failed_error=None)
    callback.after_controller_state_update(RunningState(), restarting)
    assert calls == [True, True] and time.monotonic() - began >= 0.9  # the policy's 1 s cache waited out
    began = time.monotonic()
    callback.after_controller_state_update(restarting, RestartingState(training_failed_error=None))
    assert calls == [True, True] and time.monotonic() - began < 0.5  # waiting for min workers: throttled
    callback.after_controller_state_update(  # a start that failed for another reason (a callback's) is not this
        RunningState(), ReschedulingState(training_failed_error=ControllerError(RuntimeError("a callback failed"))))
    calls.pop()
    assert not [e for e in runrecords.read_events(tmp_path) if e["event"] == "warning"]
    failed = ReschedulingState(training_failed_error=ControllerError(WorkerGroupStartupTimeoutError(3)))
    callback.after_controller_state_update(RunningState(), failed)
    assert calls == [True, True, True]
    [warning] = [e for e in runrecords.read_events(tmp_path) if e["event"] == "warning"]
    assert warning["message"].startswith("Ray Train could not start the worker group (The worker group startup "
                                         "timed out after") and warning["attempt"] == 3, warning

    # RAYTRAIN_ELASTIC_REFRESH_COORDINATOR=0: Ray's own view put back once, then nothing; a failed start recorded
    calls.clear()
    off = elastic.coordinator_callback(tmp_path, 3, refresh=False)
    off.after_controller_start(None)
    off.after_controller_state_update(RunningState(), RestartingState(training_failed_error=None))
    off.after_controller_state_update(RunningState(), failed)
    assert calls == [False]
    assert len([e for e in runrecords.read_events(tmp_path) if e["event"] == "warning"]) == 2


def test_a_coordinator_that_cannot_be_reached_never_fails_the_controller(tmp_path, caplog):
    """Outside Ray there is no coordinator to reach: the callback warns once and goes on (and starts no Ray)."""
    import ray
    from ray.train.v2._internal.execution.controller.state import RunningState

    callback = elastic.coordinator_callback(tmp_path, 3)
    callback.after_controller_start(None)
    callback.refreshed = float("-inf")
    callback.after_controller_state_update(RunningState(), RunningState())
    warned = [r.getMessage() for r in caplog.records if "AutoscalingCoordinator" in r.getMessage()]
    assert len(warned) == 1 and "not connected to a Ray cluster" in warned[0], warned
    assert not ray.is_initialized()
