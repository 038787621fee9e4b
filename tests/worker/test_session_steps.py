"""The Session's step boundaries (raytrain.worker.session), in one process with LocalSession: mid-epoch checkpoints by
step count, a resume at the exact next batch with the epoch's running sums carried, one metrics row per epoch, the
optimizer settings of the resumed run applied, and fenced commits of an attempt that lost its lease."""

from __future__ import annotations

import json
import time

import pytest
import torch

from raytrain.checkpoint import checkpoints
from raytrain.driver.localtrainer import train_local
from raytrain.lifecycle.endings import AttemptEnded, Ending
from raytrain.loop import EpochStats, build_optimizer
from raytrain.rundir import layout, runrecords
from raytrain.rundir.runcontrol import WorkerControl
from raytrain.spec.config import load_config
from raytrain.worker.localsession import LocalSession


def config(tmp_path, *sets: str):
    # 96 samples, 12 per step: 8 steps an epoch (the linear data's val split takes some: counted below)
    return load_config("linear", [f"run.storage_path={tmp_path}", "run.name=steps", "train.batch_size=12",
                                  "data.num_samples=96", "run.keep_checkpoints=50", "train.epochs=2", *sets])


def session_for(cfg, token=None) -> LocalSession:
    run_dir = runrecords.run_dir_of(cfg.run.storage_path, cfg.run.name)
    run_dir.mkdir(parents=True, exist_ok=True)  # as the attempt has made it before any session
    control = WorkerControl(run_dir, token) if token else None
    session = LocalSession(cfg, run_dir, cpus=1, **({"control": control} if control else {}))
    session.start()
    return session


def epoch_batches(session: LocalSession, epoch: int) -> list[torch.Tensor]:
    return [x.clone() for x, _ in session.batches("train", epoch)]


def test_step_count_checkpoints_and_one_row_per_epoch(tmp_path):
    cfg = config(tmp_path, "run.checkpoint_every_steps=3", "run.checkpoint_every=1")
    outcome = train_local(cfg)
    assert outcome.ok
    names = sorted(p.name for p in outcome.run_dir.glob("checkpoint_*"))
    steps = sorted(json.loads((outcome.run_dir / n / "meta.json").read_text())["step"] for n in names)
    assert [s for s in steps if s] == [3, 3, 6, 6], names  # each epoch, at steps 3 and 6
    assert [row["epoch"] for row in runrecords.read_metrics(outcome.run_dir)] == [1, 2]


def test_a_resume_from_a_mid_epoch_checkpoint_starts_at_the_exact_next_batch(tmp_path):
    cfg = config(tmp_path, "run.checkpoint_every_steps=5", "train.epochs=1")
    whole_epoch = epoch_batches(session_for(cfg), 1)  # the sampler's order: a function of the seed and the epoch

    outcome = train_local(cfg)
    mid = next(p for p in outcome.run_dir.glob("checkpoint_*") if "_step" in p.name)
    for other in outcome.run_dir.glob("checkpoint_*"):
        if other != mid:
            checkpoints.remove(other)
    assert json.loads((mid / "meta.json").read_text())["step"] == 5
    runrecords.Records(outcome.run_dir).truncate_metrics(0)

    resumed = session_for(cfg)
    model = resumed.prepare_model(resumed.build_model())
    stats = EpochStats()
    assert resumed.restore(model, build_optimizer(cfg, model), epoch_stats=stats) == 1
    assert stats.samples == 5 * 12  # the steps trained before the checkpoint count in the epoch's row
    rest = epoch_batches(resumed, 1)
    assert len(rest) == len(whole_epoch) - 5
    assert all(torch.equal(a, b) for a, b in zip(rest, whole_epoch[5:]))
    start = [e for e in runrecords.read_events(outcome.run_dir) if e["event"] == "start"][-1]
    assert (start["start_epoch"], start["resumed_at_step"]) == (1, 5)


def test_max_steps_per_epoch_counts_the_skipped_steps(tmp_path):
    cfg = config(tmp_path, "train.max_steps_per_epoch=4")
    session = session_for(cfg)
    assert len(epoch_batches(session, 1)) == 4
    session._resume_step, session.resumed_from_epoch = 3, 0  # as restore() sets them from a step-3 checkpoint
    assert len(epoch_batches(session, 1)) == 1
    assert len(epoch_batches(session, 2)) == 4  # only the resumed epoch skips


def test_a_resume_applies_the_new_learning_rate_to_the_restored_optimizer(tmp_path):
    train_local(config(tmp_path, "train.lr=0.01", "train.epochs=1"))
    cfg = config(tmp_path, "train.lr=0.5")
    session = session_for(cfg)
    model = session.prepare_model(session.build_model())
    optimizer = build_optimizer(cfg, model)
    session.restore(model, optimizer)
    assert [g["lr"] for g in optimizer.param_groups] == [0.5]
    restored = [e for e in runrecords.read_events(session.run_dir) if e["event"] == "restored"][-1]
    assert restored["applied"] == {"train.lr": 0.5}


def test_an_attempt_that_lost_its_lease_commits_no_row_and_no_checkpoint(tmp_path):
    cfg = config(tmp_path, "train.epochs=1")
    session = session_for(cfg, token=1)
    (session.run_dir / layout.LEASE_FILE).write_text(json.dumps(  # attempt 2 took the run over
        {"token": 2, "host": "elsewhere", "pid": 7, "since": time.time(), "renewed": time.time(), "ttl_s": 30}))
    model = session.prepare_model(session.build_model())
    with pytest.raises(AttemptEnded, match="attempt 1 lost run directory") as ended:
        session.report(1, {"train_loss": 1.0}, model=model)
    assert ended.value.ending is Ending.LEASE_LOST
    assert not (session.run_dir / layout.METRICS_FILE).exists()
    assert not list(session.run_dir.glob("checkpoint_*"))


def test_a_stop_request_checkpoints_at_the_next_step_and_ends_the_loop(tmp_path):
    cfg = config(tmp_path, "train.epochs=1")
    session = session_for(cfg, token=3)  # as a Ray Train worker of attempt 3 gets it
    (session.run_dir / layout.LEASE_FILE).write_text(json.dumps(
        {"token": 3, "host": "h", "pid": 1, "since": time.time(), "renewed": time.time(), "ttl_s": 30,
         "stop": "SIGTERM"}))
    model = session.prepare_model(session.build_model())
    optimizer = build_optimizer(cfg, model)
    session.restore(model, optimizer)
    trained = 0
    with pytest.raises(AttemptEnded, match="SIGTERM") as ended:
        for x, y in session.batches("train", 1):
            trained += 1
            time.sleep(0.15)  # slow steps: a decision at each, the stop read within its poll interval
    [checkpoint] = session.run_dir.glob("checkpoint_*")
    meta = json.loads((checkpoint / "meta.json").read_text())
    assert (meta["epoch"], meta["step"]) == (0, trained) and 0 < trained < 8
    assert not runrecords.read_metrics(session.run_dir)  # the epoch is not done: no row
    assert ended.value.ending is Ending.STOPPED
    # ...and goodput's mark: what it trained is kept (the resume starts at that step), with the data wait and the
    # step checkpoint since the group's start
    [saved] = [e for e in runrecords.read_events(session.run_dir) if e["event"] == "progress_saved"]
    assert saved["attempt"] == 3 and saved["timing"]["checkpoint_s"] > 0 and saved["timing"]["data_s"] > 0, saved
