"""The built-in loop and the loop contract, in one process (`raytrain local`): the optimizer and LR scheduler as
components (stepped per step or per epoch, restored on resume), gradient accumulation that trains what the whole
batch trains, per-step rows when asked, no host sync per step, and a loop of the user's own that needs no model or
data section and keeps its own optimizer's settings on resume."""

from __future__ import annotations

import io

import pytest
import torch

from raytrain.driver.localtrainer import train_local
from raytrain.loop import EpochStats, build_optimizer, build_scheduler, train_epoch
from raytrain.rundir import runrecords
from raytrain.spec.config import ConfigError, load_config
from tests.support.project import user_module


def linear(tmp_path, *sets):
    return load_config("linear", [f"run.storage_path={tmp_path}", "run.name=loop", "train.batch_size=12",
                                  "data.num_samples=96", "train.epochs=2", *sets])


def test_the_optimizer_and_scheduler_are_components_checked_against_their_signatures(tmp_path):
    cfg = linear(tmp_path, "train.optimizer={_component_: torch.optim.SGD, lr: 0.2, momentum: 0.5}",
                 "train.scheduler={_component_: torch.optim.lr_scheduler.StepLR, step_size: 3, interval: step}")
    model = torch.nn.Linear(1, 1)
    optimizer = build_optimizer(cfg, model)
    assert isinstance(optimizer, torch.optim.SGD)
    assert (optimizer.param_groups[0]["lr"], optimizer.param_groups[0]["momentum"]) == (0.2, 0.5)
    scheduler = build_scheduler(cfg, optimizer)
    assert isinstance(scheduler, torch.optim.lr_scheduler.StepLR) and scheduler.step_size == 3
    assert cfg.to_dict()["train"]["scheduler"]["interval"] == "step"
    with pytest.raises(ConfigError, match="train.optimizer.momentun.*did you mean 'momentum'"):
        linear(tmp_path, "train.optimizer={_component_: torch.optim.SGD, lr: 0.1, momentun: 0.9}")
    with pytest.raises(ConfigError, match="train.scheduler.interval.*step or epoch"):
        linear(tmp_path, "train.scheduler={_component_: torch.optim.lr_scheduler.StepLR, step_size: 1, "
                         "interval: batch}")


def steps_per_epoch(cfg) -> int:
    import math

    from raytrain.worker.localsession import LocalSession

    session = LocalSession(cfg, runrecords.run_dir_of(cfg.run.storage_path, cfg.run.name), cpus=1)
    return math.ceil(len(session.datasets()["train"]) / cfg.train.batch_size)


@pytest.mark.parametrize("interval", ["step", "epoch"])
def test_the_scheduler_steps_as_declared_and_comes_back_on_resume(tmp_path, interval):
    sets = ["train.optimizer={_component_: torch.optim.SGD, lr: 1.0}",
            f"train.scheduler={{_component_: torch.optim.lr_scheduler.StepLR, step_size: 1, gamma: 0.5, "
            f"interval: {interval}}}"]
    cfg = linear(tmp_path, *sets)
    steps = steps_per_epoch(cfg)
    first = train_local(cfg, out=io.StringIO())
    halvings = 2 * steps if interval == "step" else 2
    assert runrecords.read_metrics(first.run_dir)[-1]["lr"] == pytest.approx(0.5 ** halvings)
    second = train_local(linear(tmp_path, *sets, "train.epochs=4"), out=io.StringIO())
    # the scheduler's state came back with the checkpoint: it goes on halving, it does not start over
    assert runrecords.read_metrics(second.run_dir)[-1]["lr"] == pytest.approx(0.5 ** (2 * halvings))


def test_gradient_accumulation_trains_what_the_whole_batch_trains():
    torch.manual_seed(0)
    x, y = torch.randn(32, 4), torch.randn(32, 1)
    results = []
    for accum, size in ((1, 16), (4, 4)):
        torch.manual_seed(1)
        model = torch.nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        batches = [(x[i:i + size], y[i:i + size]) for i in range(0, 32, size)]
        stats = train_epoch(model, batches, optimizer, torch.nn.functional.mse_loss, accum_steps=accum)
        results.append((model.weight.detach().clone(), stats.samples))
    assert torch.allclose(results[0][0], results[1][0], atol=1e-6) and results[0][1] == results[1][1] == 32


def test_the_epoch_loss_is_summed_on_the_device_without_a_host_sync_per_step():
    model = torch.nn.Linear(2, 1)
    stats = EpochStats()
    steps = []
    train_epoch(model, [(torch.randn(4, 2), torch.randn(4, 1)) for _ in range(5)],
                torch.optim.SGD(model.parameters(), lr=0.01), torch.nn.functional.mse_loss, stats=stats,
                on_step=lambda step, loss: steps.append((step, type(loss))))
    assert isinstance(stats.loss_sum, torch.Tensor)  # read once, at the epoch's end
    assert steps == [(i, torch.Tensor) for i in range(1, 6)]
    assert stats.as_list()[2] == 20.0


def test_per_step_rows_when_asked(tmp_path):
    cfg = linear(tmp_path, "run.log_every_steps=2")
    steps = steps_per_epoch(cfg)
    outcome = train_local(cfg, out=io.StringIO())
    rows = runrecords.read_steps(outcome.run_dir)
    assert [(r["epoch"], r["step"]) for r in rows] == [(e, s) for e in (1, 2) for s in range(2, steps + 1, 2)]
    assert all(isinstance(r["train_loss"], float) and r["attempt"] == 1 for r in rows)


def test_gradient_accumulation_must_split_the_workers_share(tmp_path):
    with pytest.raises(ConfigError, match="4 samples per step do not split into 3 equal micro-batches"):
        linear(tmp_path, "train.grad_accum_steps=3")  # 12 over the preset's 3 workers: 4 each
    outcome = train_local(linear(tmp_path, "train.grad_accum_steps=2"), out=io.StringIO())
    assert outcome.ok and [r["epoch"] for r in runrecords.read_metrics(outcome.run_dir)] == [1, 2]


OWN_LOOP = """
    import torch
    from torch import nn
    from torch.utils.data import TensorDataset

    def loop(session, lr: float = 0.05):
        x = torch.linspace(0, 1, 48).reshape(-1, 1)
        model = session.prepare_model(nn.Linear(1, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=lr)
        start = session.restore(model, optimizer)
        for epoch in range(start, session.config.train.epochs + 1):
            for inputs, targets in session.batches(TensorDataset(x, 3 * x), epoch):
                optimizer.zero_grad()
                loss = nn.functional.mse_loss(model(inputs), targets)
                loss.backward()
                optimizer.step()
            session.report(epoch, {"train_loss": loss, "lr": optimizer.param_groups[0]["lr"]}, model=model,
                           optimizer=optimizer)
"""


@pytest.fixture
def own_loop(tmp_path):
    yield from user_module(tmp_path, "own_loop", OWN_LOOP)


def test_a_loop_of_ones_own_needs_no_model_or_data_and_keeps_its_optimizers_settings(own_loop):
    job = own_loop / "job.yaml"

    def write(epochs, train_lr, loop_lr):
        job.write_text(f"loop: {{_component_: own_loop.loop, lr: {loop_lr}}}\n"
                       f"train: {{epochs: {epochs}, batch_size: 12, lr: {train_lr}}}\n"
                       f"scaling: {{num_workers: 1}}\nrun: {{storage_path: {own_loop / 'runs'}}}\n")
        return load_config(str(job))

    cfg = write(2, 0.001, 0.05)
    assert cfg.model is None and cfg.data is None
    first = train_local(cfg, out=io.StringIO())
    assert [r["lr"] for r in runrecords.read_metrics(first.run_dir)] == [0.05, 0.05]
    # train.lr is the built-in loop's setting, not this loop's: a resume does not write it into its optimizer
    second = train_local(write(3, 0.9, 0.05), out=io.StringIO())
    assert [r["lr"] for r in runrecords.read_metrics(second.run_dir)] == [0.05, 0.05, 0.05]
    assert not [e for e in runrecords.read_events(second.run_dir) if e["event"] == "restored" and e["applied"]]


def test_an_epoch_resumed_mid_way_counts_only_the_samples_it_trained_in_its_throughput(tmp_path):
    """Issue 38: the epoch a run resumes in keeps the restored steps' samples in its row (`samples`, the loss), but
    its samples/s counts only the samples trained in the resumed part's seconds (`epoch_s`)."""
    from raytrain.checkpoint import checkpoints

    cfg = linear(tmp_path, "run.checkpoint_every_steps=5", "train.epochs=1", "run.keep_checkpoints=50")
    first = train_local(cfg, out=io.StringIO())
    [whole] = runrecords.read_metrics(first.run_dir)
    assert whole["samples_per_s"] * whole["epoch_s"] == pytest.approx(whole["samples"])
    for path in checkpoints.committed(first.run_dir):
        if checkpoints.position_of(path).step != 5:
            checkpoints.remove(path)
    runrecords.Records(first.run_dir).truncate_metrics(0)
    second = train_local(cfg, out=io.StringIO())
    [resumed] = runrecords.read_metrics(second.run_dir)
    assert resumed["resumed_from_epoch"] == 0 and resumed["samples"] == whole["samples"]
    assert resumed["samples_per_s"] * resumed["epoch_s"] == pytest.approx(whole["samples"] - 5 * 12)


def test_a_rows_throughput_is_over_the_samples_trained_in_its_seconds():
    from raytrain.loop import metrics_row

    row = metrics_row(EpochStats(loss_sum=50.0, samples=100), None, 2.0, False, trained=40)
    assert (row["samples"], row["samples_per_s"], row["epoch_s"], row["train_loss"]) == (100, 20.0, 2.0, 0.5)
    assert metrics_row(EpochStats(loss_sum=50.0, samples=100), None, 2.0, False)["samples_per_s"] == 50.0
