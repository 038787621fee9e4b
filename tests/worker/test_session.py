"""raytrain.Session's run contract around a loop of the user's own, in one process (LocalSession, `raytrain
local`): resume state, one metrics row per epoch across resumes, checkpoints with extra state, the newest loadable
checkpoint wins, and a loop that raises ends in one paragraph and a recorded failure. The Ray Train side
(RayTrainSession) runs in the integration tier."""

from __future__ import annotations

import io
import json
import time

import pytest

from raytrain.checkpoint import checkpoints
from raytrain.driver.localtrainer import train_local
from raytrain.errors import LaunchError
from raytrain.rundir import goodput, postmortem, runrecords
from raytrain.spec.config import load_config
from tests.support.project import user_module

LOOPS = """
    import torch
    from torch import nn
    from torch.utils.data import TensorDataset

    def regression(session, hidden: int = 8):
        x = torch.linspace(0, 1, 64).reshape(-1, 1)
        model = session.prepare_model(nn.Sequential(nn.Linear(1, hidden), nn.ReLU(), nn.Linear(hidden, 1)))
        optimizer = torch.optim.SGD(model.parameters(), lr=session.config.train.lr)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
        start = session.restore(model, optimizer, scheduler=scheduler)
        for epoch in range(start, session.config.train.epochs + 1):
            for inputs, targets in session.batches(TensorDataset(x, 2 * x + 1), epoch):
                optimizer.zero_grad()
                loss = nn.functional.mse_loss(model(inputs), targets)
                loss.backward()
                optimizer.step()
            scheduler.step()
            session.report(epoch, {"train_loss": loss.item(), "lr": scheduler.get_last_lr()[0],
                                   "start": start}, model=model, optimizer=optimizer, scheduler=scheduler)

    def broken(session):
        raise ValueError("my loop broke")

    RAISED = []

    def raises_once_at_epoch_3(session):
        model = session.prepare_model(nn.Linear(1, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        for epoch in range(session.restore(model, optimizer), session.config.train.epochs + 1):
            if epoch == 3 and not RAISED:
                RAISED.append(epoch)
                raise RuntimeError("a worker died")
            session.report(epoch, {"loss": 1.0 / epoch}, model=model, optimizer=optimizer)
"""


@pytest.fixture
def project(tmp_path):
    yield from user_module(tmp_path, "st_loops", LOOPS)


def config(project, loop="st_loops.regression", epochs=3, checkpoint_every=2):
    path = project / "job.yaml"
    path.write_text(f"model: {{_component_: mlp}}\ndata: {{_component_: raytrain.data.linear.Linear}}\n"
                    f"loop: {{_component_: {loop}}}\ntrain: {{epochs: {epochs}, batch_size: 16, lr: 0.05}}\n"
                    f"scaling: {{num_workers: 1}}\nrun: {{checkpoint_every: {checkpoint_every}, keep_checkpoints: 2, "
                    f"storage_path: {project / 'runs'}}}\n")
    return load_config(str(path))


def test_a_custom_loop_gets_rows_checkpoints_and_resume_with_its_extra_state(project):
    out = io.StringIO()
    first = train_local(config(project, epochs=3), out=out)
    rows = runrecords.read_metrics(first.run_dir)
    assert [r["epoch"] for r in rows] == [1, 2, 3]
    assert [r["lr"] for r in rows] == pytest.approx([0.025, 0.0125, 0.00625])  # the scheduler stepped each epoch
    assert [c.name.split("_")[1] for c in checkpoints.committed(first.run_dir)] == ["epoch000003", "epoch000002"]
    assert json.loads((first.run_dir / "result.json").read_text())["status"] == "succeeded"
    assert "epoch 3/3" in out.getvalue() and "lr 0.00625" in out.getvalue()  # its own metric is printed too

    second = train_local(config(project, epochs=5), out=io.StringIO())
    rows = runrecords.read_metrics(second.run_dir)
    assert [r["epoch"] for r in rows] == [1, 2, 3, 4, 5]  # each epoch once
    assert [r["start"] for r in rows[3:]] == [4, 4]  # resumed after epoch 3
    assert rows[-1]["lr"] == pytest.approx(0.05 * 0.5 ** 5)  # the scheduler's state came back with it
    assert rows[-1]["resumed_from_epoch"] == 3
    restored = [e for e in runrecords.read_events(second.run_dir) if e["event"] == "restored"]
    assert restored[-1]["epoch"] == 3
    # What goodput splits the time by (issue 38): each row's timing, the restore's seconds, each attempt's end.
    times = [r["timing"]["time"] for r in rows]
    assert times == sorted(times) and all(r["timing"]["data_s"] >= 0 and r["timing"]["val_s"] == 0 for r in rows)
    assert rows[2]["timing"]["checkpoint_s"] > 0 and rows[1]["timing"]["checkpoint_s"] == 0  # epoch 2's saved after row 2
    assert restored[-1]["restore_s"] > 0
    assert [e["attempt"] for e in runrecords.read_events(second.run_dir) if e["event"] == "trained"] == [1, 2]
    found = goodput.read(second.run_dir, epochs=5)
    assert [(a.attempt, a.status) for a in found.attempts] == [(1, "succeeded"), (2, "succeeded")]
    assert sum(found.seconds.values()) == pytest.approx(found.wall_s)
    assert found.seconds["training"] > 0 and found.seconds["restore"] > 0 and found.seconds["waiting"] > 0
    assert found.seconds["lost"] == found.seconds["other"] == 0
    assert found.progress == {"epochs_done": 5, "epochs": 5, "percent": 100.0, "time_left_s": 0.0}


def test_the_newest_checkpoint_that_loads_wins_and_the_damaged_one_is_named(project):
    run_dir = train_local(config(project, epochs=4), out=io.StringIO()).run_dir
    newest, older = checkpoints.committed(run_dir)
    state = newest / checkpoints.STATE_FILE
    state.write_bytes(state.read_bytes()[:100])  # torn
    rows = runrecords.read_metrics(train_local(config(project, epochs=4), out=io.StringIO()).run_dir)
    assert [r["epoch"] for r in rows] == [1, 2, 3, 4]
    assert [r["start"] for r in rows[2:]] == [3, 3]  # retrained from epoch 2's checkpoint
    warnings = [e["message"] for e in runrecords.read_events(run_dir) if e["event"] == "warning"]
    assert any(newest.name in w for w in warnings)


def test_a_loop_that_raises_is_one_paragraph_and_a_failed_result(project):
    with pytest.raises(LaunchError) as caught:
        train_local(config(project, loop="st_loops.broken"), out=io.StringIO())
    message = str(caught.value)
    assert "ValueError: my loop broke" in message and "st_loops.py" in message and "in broken" in message
    result = json.loads((project / "runs" / "job" / "result.json").read_text())
    assert result["status"] == "failed" and "my loop broke" in result["error"]
    # `raytrain why` names it too: the local process is rank 0 of 1 (raytrain.rundir.postmortem)
    [attempt] = postmortem.why(project / "runs" / "job")["attempts"]
    assert attempt["ending"] == "failed" and attempt["first_failure"]["type"] == "ValueError"
    assert "in broken" in attempt["first_failure"]["traceback"]


def test_a_local_run_holds_the_runs_lease_so_it_never_writes_beside_another_attempt(project):
    """`raytrain local` takes the run's lease as `raytrain run` does: refused, before anything is written, while
    a live attempt renews it; then attempt 2 once that one released it; and a following start is attempt 3."""
    from raytrain.rundir.lease import Lease, LeaseHeld, current_holder

    run_dir = project / "runs" / "job"
    run_dir.mkdir(parents=True)
    holder = Lease(run_dir, ttl_s=2).acquire()  # a cluster attempt of the same run, renewing
    try:
        with pytest.raises(LeaseHeld, match="so it is running"):
            train_local(config(project, epochs=2), out=io.StringIO(), lease_ttl_s=2)
        assert not (run_dir / "config.yaml").exists() and not (run_dir / "metrics.jsonl").exists()
    finally:
        holder.release()
    out = io.StringIO()
    outcome = train_local(config(project, epochs=2), out=out)
    assert "(attempt 2)" in out.getvalue()
    assert [r["attempt"] for r in runrecords.read_metrics(outcome.run_dir)] == [2, 2]
    assert current_holder(run_dir).token == 2 and not current_holder(run_dir).live(time.time())  # released
    following = Lease(run_dir).acquire()
    assert following.token == 3
    following.release()


def test_a_worker_group_restarted_from_nothing_keeps_each_epoch_once(project):
    """Issue 40, 10a: a loop that raises at epoch 3 before its first checkpoint (checkpoint_every 10) is restarted
    by Ray Train within the same attempt (max_failures): the second worker group starts from nothing, so the first
    group's rows go; metrics.jsonl holds epochs 1-4 once. The two groups run here as Ray Train would start them."""
    from raytrain.worker.localsession import LocalSession

    cfg = config(project, loop="st_loops.raises_once_at_epoch_3", epochs=4, checkpoint_every=10)
    run_dir = runrecords.run_dir_of(cfg.run.storage_path, cfg.run.name)
    run_dir.mkdir(parents=True)
    for group in (1, 2):
        session = LocalSession(cfg, run_dir, 1)
        session.start()
        try:
            cfg.loop.target(session)
        except RuntimeError:
            assert group == 1
    assert [checkpoints.position_of(p).epoch for p in checkpoints.committed(run_dir)] == [4]  # the last epoch's
    rows = runrecords.read_metrics(run_dir)
    assert [r["epoch"] for r in rows] == [1, 2, 3, 4]
    # The first group's two rows, trained again: the newest one's time kept for goodput's progress lost (issue 38).
    [dropped] = [e for e in runrecords.read_events(run_dir) if e["event"] == "rows_dropped"]
    assert (dropped["rows"], dropped["epoch"]) == (2, -1) and dropped["until"] < rows[0]["timing"]["time"]
