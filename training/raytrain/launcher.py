"""Builds and runs the TorchTrainer: embedded or joined Ray, worker sizing, resume, progress, result.json.

This is the driver side. On a cluster it runs on the head pod as the RayJob's entrypoint (`--address auto`);
on a laptop it starts an embedded local Ray sized to the machine.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, TextIO

from raytrain import checkpoints, console, preflight, runs, scaleup
from raytrain.config import RunConfig
from raytrain.errors import LaunchError
from raytrain.loop import format_row


# Ray Train V2's controller polls its workers (and collects their reports) every 2 s by default; each report
# waits for that poll. Half a second keeps checkpoints and failure detection prompt at negligible cost for the
# handful of workers a job has. An explicit RAY_TRAIN_HEALTH_CHECK_INTERVAL_S in the environment wins.
CONTROLLER_POLL_INTERVAL_S = "0.5"


@dataclass
class Outcome:
    run_dir: Path
    result: dict

    @property
    def ok(self) -> bool:
        return self.result["status"] == "succeeded"


def connect_for(cfg: RunConfig, address: Optional[str], in_submitted_job: bool) -> str:
    """connect_ray with the runtime env that ships the config's user code (preflight decides what travels)."""
    env = preflight.runtime_env(cfg, embedded=not address, in_submitted_job=in_submitted_job)
    return connect_ray(address, runtime_env=env, code_dir=preflight.user_code_dir(cfg))


def alive_node_resources() -> list[dict]:
    import ray

    return [dict(n["Resources"]) for n in ray.nodes() if n.get("Alive")]


# ----------------------------------------------------------------------------------------------------------
# Ray


def connect_ray(address: Optional[str], runtime_env: Optional[dict] = None,
                code_dir: Optional[Path] = None) -> str:
    """Join the cluster at `address`, or start an embedded local Ray. Returns a description for the log.
    runtime_env: what a joining driver ships (the user's code); code_dir: the user's project directory, which an
    embedded Ray's workers find through PYTHONPATH (they inherit this process's environment)."""
    import logging

    import ray

    # log_to_driver=False: the driver's console carries raytrain's own lines (per-epoch rows, warnings, resumes,
    # one closing message), not every worker's output and Ray's retry tracebacks; those stay in Ray's logs
    # (the session's logs/ directory, the dashboard, `ray job logs`).
    if ray.is_initialized():
        return "already connected"
    # Ray 2.55 announces a future default with a FutureWarning on every init. We want today's behaviour (workers
    # that asked for no GPU see none), so the tip is noise here.
    warnings.filterwarnings("ignore", message="Tip: In future versions of Ray", category=FutureWarning)
    if address:
        ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False, runtime_env=runtime_env or None)
        return f"joined Ray cluster at {address}"
    if code_dir is not None:
        paths = [str(code_dir), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
        os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    # address="local" always starts a new embedded Ray, even if another local cluster is running.
    ray.init(address="local", include_dashboard=False, logging_level=logging.WARNING, log_to_driver=False)
    return f"started embedded Ray ({os.cpu_count()} CPUs)"


# ----------------------------------------------------------------------------------------------------------
# progress


class Progress(threading.Thread):
    """Prints each epoch's row as rank 0 writes it to metrics.jsonl; a bar on interactive terminals."""

    def __init__(self, run_dir: Path, epochs: int, out: TextIO):
        super().__init__(daemon=True)
        self.run_dir, self.epochs, self.out = run_dir, epochs, out
        self.interactive = out.isatty() and not console.is_json()
        # Keyed by epoch and its duration: an epoch trained again after a resume is a new row worth printing.
        self.printed: set[tuple] = {self.key(row) for row in runs.read_metrics(run_dir)}
        self.events_seen = len(runs.read_events(run_dir))
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.wait(0.5):
            self.poll()
        self.poll()

    @staticmethod
    def key(row: dict) -> tuple:
        return row["epoch"], row.get("epoch_s")

    def poll(self) -> None:
        events = runs.read_events(self.run_dir)
        for event in events[self.events_seen:]:
            if event["event"] == "warning":
                console.warning(event["message"], out=self.out, rank=0)
            elif event["event"] == "drain":
                console.info("drain", event["message"], out=self.out, rank=0)
            elif event["event"] == "restored":
                at = f" (at step {event['step']} of epoch {event['epoch'] + 1})" if event.get("step") else ""
                console.info("restored", f"resuming after epoch {event['epoch']}{at} from {event['checkpoint']}",
                             out=self.out, rank=0, epoch=event["epoch"], step=event.get("step", 0),
                             checkpoint=event["checkpoint"])
        self.events_seen = len(events)
        for row in runs.read_metrics(self.run_dir):
            if self.key(row) not in self.printed:
                self.printed.add(self.key(row))
                console.epoch(format_row(row, self.epochs), row, out=self.out,
                              bar=row["epoch"] / self.epochs if self.interactive else None)

    def stop(self) -> None:
        self.stopping.set()
        self.join(timeout=5)
        if self.interactive:
            self.out.write("\n")


# ----------------------------------------------------------------------------------------------------------
# the run


def root_cause(err: BaseException) -> str:
    """One line for the user out of Ray's nested errors: the innermost exception's last line."""
    while err.__cause__ is not None:
        err = err.__cause__
    lines = [line.strip() for line in str(err).strip().splitlines() if line.strip()]
    return lines[-1] if lines else err.__class__.__name__


def summarize(run_dir: Path, status: str, started: float, error: Optional[str] = None) -> dict:
    rows = runs.read_metrics(run_dir)
    starts = [e for e in runs.read_events(run_dir) if e["event"] == "start" and e["time"] >= started]
    resumes = [e["resumed_from_epoch"] for e in starts if e.get("resumed_from_epoch") is not None]
    newest = checkpoints.newest_verified(run_dir)  # never a checkpoint that would not load
    result = {
        "status": status,
        "epochs_completed": rows[-1]["epoch"] if rows else 0,
        # The latest resume point of this invocation (null when it trained from scratch throughout).
        "resumed_from_epoch": resumes[-1] if resumes else None,
        "resumes": resumes,
        "worker_group_starts": len(starts),
        "metrics": rows[-1] if rows else {},
        "run_dir": str(run_dir),
        "checkpoint": str(newest) if newest else None,
        "duration_s": round(time.time() - started, 3),
    }
    if error:
        result["error"] = error
    return result


def build_trainer(cfg: RunConfig, run_dir: Path, per_worker: dict[str, float], callbacks: tuple = (),
                  lease_token: Optional[int] = None, on_cluster: bool = False):
    """The TorchTrainer for one run (driver side: builds the Ray Datasets of a `data.loader: ray` config);
    `raytrain tune` adds its TuneReportCallback through `callbacks`; lease_token: the attempt (raytrain.lease) whose
    workers commit to run_dir; on_cluster: a joined cluster (its Prometheus should see the last epoch's metrics)."""
    import ray.train
    from ray.train.torch import TorchTrainer

    from raytrain.session import worker_entry

    code_dir = preflight.user_code_dir(cfg)
    return TorchTrainer(
        worker_entry,
        train_loop_config={"config": cfg.to_dict(), "run_dir": str(run_dir), "cpus_per_worker": per_worker["CPU"],
                           "working_dir": str(code_dir) if code_dir else None, "lease_token": lease_token,
                           "telemetry_linger": on_cluster},
        scaling_config=ray.train.ScalingConfig(
            num_workers=cfg.scaling.num_workers,
            use_gpu=cfg.scaling.use_gpu,
            resources_per_worker=per_worker,
        ),
        run_config=ray.train.RunConfig(
            name=cfg.run.name,
            storage_path=str(run_dir.parent),
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=cfg.run.keep_checkpoints),
            failure_config=ray.train.FailureConfig(max_failures=cfg.run.max_failures),
            callbacks=list(callbacks),
        ),
        datasets=preflight.driver_datasets(cfg),
    )


def train(cfg: RunConfig, address: Optional[str] = None, out: TextIO = sys.stdout,
          in_submitted_job: bool = False, lease_token: Optional[int] = None) -> Outcome:
    """Run the config with Ray Train; writes STORAGE/NAME/{config.yaml, metrics.jsonl, result.json}.
    in_submitted_job: this driver is a Ray job's entrypoint, whose runtime env already carries the user's code.
    lease_token: the attempt holding the run (raytrain.attempt takes the lease and checks the resume first)."""
    started = time.time()
    run_dir = preflight.start_run(cfg, lambda directory, error: summarize(directory, "failed", started, error))
    connected = connect_for(cfg, address, in_submitted_job)
    console.info("connected", f"{connected}; run directory {run_dir}", out=out, run_dir=str(run_dir))
    try:
        # Sized against what an autoscaler can still add, waiting for it (scaleup.py), else the nodes up now.
        per_worker = scaleup.size_on_cluster(cfg, alive_node_resources, out=out)
    except LaunchError as err:
        runs.write_result(run_dir, summarize(run_dir, "failed", started, str(err)))
        raise
    trainer = build_trainer(cfg, run_dir, per_worker, lease_token=lease_token, on_cluster=address is not None)
    shape = ", ".join(f"{k} {v:g}" for k, v in per_worker.items())
    console.info("training", f"training {cfg.run.name}: {cfg.scaling.num_workers} workers x {{{shape}}}, "
                 f"global batch {cfg.train.batch_size} ({cfg.per_worker_batch_size} per worker)", out=out,
                 num_workers=cfg.scaling.num_workers, per_worker=per_worker)
    # Ray Train propagates this variable from the driver to its controller and workers.
    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", CONTROLLER_POLL_INTERVAL_S)
    progress = Progress(run_dir, cfg.train.epochs, out)
    progress.start()
    try:
        trainer.fit()
    except Exception as err:  # Ray Train's TrainingFailedError and friends: the run used up its retries
        progress.stop()
        result = summarize(run_dir, "failed", started)
        kept = (f"The newest checkpoint is kept in {run_dir}; run the same command again to resume from it"
                if result["checkpoint"] else "No checkpoint was written; fix the cause and run again")
        result["error"] = (f"training failed after {cfg.run.max_failures} allowed worker-group restarts: "
                           f"{root_cause(err)}. {kept}. Full worker logs: Ray's session logs (logs/worker-*.err) "
                           f"or the dashboard.")
        runs.write_result(run_dir, result)
        return Outcome(run_dir, result)
    progress.stop()
    result = summarize(run_dir, "succeeded", started)
    runs.write_result(run_dir, result)
    return Outcome(run_dir, result)
