"""What every start of a run does in the driver first, in this order (`raytrain run`'s attempt, `raytrain local`,
each `tune` trial): the storage checked and the run's lease taken, a resume checked against the run's checkpoints,
then the start itself: the model checked, the resolved config.yaml written, the data prepared once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

from raytrain.checkpoint import checkpoints, resume
from raytrain.driver.dataprep import prepare_data
from raytrain.driver.preflight import check_model_builds, check_model_fits_data
from raytrain.errors import ConfigError, LaunchError
from raytrain.rundir import console, layout, runrecords, storage
from raytrain.rundir.runcontrol import RunControl
from raytrain.rundir.storagecheck import check_storage
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
    restored position says should exist but are gone."""
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
    lost = resume.missing_rows(run_dir, plan.epoch) if plan.checkpoint is not None else []
    if lost:
        warn(f"{run_dir / layout.METRICS_FILE} lacks the rows of epoch(s) {_ranges(lost)}, which the checkpoint "
             f"{plan.checkpoint.name} says were trained: the file was truncated or deleted. Training resumes after "
             f"epoch {plan.epoch}; those rows are not recovered (the checkpoint holds no metrics).")
    # Rows past the checkpoint this start resumes from will be trained again (all of them when it starts over).
    records.truncate_metrics(plan.epoch, plan.step)
    for key, (old, new) in plan.applied.items():
        console.info("resume_applies", f"resume applies {key}={new} (the checkpoint trained with {old})",
                     key=key, checkpoint_value=old, value=new)
    return plan


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
