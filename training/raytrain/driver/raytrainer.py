"""The Ray Train body of an attempt (raytrain.driver.attempt): embedded or joined Ray, worker sizing, the TorchTrainer,
progress lines. The attempt around it owns the lease, the resume check and result.json.

This is the driver side. On a cluster it runs on the head pod as the RayJob's entrypoint (`--address auto`);
on a laptop it starts an embedded local Ray sized to the machine.

Ray Train keeps its own files (its controller's checkpoint-manager snapshot, validation markers) under
STORAGE/NAME/.ray-train/attempt-<token>: one directory per attempt, so that a stale attempt's controller (paused,
then resumed after a takeover) never prunes, or points the new attempt at, anything the new attempt depends on.
raytrain reports no checkpoints to Ray Train: the Session's checkpointer commits them into the run directory itself.
"""

from __future__ import annotations

import errno
import logging
import os
import sys
import threading
from pathlib import Path
from typing import Optional, TextIO

from raytrain.checkpoint import checkpoints
from raytrain.driver import dataprep, runtimeenv, scaleup, workerdeaths
from raytrain.errors import LaunchError
from raytrain.lifecycle.endings import AttemptEnded, Ending
from raytrain.loop import show_rows
from raytrain.platform import rayinternals
from raytrain.platform.rayinternals import quiet_ray_thread_warning, quiet_token_auth_notice
from raytrain.rundir import console, layout, runrecords, storage, workerlogs
from raytrain.spec import loops
from raytrain.spec.sections import RunConfig
from raytrain.worker import elastic, replicas, telemetry
from raytrain.worker.raysession import worker_entry

# Ray Train V2's controller polls its workers (and collects their reports) every 2 s by default; each report
# waits for that poll. Half a second keeps checkpoints and failure detection prompt at negligible cost for the
# handful of workers a job has. An explicit RAY_TRAIN_HEALTH_CHECK_INTERVAL_S in the environment wins.
CONTROLLER_POLL_INTERVAL_S = "0.5"


def connect_for(cfg: RunConfig, address: Optional[str], in_submitted_job: bool) -> str:
    """connect_ray with the runtime env that ships the config's user code (runtimeenv decides what travels)."""
    env = runtimeenv.runtime_env(cfg, embedded=not address, in_submitted_job=in_submitted_job)
    return connect_ray(address, runtime_env=env, code_dir=runtimeenv.user_code_dir(cfg))


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

    import ray

    # log_to_driver=False: the driver's console carries raytrain's own lines (per-epoch rows, warnings, resumes,
    # one closing message) and what rank 0 prints (through the run directory: Progress), not every worker's output
    # and Ray's retry tracebacks; those stay in Ray's logs (the session's logs/ directory, the dashboard,
    # `ray job logs`).
    if ray.is_initialized():
        return "already connected"

    quiet_ray_thread_warning()  # the attempt starts Ray from its body's thread on purpose
    if address:
        try:
            ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False,
                     runtime_env=runtime_env or None)
        except Exception as err:  # anything ray.init raises here is the cluster not answering, not raytrain's bug
            raise LaunchError(f"cannot join the Ray cluster at {address}: {root_cause(err)}. Fix: check that the "
                              f"cluster is up and reachable, and where it uses token auth set RAY_AUTH_MODE=token with "
                              f"RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH (Ray sends ~/.ray/auth_token to an address "
                              f"only with RAY_AUTH_MODE=token), or leave --address out to train on an embedded "
                              f"local Ray.") from None
        return f"joined Ray cluster at {address}"
    if code_dir is not None:
        paths = [str(code_dir), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
        os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    quiet_token_auth_notice()  # Ray 2.60 turns token auth on for an embedded Ray, and says so on every start
    # address="local" always starts a new embedded Ray, even if another local cluster is running.
    try:
        ray.init(address="local", include_dashboard=False, logging_level=logging.WARNING, log_to_driver=False)
    except Exception as err:  # Ray's own start failed (an overloaded machine, no room in /tmp): say so, once
        raise LaunchError(f"the embedded Ray did not start: {root_cause(err)}. Fix: free CPU, memory and room in "
                          f"Ray's temp dir (/tmp/ray, or RAY_TMPDIR), then run the same command again.") from None
    return f"started embedded Ray ({os.cpu_count()} CPUs)"


# ----------------------------------------------------------------------------------------------------------
# progress


class Progress(threading.Thread):
    """Prints each epoch's row as rank 0 writes it to metrics.jsonl, a bar on interactive terminals, and what rank 0
    of `attempt` prints (raytrain.rundir.workerlogs)."""

    def __init__(self, run_dir: Path, epochs: int, out: TextIO, attempt: Optional[int] = None):
        super().__init__(daemon=True)
        self.run_dir, self.epochs, self.out = run_dir, epochs, out
        self.output = workerlogs.Follower(run_dir, attempt)
        self.final = False  # the last poll: a last line without its newline is printed too
        self.interactive = out.isatty() and not console.is_json()
        # Keyed by epoch and its duration: an epoch trained again after a resume is a new row worth printing.
        self.printed: set[tuple] = {self.key(row) for row in runrecords.read_metrics(run_dir)}
        self.events_seen = len(runrecords.read_events(run_dir))
        self.stopping = threading.Event()
        self.failed = False  # warned once that a poll failed

    def run(self) -> None:
        while not self.stopping.wait(0.5):
            self.poll_quietly()
        self.final = True
        self.poll_quietly()

    def poll_quietly(self) -> None:
        """poll, where whatever it meets is one warning line, once (the run's own records are unaffected; a thread's
        traceback would land in the middle of the epochs' lines), and the next poll tries again."""
        try:
            self.poll()
        except Exception as err:  # noqa: BLE001 - a display thread: nothing it meets may end or clutter the run
            if not self.failed:
                self.failed = True
                message = " ".join(str(err).split()) or err.__class__.__name__
                console.warning(f"cannot read the run's progress from {self.run_dir} ({err.__class__.__name__}: "
                                f"{message}); the run goes on, and its records are complete", out=self.out, rank=0)

    @staticmethod
    def key(row: dict) -> tuple:
        return row["epoch"], row.get("epoch_s")

    def poll(self) -> None:
        for line in self.output.new_lines(final=self.final):  # before the rows: a function prints, then reports
            console.output(line, out=self.out, rank=0)
        events = runrecords.read_events(self.run_dir)
        for event in events[self.events_seen:]:
            if event["event"] == "warning":
                console.warning(event["message"], out=self.out, rank=0)
            elif event["event"] in ("drain", "resizing"):
                console.info(event["event"], event["message"], out=self.out, rank=0)
            elif event["event"] == "resize":  # an elastic run's new group (raytrain.worker.elastic)
                console.info("resize", f"the run goes on on {event.get('workers')} workers (it had "
                             f"{event.get('previous')})", out=self.out, rank=0, workers=event.get("workers"),
                             previous=event.get("previous"))
            elif event["event"] == "replicas":  # torchft: the quorum's size changed (raytrain.worker.replicas)
                gone = event.get("participants", 0) < event.get("previous", 0)
                console.info("replicas", f"{'a replica is lost: ' if gone else ''}the run goes on with "
                             f"{event.get('participants')} replicas (it had {event.get('previous')}), at step "
                             f"{event.get('step')}", out=self.out, rank=0, participants=event.get("participants"),
                             previous=event.get("previous"))
            elif event["event"] == "healed":
                console.info("healed", f"rank {event.get('rank')}'s replacement healed from a live peer in "
                             f"{event.get('heal_s')} s and trains from epoch {event.get('epoch')}, step "
                             f"{event.get('step')}", out=self.out, rank=0, epoch=event.get("epoch"))
            elif event["event"] == "restored":
                at = f" (at step {event['step']} of epoch {event['epoch'] + 1})" if event.get("step") else ""
                console.info("restored", f"resuming after epoch {event['epoch']}{at} from {event['checkpoint']}",
                             out=self.out, rank=0, epoch=event["epoch"], step=event.get("step", 0),
                             checkpoint=event["checkpoint"])
        self.events_seen = len(events)
        fresh = [row for row in runrecords.read_metrics(self.run_dir) if self.key(row) not in self.printed]
        self.printed |= {self.key(row) for row in fresh}
        show_rows(fresh, self.run_dir, self.epochs, self.out, self.interactive)

    def stop(self) -> None:
        self.stopping.set()
        self.join(timeout=5)
        if self.interactive:
            self.out.write("\n")


# ----------------------------------------------------------------------------------------------------------
# the run


def root_cause(err: BaseException) -> str:
    """One line for the user out of Ray's nested errors: the innermost exception's last line; a full disk (ENOSPC,
    EDQUOT on a worker) as "the disk is full at DIR" (the worker's path: a shared volume's is the same here)."""

    while err.__cause__ is not None:
        err = err.__cause__
    if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
        where = os.path.dirname(os.fspath(err.filename)) if err.filename else None
        return (f"the disk is full at {where} ({err.strerror})" if where else f"the disk is full ({err.strerror})")
    lines = [line.strip() for line in str(err).strip().splitlines() if line.strip()]
    return lines[-1] if lines else err.__class__.__name__


def build_trainer(cfg: RunConfig, run_dir: Path, per_worker: dict[str, float], callbacks: tuple = (),
                  lease_token: Optional[int] = None, on_cluster: bool = False,
                  resize_timeout_s: float = elastic.CHECKPOINT_TIMEOUT_S, refresh_coordinator: bool = True,
                  worker_report_interval_ms: int = telemetry.WORKER_REPORT_INTERVAL_MS):
    """The TorchTrainer for one run (driver side: builds the Ray Datasets of a `data.loader: ray` config);
    `raytrain tune` adds its TuneReportCallback through `callbacks`; lease_token: the attempt (raytrain.rundir.lease) whose
    workers commit to run_dir; on_cluster: a joined cluster (its Prometheus should see the last epoch's metrics);
    worker_report_interval_ms: how often the workers on a cluster send their metrics
    (raytrain.worker.telemetry.WORKER_REPORT_INTERVAL_MS, or the user's RAY_metrics_report_interval_ms)."""
    import ray.train
    from ray.train.torch import TorchTrainer

    code_dir = runtimeenv.user_code_dir(cfg)
    s = cfg.scaling
    # An elastic run is Ray Train's own (raytrain.worker.elastic): num_workers=(min, max), and a controller callback that
    # checkpoints the running group before Ray Train resizes it (a Ray Train function checkpoints itself).
    elastic_args = {"num_workers": (s.min_workers, s.max_workers),
                    "elastic_resize_monitor_interval_s": s.elastic_resize_monitor_interval_s} if s.elastic else {}
    if s.elastic and lease_token and not loops.is_ray_train_loop(cfg):
        callbacks = (*callbacks, elastic.resize_checkpoint_callback(run_dir, lease_token, resize_timeout_s))
    if s.elastic:  # a restart after a drain starts on the nodes left at once (raytrain.worker.elastic)
        callbacks = (*callbacks, elastic.coordinator_callback(run_dir, lease_token, refresh=refresh_coordinator))
    # A worker whose process dies records no failure of its own: the controller's health check finds it
    callbacks = (*callbacks, workerdeaths.record_deaths_callback(run_dir, lease_token or 0))
    worker_env = {"RAY_metrics_report_interval_ms": str(int(worker_report_interval_ms))} if on_cluster else {}
    torch_config = None
    if s.torchft:
        # torchft's Rust side logs every quorum and commit at INFO to each worker's stderr otherwise
        worker_env["RUST_LOG"] = "warn"
        # Ray 2.60's torchft backend: a Lighthouse beside the controller, each worker its own replica group, and a
        # failed worker replaced alone while the others train on (raytrain.worker.replicas). Each replacement counts
        # against run.max_failures, as a restart does.
        torch_config = rayinternals.torchft_config(replicas.lighthouse_kwargs())
    return TorchTrainer(
        worker_entry,
        train_loop_config={"config": cfg.to_dict(), "run_dir": str(run_dir), "cpus_per_worker": per_worker["CPU"],
                           "working_dir": str(code_dir) if code_dir else None, "lease_token": lease_token,
                           "telemetry_linger": on_cluster},
        scaling_config=ray.train.ScalingConfig(**{
            "num_workers": s.num_workers, "use_gpu": s.use_gpu, "resources_per_worker": per_worker, **elastic_args}),
        run_config=ray.train.RunConfig(
            name=f"attempt-{lease_token or 0}",
            storage_path=ray_train_storage(run_dir),
            failure_config=ray.train.FailureConfig(max_failures=cfg.run.max_failures),
            callbacks=list(callbacks),
            # Ray Train merges these env_vars into the workers' runtime env (WorkerGroup._get_worker_runtime_env),
            # over the job's and the node's: the driver's setting is the one the workers (and their linger) use.
            worker_runtime_env={"env_vars": worker_env} if worker_env else None,
        ),
        datasets=dataprep.driver_datasets(cfg),
        dataset_config=dataset_config(cfg),
        torch_config=torch_config,
    )


def ray_train_storage(run_dir: Path) -> str:
    """Ray Train's own storage_path: nothing of the run's is kept there (raytrain commits its own checkpoints), so for
    a run on an object store it is a local directory rather than a second set of credentials for pyarrow's S3."""
    return str(storage.run_scratch(run_dir, layout.RAY_TRAIN_DIR))


def group_restarts(run_dir: Path, attempt: Optional[int]) -> int:
    """How many times Ray Train restarted this attempt's worker group: its groups' start events (one per group,
    written also by a group whose loop failed before its first step) but the first, less an elastic run's resizes
    (a grow is no failure)."""
    events = [e for e in runrecords.read_events(run_dir) if e.get("attempt") == attempt]
    starts = [e for e in events if e.get("event") == "start"]
    resized = [e for e in events if e.get("event") == "resizing"]
    return max(len(starts) - 1 - len(resized), 0)


def training_failed(err: BaseException, cfg: RunConfig, run_dir: Path, attempt: Optional[int] = None) -> str:
    """What trainer.fit()'s failure means, in one paragraph: Ray Train gave up after its worker-group restarts, or
    its controller failed (no restarts are counted for that)."""
    from ray.train import ControllerError

    if isinstance(err, ControllerError):
        what = "Ray Train's controller failed"
    else:
        what = (f"training failed after {group_restarts(run_dir, attempt)} worker-group restart(s) "
                f"({cfg.run.max_failures} allowed)")
    kept = (f"Checkpoints written so far are kept in {run_dir}; fix the cause and run the same command again to resume"
            if checkpoints.committed(run_dir) else
            f"No checkpoint was written ({run_dir}); fix the cause and run the same command again")
    return (f"{what}: {root_cause(err)}. {kept}. Which rank failed first, and why: raytrain why {run_dir} (each "
            f"rank's output is in {run_dir / layout.WORKER_LOGS_DIR}; Ray's own in its session logs).")


class RayTrainer:
    """Trains a run with Ray Train (see the module's doc)."""

    def __init__(self, cfg: RunConfig, address: Optional[str] = None, out: Optional[TextIO] = None,
                 in_submitted_job: bool = False, callbacks: tuple = (), owns_ray: bool = True,
                 per_worker: Optional[dict] = None, resize_timeout_s: float = elastic.CHECKPOINT_TIMEOUT_S,
                 refresh_coordinator: bool = True,
                 worker_report_interval_ms: int = telemetry.WORKER_REPORT_INTERVAL_MS):
        """owns_ray: this trainer connects to (or starts) Ray and shuts it down after; False inside a Ray Tune
        trial, whose Ray is the sweep's. per_worker: the resources each worker asks for (sized here if None).
        worker_report_interval_ms: see build_trainer."""
        self.cfg, self.address = cfg, address
        self.out = out if out is not None else sys.stdout  # now, not when this module was imported
        self.in_submitted_job, self.callbacks = in_submitted_job, callbacks
        self.owns_ray, self.per_worker = owns_ray, per_worker
        self.resize_timeout_s = resize_timeout_s  # an elastic run's wait for the checkpoint before a resize
        self.refresh_coordinator = refresh_coordinator  # see raytrain.worker.elastic.coordinator_callback
        self.worker_report_interval_ms = worker_report_interval_ms
        self.embedded_ray = owns_ray and not address

    def train(self, records: runrecords.Records) -> None:
        """in_submitted_job: this driver is a Ray job's entrypoint, whose runtime env already carries the user's
        code. Raises LaunchError when the run failed (Ray Train used up its restarts)."""
        from ray.train import ControllerError, TrainingFailedError

        cfg, run_dir = self.cfg, records.run_dir
        if self.owns_ray:
            connected = connect_for(cfg, self.address, self.in_submitted_job)
            console.info("connected", f"{connected}; run directory {run_dir}", out=self.out, run_dir=str(run_dir))
        # Sized against what an autoscaler can still add, waiting for it (scaleup.py), else the nodes up now.
        per_worker = self.per_worker or scaleup.size_on_cluster(cfg, alive_node_resources, out=self.out)
        if cfg.scaling.elastic:
            elastic.prepare(run_dir, records.control)
        trainer = build_trainer(cfg, run_dir, per_worker, callbacks=self.callbacks, lease_token=records.token,
                                on_cluster=self.address is not None, resize_timeout_s=self.resize_timeout_s,
                                refresh_coordinator=self.refresh_coordinator,
                                worker_report_interval_ms=self.worker_report_interval_ms)
        shape = ", ".join(f"{k} {v:g}" for k, v in per_worker.items())

        s = cfg.scaling
        shares = "/".join(str(cfg.batch_share(n)) for n in reversed(s.worker_counts))
        batch = (f"Ray Train function {cfg.loop.path}" if loops.is_ray_train_loop(cfg) else
                 f"global batch {cfg.train.batch_size} ({shares} per worker)")
        console.info("training", f"training {cfg.run.name}: {s.describe_workers()} workers x {{{shape}}}, "
                     f"{batch}", out=self.out,
                     num_workers=s.num_workers, per_worker=per_worker)
        if s.elastic:  # see raytrain.worker.elastic.ELASTIC_START_TIMEOUT_S; Ray Train hands it on to its controller
            os.environ.setdefault("RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S", elastic.ELASTIC_START_TIMEOUT_S)
        # Ray Train propagates this variable from the driver to its controller and workers.
        os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", CONTROLLER_POLL_INTERVAL_S)
        # A Ray Train function's reports count what it says (train.epochs is not its setting): no "of N".
        progress = Progress(run_dir, 0 if loops.is_ray_train_loop(cfg) else cfg.train.epochs, self.out, records.token)
        progress.start()
        # goodput's start-up phases: the launch (Ray, sizing, the trainer) ends here, the worker group's begins
        chosen = {"loader": cfg.data.loader, "loader_reason": cfg.data.loader_reason} \
            if cfg.data is not None and cfg.data.loader_reason else {}
        records.append_event("launch", attempt=records.token, **chosen)
        try:
            trainer.fit()
        except (TrainingFailedError, ControllerError) as err:  # Ray Train gave up; anything else is a bug
            raise LaunchError(training_failed(err, cfg, run_dir, records.token)) from None
        finally:
            progress.stop()
        # A worker that met a diverged loss ended its loop (no restart would help): the group "finished"
        diverged = [e for e in runrecords.read_events(run_dir)
                    if e.get("event") == "diverged" and e.get("attempt") == records.token]
        if diverged:
            raise AttemptEnded(Ending.FAILED, diverged[-1]["message"])

    def close(self) -> None:
        if not self.owns_ray:
            return
        try:
            import ray
        except ImportError:
            return
        if ray.is_initialized():
            ray.shutdown()


def dataset_config(cfg: RunConfig) -> "Optional[object]":
    """The TorchTrainer's DataConfig for a Ray Train function's run (None: Ray Train's default)."""
    if not loops.is_ray_train_loop(cfg) or loops.DATASETS_TO_SPLIT not in cfg.loop.kwargs:
        return None
    import ray.train

    return ray.train.DataConfig(datasets_to_split=cfg.loop.kwargs[loops.DATASETS_TO_SPLIT])
