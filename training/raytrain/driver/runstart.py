"""What every start of a run does in the driver first, in this order (`raytrain run`'s attempt, `raytrain local`,
each `tune` trial): the storage checked and the run's lease taken, a resume checked against the run's checkpoints
(and a run with nothing left to train ended there, before Ray: `nothing_to_train`), then the start itself: the
model checked, the resolved config.yaml written, the data prepared once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

from raytrain.checkpoint import checkpoints, resume
from raytrain.driver.dataprep import prepare_data
from raytrain.driver.preflight import check_model_builds, check_model_fits_data
from raytrain.errors import ConfigError, LaunchError, RaytrainError
from raytrain.rundir import console, layout, runrecords, storage
from raytrain.rundir.runcontrol import RunControl
from raytrain.rundir.storagecheck import check_storage
from raytrain.spec import loops
from raytrain.spec.config import dump_yaml
from raytrain.spec.sections import RunConfig


def take_lease(cfg: RunConfig, ttl_s: float, *, wait: bool, notify: Callable[[str], None],
               on_lost: Optional[Callable[[str], None]] = None) -> RunControl:
    """The first thing a start (`raytrain run`'s attempt, `raytrain local`) does: check the storage, then hold the
    run directory's lease in the process's run control (raytrain.rundir.runcontrol) before anything in it is read or
    written."""
    check_storage(cfg.run.storage_path, cfg.run.name)
    run_dir = runrecords.run_dir_of(cfg.run.storage_path, cfg.run.name)
    storage.makedirs(run_dir)
    return RunControl.acquire(run_dir, ttl_s, wait=wait, notify=notify, on_lost=on_lost)


def check_resume(cfg: RunConfig, records: runrecords.Records) -> resume.ResumePlan:
    """What this start resumes from, decided before Ray starts: a change the loop declares fixed (the model's
    shape, the optimizer) is refused with one paragraph (ResumeRefused); settings the loop hands to raytrain are
    announced (the session sets them into the restored optimizer); checkpoints that exist but none of which loads
    refuse the start. Staging directories never committed are deleted (only while holding the run's lease). What
    it skips or removes is said on the console and recorded in events.jsonl, and so are metrics rows that the
    restored position says should exist but are gone. The settings it applies are announced by
    announce_applied, once the start is known to train."""
    run_dir = records.run_dir

    def warn(message: str) -> None:
        console.warning(message)
        records.append_event("warning", message=message)

    checkpointer = checkpoints.FileCheckpointer(run_dir, records.control, keep=cfg.run.keep_checkpoints)

    plan = resume.plan(run_dir, cfg.to_dict(), warn, resume.resume_rules(cfg), checkpointer)
    if plan.checkpoint is not None and checkpoints.kind_of(plan.checkpoint) != cfg.checkpointer:
        written = checkpoints.kind_of(plan.checkpoint)
        raise resume.ResumeRefused(
            f"run {run_dir.name} resumes from {plan.checkpoint.name}, a {written} checkpoint, but this config writes "
            f"{cfg.checkpointer} ones (run.checkpointer: {cfg.run.checkpointer}, scaling.strategy: "
            f"{cfg.scaling.strategy}), which cannot load it. Fix: resume with --set run.checkpointer={written}, or "
            f"train the new setup under another --name.")
    if plan.step and plan.loader_change is not None:
        # Each loader orders an epoch its own way (raytrain's ShardSampler, Ray Data's blocks): the rest of the
        # checkpoint's epoch follows the new order from the same step.
        before, now = plan.loader_change
        warn(f"{plan.checkpoint.name} was taken {plan.step} steps into epoch {plan.epoch + 1} with data.loader "
             f"{before}; this start uses {now}, which orders the epoch another way: the rest of that epoch sees "
             f"some samples twice and others not at all (later epochs are whole). Fix, to avoid it: resume with "
             f"--set data.loader={before}.")
    lost = resume.missing_rows(run_dir, plan.epoch) if plan.checkpoint is not None else []
    if lost:
        warn(f"{run_dir / layout.METRICS_FILE} lacks the rows of epoch(s) {_ranges(lost)}, which the checkpoint "
             f"{plan.checkpoint.name} says were trained: the file was truncated or deleted. Training resumes after "
             f"epoch {plan.epoch}; those rows are not recovered (the checkpoint holds no metrics).")
    # Rows past the checkpoint this start resumes from will be trained again (all of them when it starts over).
    records.truncate_metrics(plan.epoch, plan.step)
    return plan


def announce_applied(plan: resume.ResumePlan) -> None:
    """The settings the loop hands to raytrain that this start changes (the session sets them into the restored
    optimizer), said before it trains."""
    for key, (old, new) in plan.applied.items():
        console.info("resume_applies", f"resume applies {key}={new} (the checkpoint trained with {old})",
                     key=key, checkpoint_value=old, value=new)


def nothing_to_train(cfg: RunConfig, plan: resume.ResumePlan) -> str | None:
    """The one line a start says instead of training, or None (train): the checkpoint it would resume from (the
    newest that loads: check_resume's plan) already holds the run's last epoch, train.epochs (or more, when the
    config lowered it since). A start that would train nothing ends there, before Ray starts. A run that ended
    failed or stopped midway has no such checkpoint and trains on, and so does one whose train.epochs was raised
    since (`--set train.epochs=N`); a damaged newest checkpoint plans from the one before, which trains on.

    Not for a Ray Train function (loops.is_ray_train_loop): its progress is whatever it reports, against a setting
    of its own (e.g. loop.train_loop_config.epochs), not raytrain's train.epochs, so only the function, started on
    Ray, can tell whether it is done."""
    if plan.checkpoint is None or loops.is_ray_train_loop(cfg) or plan.epoch < cfg.train.epochs:
        return None
    epochs = cfg.train.epochs
    done = (f"already finished {epochs} epochs" if plan.epoch == epochs else
            f"already trained {plan.epoch} epochs, more than train.epochs={epochs} asks")
    return (f"nothing to train: {cfg.run.name} {done} (checkpoint {plan.checkpoint.name}); raise train.epochs to "
            f"train on (e.g. --set train.epochs={plan.epoch + max(epochs // 2, 1)})")


def looks_finished(cfg: RunConfig) -> bool:
    """A look before the lease, reading only: whether nothing_to_train will likely say so under the lease, from
    the newest committed checkpoint whose manifest and size agree (no read of its state: the hash is checked under
    the lease). False for a Ray Train function, a run directory without checkpoints, or one it cannot list: the
    full start decides (and reports what it meets)."""
    if loops.is_ray_train_loop(cfg):
        return False
    try:
        newest = checkpoints.newest_complete(runrecords.run_dir_of(cfg.run.storage_path, cfg.run.name))
    except (OSError, RaytrainError):  # storage that cannot be read: the start checks it and says why
        return False
    return newest is not None and checkpoints.position_of(newest).epoch >= cfg.train.epochs


def _ranges(numbers: list[int]) -> str:
    """[1, 2, 3, 5] -> '1-3, 5'."""
    spans: list[list[int]] = []
    for number in numbers:
        if spans and number == spans[-1][1] + 1:
            spans[-1][1] = number
        else:
            spans.append([number, number])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def start_run(cfg: RunConfig, records: runrecords.Records, failure_record: Callable[[Path, str], dict]) -> None:
    """The start every run shares after its lease and resume check, in this order: the model builds (before
    anything more is written), the resolved config.yaml, then the data prepared once; missing data records
    `failure_record(run_dir, message)` as result.json."""
    check_model_builds(cfg)
    records.write_config(dump_yaml(cfg))
    try:
        prepare_data(cfg)
        check_model_fits_data(cfg)
    except (LaunchError, ConfigError) as err:
        records.write_result(failure_record(records.run_dir, str(err)))
        raise
