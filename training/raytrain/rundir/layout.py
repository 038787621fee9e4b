"""Every name in a run directory STORAGE/NAME, in one place: what a run keeps, as users find it on their volume or
bucket. Run directories written by any earlier raytrain have this layout (tests/test_run_dirs_before_the_move.py),
so a name here changes only with a migration."""

import re

# The run's records (raytrain.rundir.runrecords)
CONFIG_FILE = "config.yaml"  # the resolved run config
METRICS_FILE = "metrics.jsonl"  # a row per epoch (or per report of a Ray Train function)
STEPS_FILE = "steps.jsonl"  # per-step rows, when run.log_every_steps asks
EVENTS_FILE = "events.jsonl"  # starts, restores, resizes, warnings
RESULT_FILE = "result.json"  # the newest attempt's outcome
RESULTS_HISTORY_FILE = "results.jsonl"  # every attempt's outcome

# One writer per run (raytrain.rundir.lease)
LEASE_FILE = "lease.json"  # the holder, its renewals and the driver's stop request
CLAIMS_DIR = ".lease"  # a claim per attempt, made exclusively: the attempt's fencing token

# Checkpoints (raytrain.checkpoint): committed ones, and those being written
CHECKPOINT_PREFIX = "checkpoint_"  # checkpoint_epoch000003[_step00000040]_<id>
STAGING_PREFIX = ".staging-"  # a checkpoint being written; never read, removed by the next holder
RANK_STAGING_SUFFIX = ".rank"  # .staging-NAME.rank1: what rank 1 reported, before it hands over the files it owns
MANIFEST_FILE = "meta.json"  # a checkpoint's manifest, written last: on an object store its upload is the commit

# What the driver and its helpers keep beside the records
DRIVER_LOGS_DIR = "driver-logs"  # a copy of the console per attempt (raytrain.rundir.console)
WORKER_LOGS_DIR = "worker-logs"  # each rank's output and first failure, attempt-<N>-rank<R>.log and .error.json
# (raytrain.rundir.workerlogs; read by raytrain.rundir.postmortem)
TRACKING_FILE = "tracking.json"  # the tracker runs' identities (raytrain.driver.tracking)
RAY_TRAIN_DIR = ".ray-train"  # Ray Train's own files, an attempt-N directory per attempt (raytrain.driver.raytrainer)
TUNE_FILE = "tune.json"  # a `raytrain tune` sweep's summary (raytrain.driver.tune, raytrain.driver.report)

# An elastic run's resize handshake between Ray Train's controller and rank 0 (raytrain.worker.elastic)
RESIZE_REQUEST_FILE = "resize-request.json"
RESIZE_HELD_FILE = "resize-held.json"

# Beside the runs, under STORAGE (not a run's): prepared datasets (raytrain.data)
DATASETS_DIR = "datasets"


# A checkpoint's name records its position: checkpoint_epoch000003[_step00000040]_<id>
_CHECKPOINT_NAME = re.compile(rf"{CHECKPOINT_PREFIX}epoch(\d+)(?:_step(\d+))?")


def checkpoint_position(name: str) -> tuple[int, int]:
    """The (epoch, step) a checkpoint's name records (raytrain.checkpoint.checkpoints.checkpoint_dir_name), (-1, 0)
    for another name."""
    match = _CHECKPOINT_NAME.match(name)
    return (int(match.group(1)), int(match.group(2) or 0)) if match else (-1, 0)
