"""`raytrain local`: the same components and loop in one plain PyTorch process, no Ray.

This is the "before Ray" baseline and the quickest way to debug a user's own model, data or loop: the loop gets a
LocalSession with the same contract as on Ray Train (metrics rows, checkpoints in the run directory, resume), so
the two differ only in what Ray adds (processes, sharding, DDP)."""

from __future__ import annotations

import os
import sys
import time
from typing import TextIO

from raytrain import components, console, preflight, runs
from raytrain.config import RunConfig
from raytrain.errors import LaunchError
from raytrain.launcher import Outcome, summarize


def train_local(cfg: RunConfig, out: TextIO = sys.stdout) -> Outcome:
    from raytrain.loop import format_row
    from raytrain.session import LocalSession

    started = time.time()
    # No lease here (one plain process): torn checkpoint directories are skipped, not removed.
    run_dir = preflight.start_run(cfg, lambda directory, error: summarize(directory, "failed", started, error),
                                  before_config=lambda directory: preflight.check_resume(cfg, directory,
                                                                                         remove_torn=False))
    session = LocalSession(cfg, run_dir, os.cpu_count() or 1,
                           on_row=lambda row: console.epoch(format_row(row, cfg.train.epochs), row, out=out))
    console.info("training", f"local training {cfg.run.name} on {session.device}; run directory {run_dir}", out=out,
                 run_dir=str(run_dir))
    try:
        components.instantiate(cfg.loop, session)
    except Exception as err:  # the model's, data's or loop's own code raised: one paragraph, the result recorded
        message = (f"training failed: {err.__class__.__name__}: {' '.join(str(err).split())}"
                   f"{components.innermost_site(err)}. Checkpoints written so far are kept; fix the cause and run "
                   f"the same command again to resume.")
        runs.write_result(run_dir, summarize(run_dir, "failed", started, message))
        raise LaunchError(message) from None
    result = summarize(run_dir, "succeeded", started)
    runs.write_result(run_dir, result)
    return Outcome(run_dir, result)
