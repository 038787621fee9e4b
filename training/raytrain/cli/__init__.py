"""The `raytrain` command: the only module that reads argv and the environment. One function per command.

Environment it reads:
  RAYTRAIN_LOG_FORMAT     human (default) or json, when --log-format is not given (e.g. in a RayJob's entrypoint env)
  RAY_ADDRESS             when --address is not given: join that cluster (set for drivers of submitted Ray jobs)
  RAY_JOB_CONFIG_JSON_ENV_VAR  set by Ray for a submitted job's driver: the job's runtime env ships the user's code
  RAYTRAIN_KUBERAY_CRDS   directory holding the KubeRay v1.7.0 CRDs (validate, emulate) when --crds is not given;
                          without either, the user cache ${XDG_CACHE_HOME:-~/.cache}/raytrain/kuberay-crds-v1.7.0,
                          downloaded there once (validator/crds.py)
  RAYTRAIN_LEASE_TTL_S    run, local: seconds after its last renewal that a run's lease is taken over (default 30)
  RAYTRAIN_STOP_GRACE_S   run: seconds a stopping driver waits for its workers' last checkpoint (default 20)
  RAYTRAIN_RESIZE_CHECKPOINT_TIMEOUT_S  run, an elastic config: seconds Ray Train's resize waits for the running
                          group's checkpoint (default 120; raytrain.worker.elastic)
  RAYTRAIN_ELASTIC_REFRESH_COORDINATOR  run, an elastic config: 0 leaves Ray's AutoscalingCoordinator as Ray made
                          it (a restart after a drain then waits for its 20 s look at the nodes; default 1)
  RAYTRAIN_EMULATE_MAX_WORKER_NODES  emulate: the most worker nodes started (default one per CPU, at least 2)
  RAY_metrics_report_interval_ms  run, tune: how often a cluster run's workers report their metrics, in ms (given
                          to them in Ray Train's worker runtime env; default 1000: raytrain.worker.telemetry)
  RAY_TMPDIR              drain, when --temp-dir is not given: the `ray start --temp-dir` of the node to drain

Each command imports what it uses, when it runs: validate, render, emulate, presets, why and --help never import
torch.

May import: every room (each command imports what it uses when it runs)
"""

from __future__ import annotations

import argparse
import os
import sys
import textwrap
from pathlib import Path
from typing import Callable, Optional

from raytrain import __version__
from raytrain.errors import EXIT_FAILED, EXIT_USAGE, RaytrainError, UsageError
from raytrain.cli import cluster
from raytrain.rundir import console, storage, storagecheck
from raytrain.spec.run_options import add_address_option, add_config_options, add_lease_option, config_overrides

EXIT_OK = 0
# What `pip install 'raytrain[kube]'` adds (pyproject.toml): a missing one means the extra is not installed.
KUBE_EXTRA_MODULES = ("helm_python", "kubernetes_validate", "jsonschema")
LOG_FORMAT_HELP = "raytrain's console lines: human, or one JSON object each (default: $RAYTRAIN_LOG_FORMAT, else human)"


def _error(message: str) -> None:
    console.error(message)


def _load(args: argparse.Namespace, cfg=None):
    """The run's config (`cfg` when already loaded), with the console set up for the run (its driver-logs copy)."""
    from raytrain.rundir.runrecords import run_dir_of
    from raytrain.spec import workdir
    from raytrain.spec.config import load_config

    if cfg is None:
        # The user's modules (`_component_: my_models.Net`) resolve from the project directory, as `python train.py`.
        workdir.use(args.working_dir or os.getcwd())
        cfg = load_config(args.config, config_overrides(args.set, args.name, args.storage), smoke=args.smoke_test)
    console.configure(run=cfg.run.name)
    try:  # this attempt's lines beside the run: they outlive the pod that printed them
        console.keep_copy(run_dir_of(cfg.run.storage_path, cfg.run.name))
    except OSError as err:
        console.warning(f"the console lines are not kept in the run directory: {err}")
    return cfg


def _end_if_finished(args: argparse.Namespace) -> int | None:
    """`run` and `local` of a run with nothing left to train (raytrain.driver.runstart.nothing_to_train) end here,
    in about a second: its config read without importing torch or the user's code (raytrain's own components only),
    a look at its newest checkpoint, then the attempt that takes the lease (a running attempt still refuses this
    start), checks the resume, says so in one line and exits 0, without building anything or starting Ray. None: the
    start goes the whole way (a config with code of the user's, one this light reading cannot check, a run with
    something to train, also when the look under the lease finds that after all)."""
    from raytrain.driver.attempt import NotFinished, run_attempt
    from raytrain.driver.runstart import looks_finished
    from raytrain.spec import workdir
    from raytrain.spec.config import load_config

    workdir.use(args.working_dir or os.getcwd())
    try:
        cfg = load_config(args.config, config_overrides(args.set, args.name, args.storage), smoke=args.smoke_test,
                          import_user_code=False)
    except RaytrainError:
        return None  # the full load says what is wrong
    if cfg.unchecked or not looks_finished(cfg):
        return None
    cfg = _load(args, cfg)
    try:
        return run_attempt(cfg, None, _report, wait_for_lease=args.wait_for_lease, **_attempt_options())
    except NotFinished:
        return None


def _address(args: argparse.Namespace) -> Optional[str]:
    return args.address or os.environ.get("RAY_ADDRESS") or None


def _report(outcome) -> int:
    if outcome.nothing_to_train:  # a finished run started again: its one line, no result line of a training
        console.info("nothing_to_train", outcome.nothing_to_train, run_dir=str(outcome.run_dir),
                     checkpoint=outcome.result.get("checkpoint"), status=outcome.result.get("status"))
        return EXIT_OK
    result = outcome.result
    metrics = result.get("metrics", {})
    parts = [f"{result['status']}: {result['epochs_completed']} epochs"]
    number = lambda value: isinstance(value, (int, float)) and not isinstance(value, bool)  # noqa: E731
    for key in ("train_loss", "val_loss", "val_accuracy"):
        if key in metrics:  # null where it was NaN (a diverged run, whose error says so)
            parts.append(f"{key} {metrics[key]:.4f}" if number(metrics[key]) else f"{key} nan")
    if number(metrics.get("peak_rss_mb")) and number(metrics.get("samples_per_s")):
        parts.append(f"peak worker RSS {metrics['peak_rss_mb']:.0f} MiB, {metrics['samples_per_s']:.0f} samples/s")
    if result.get("resumed_from_epoch") is not None:
        parts.append(f"resumed from epoch {result['resumed_from_epoch']}")
    parts.append(f"{result['duration_s']:.1f}s -> {outcome.run_dir}")
    console.info("result", ", ".join(parts), **result)
    if not outcome.ok:
        _error(result.get("error", "training failed"))
        return EXIT_FAILED
    return EXIT_OK


def _in_submitted_job() -> bool:
    return "RAY_JOB_CONFIG_JSON_ENV_VAR" in os.environ


def _seconds_env(name: str, default: float) -> float:
    from raytrain.errors import ConfigError

    raw = os.environ.get(name, "")
    try:
        seconds = float(raw) if raw else default
    except ValueError:
        seconds = -1.0
    if not 1.0 <= seconds <= 3600.0:
        raise ConfigError(f"{name}={raw!r} is not a number of seconds from 1 to 3600. Fix: unset it "
                          f"(default {default:.0f}) or set e.g. {name}={default:.0f}.")
    return seconds


def _worker_report_interval_ms() -> int:
    """How often a cluster run's workers send their metrics: RAY_metrics_report_interval_ms as the user set it for
    the driver (Ray's own whole milliseconds), else raytrain's default (raytrain.worker.telemetry)."""
    from raytrain.errors import ConfigError
    from raytrain.worker.telemetry import WORKER_REPORT_INTERVAL_MS

    raw = os.environ.get("RAY_metrics_report_interval_ms", "").strip()
    if not raw:
        return WORKER_REPORT_INTERVAL_MS
    if not raw.isdigit() or not 100 <= int(raw) <= 3_600_000:
        raise ConfigError(f"RAY_metrics_report_interval_ms={raw!r} is not a whole number of milliseconds from 100 to "
                          f"3600000. Fix: unset it (raytrain's workers then report every {WORKER_REPORT_INTERVAL_MS} "
                          f"ms) or set e.g. RAY_metrics_report_interval_ms=10000.")
    return int(raw)


def _lease_ttl_s() -> float:
    from raytrain.rundir.lease import DEFAULT_TTL_S

    return _seconds_env("RAYTRAIN_LEASE_TTL_S", DEFAULT_TTL_S)


def _attempt_options() -> dict:
    from raytrain.driver.attempt import STOP_GRACE_S

    return {"lease_ttl_s": _lease_ttl_s(), "stop_grace_s": _seconds_env("RAYTRAIN_STOP_GRACE_S", STOP_GRACE_S)}


def cmd_run(args: argparse.Namespace) -> int:
    from raytrain.driver.attempt import run_attempt
    from raytrain.driver.raytrainer import RayTrainer
    from raytrain.worker.elastic import CHECKPOINT_TIMEOUT_S

    # Ray's C++ failure-signal handler catches SIGTERM in the driver, dumps a stack and aborts (exit 134) before the
    # attempt can end cleanly; it reads this when Ray is first imported, so before anything else. (Ray's processes
    # inherit it: a crash there is still reported by Ray.)
    os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")
    finished = _end_if_finished(args)
    if finished is not None:
        return finished
    cfg = _load(args)
    trainer = RayTrainer(cfg, _address(args), in_submitted_job=_in_submitted_job(),
                         resize_timeout_s=_seconds_env("RAYTRAIN_RESIZE_CHECKPOINT_TIMEOUT_S", CHECKPOINT_TIMEOUT_S),
                         refresh_coordinator=os.environ.get("RAYTRAIN_ELASTIC_REFRESH_COORDINATOR", "1") != "0",
                         worker_report_interval_ms=_worker_report_interval_ms())
    return run_attempt(cfg, trainer, _report, wait_for_lease=args.wait_for_lease, **_attempt_options())


def cmd_local(args: argparse.Namespace) -> int:
    from raytrain.driver.attempt import run_attempt
    from raytrain.driver.localtrainer import LocalTrainer
    from raytrain.driver.preflight import check_local_gpu
    from raytrain.spec.loops import local_refusal

    finished = _end_if_finished(args)
    if finished is not None:
        return finished
    cfg = _load(args)
    refusal = local_refusal(cfg)
    if refusal is not None:
        raise UsageError(refusal)
    check_local_gpu(cfg)
    return run_attempt(cfg, LocalTrainer(cfg), _report, wait_for_lease=args.wait_for_lease, **_attempt_options())


# ---------------------------------------------------------------------------------------------- tune, data


def cmd_tune(args: argparse.Namespace) -> int:
    from raytrain.driver.tune import load_search, resolve_search_path, tune_run

    os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")  # as for `run`: a SIGTERM ends it cleanly
    cfg = _load(args)
    search = load_search(resolve_search_path(args.search, args.config), smoke=args.smoke_test)
    summary = tune_run(cfg, search, address=_address(args), out=sys.stdout, in_submitted_job=_in_submitted_job(),
                       worker_report_interval_ms=_worker_report_interval_ms())
    for trial in summary["trials"]:
        params = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in trial["params"].items())
        score = trial["metrics"].get(search.metric)
        shown = f"{search.metric} {score:.4f}" if score is not None else f"error: {trial['error'] or 'no metric'}"
        console.info("trial", f"trial {trial['trial_id']}: {params}: {shown}", **trial)
    if summary["status"] != "succeeded":
        _error(f"{summary['error']} under {summary['run_dir']}")
        return EXIT_FAILED
    best = summary["best"]
    params = ", ".join(f"{k}={v}" for k, v in best["params"].items())
    console.info("best_trial", f"best trial {best['trial_id']}: {params} ({search.metric} "
                 f"{best['metrics'][search.metric]:.4f}); run it with: raytrain run {summary['best_config']}",
                 best_config=summary["best_config"], **best)
    return EXIT_OK


def cmd_data(args: argparse.Namespace) -> int:
    """Stage a dataset ahead of training (on a machine with internet, or straight onto the shared volume)."""
    from raytrain.data import DataContext, DataUnavailable

    ctx = DataContext(root=Path(args.root).expanduser().absolute())
    try:
        if args.dataset == "mnist":
            from raytrain.data import mnist

            mnist.prepare(mnist.MNIST(download=True), ctx)
            console.info("data", f"MNIST is in {ctx.root / 'MNIST'}")
        else:
            from raytrain.data import cifar10

            p = cifar10.CIFAR10(synthetic=args.synthetic, synthetic_train=args.synthetic_train,
                                      synthetic_val=args.synthetic_val)
            cifar10.prepare(p, ctx)
            if not args.synthetic:
                console.info("data", f"CIFAR-10 is in {ctx.root / 'cifar-10-batches-py'}")
            if args.to_parquet:
                out = cifar10.to_parquet(p, ctx, Path(args.to_parquet).expanduser().absolute())
                console.info("data", f"CIFAR-10{' (synthetic)' if args.synthetic else ''} as Parquet in "
                             f"{out}/{{train,val}}; train from it with --set data.parquet_dir={out}")
    except DataUnavailable as err:
        _error(str(err))
        return EXIT_FAILED
    return EXIT_OK


def add_tune_and_data_commands(sub, config_command: Callable) -> None:
    tune = config_command("tune", cmd_tune, "Ray Tune over Ray Train runs of a config: trials, best config")
    tune.add_argument("--search", metavar="SEARCH.yaml", help="search space, metric, mode, num_samples "
                                                               "(default: the preset's own, e.g. text-rnn/search.yaml)")
    tune.add_argument("--address", help="Ray cluster to join (default: $RAY_ADDRESS, else an embedded local Ray)")

    data = sub.add_parser("data", help="download/stage a dataset ahead of training (cifar10, mnist)")
    data.add_argument("dataset", choices=["cifar10", "mnist"], help="the dataset to stage")
    data.add_argument("--root", default="./runs/datasets", metavar="DIR",
                      help="datasets directory: <storage>/datasets of the runs that use it (default: ./runs/datasets)")
    data.add_argument("--to-parquet", metavar="DIR", help="cifar10: also write the Parquet form (for data.loader=ray)")
    data.add_argument("--synthetic", action="store_true", help="cifar10: generated CIFAR-shaped data (offline)")
    data.add_argument("--synthetic-train", type=int, default=50000, metavar="N", help="--synthetic: training images")
    data.add_argument("--synthetic-val", type=int, default=10000, metavar="N", help="--synthetic: validation images")
    data.set_defaults(func=cmd_data)


def cmd_report(args: argparse.Namespace) -> int:
    import json

    from raytrain.driver.report import ReportError, report, why_command
    from raytrain.rundir import goodput

    try:
        run_dirs = [storagecheck.check_reachable(storage.as_path(p), "raytrain report") for p in args.run_dirs]
        loaded, png, page = report(run_dirs, Path(args.out) if args.out else None)
    except ReportError as err:
        _error(f"report: {err}")
        return EXIT_USAGE
    if args.json:  # one object and nothing else on stdout, for machines
        print(json.dumps({"png": str(png), "html": str(page), "runs": [
            {"run": run.name, "run_dir": str(run.run_dir), "status": run.result["status"] if run.result else None,
             "goodput": run.goodput.to_dict(), "why": why_command(run)} for run in loaded]}, indent=2))
        return EXIT_OK
    for run in loaded:
        console.info("goodput", f"where the time of {run.name} went:\n" + "\n".join(goodput.table(run.goodput)),
                     run_dir=str(run.run_dir), **run.goodput.to_dict())
    for run in loaded:
        if not run.rows:
            console.info("report", f"report: {run.run_dir} has no metrics yet (no epoch finished); drawn empty")
    console.info("report", f"report of {len(loaded)} run(s): {png} and {page}", png=str(png), html=str(page))
    for run in loaded:
        console.info("report", f"why each attempt of {run.name} ended: {why_command(run)}", command=why_command(run))
    return EXIT_OK


def cmd_why(args: argparse.Namespace) -> int:
    """Why each attempt of a run ended, from its records alone (raytrain.rundir.postmortem)."""
    import json

    from raytrain.rundir import postmortem

    found = postmortem.why(storagecheck.run_dir_for(args.run_dir, "raytrain why"))
    print(json.dumps(found, indent=2) if args.json else postmortem.render(found))
    return EXIT_OK


def cmd_track(args: argparse.Namespace) -> int:
    """Send a run's trackers (run.tracking) what they miss: after the tracker was down at a run's end."""
    from raytrain.driver.tracking import track
    from raytrain.rundir.runcontrol import RunControl

    run_dir = storagecheck.run_dir_for(args.run_dir, "raytrain track")
    if not run_dir.is_dir():
        raise UsageError(f"track: {run_dir} is not a run directory. Fix: give STORAGE/NAME of a run, e.g. runs/linear.")
    # Under the run's lease: an attempt that is training sends its own points, and a later one continues from these.
    control = RunControl.acquire(run_dir, _lease_ttl_s(), wait=args.wait_for_lease,
                                 notify=lambda message: console.info("attempt", message))
    try:
        held = track(run_dir, control)
    finally:
        control.close("raytrain track ended")
        control.release()
    console.info("track", "; ".join(f"{name} holds epochs up to {epoch}" for name, epoch in held.items()) +
                 f" of {run_dir}", run_dir=str(run_dir), **held)
    return EXIT_OK


def cmd_export(args: argparse.Namespace) -> int:
    from raytrain.checkpoint.export import export

    run_dir = storagecheck.run_dir_for(args.run_dir, "raytrain export")
    source, out = export(run_dir, Path(args.out) if args.out else None)
    console.info("export", f"exported {source.name} to {out}", checkpoint=str(source), file=str(out))
    return EXIT_OK


def cmd_presets(args: argparse.Namespace) -> int:
    from raytrain.spec.config import preset_names, preset_summary

    for name in preset_names():
        print(textwrap.fill(f"{name:14s} {preset_summary(name)}", width=110, subsequent_indent=" " * 15,
                            break_on_hyphens=False))
    return EXIT_OK


def _crd_dir(args: argparse.Namespace) -> Path:
    """--crds, else $RAYTRAIN_KUBERAY_CRDS, else the user cache (fetched once); CRDError (exit 2) says how to stage."""
    from raytrain.validator.crds import CRDS_ENV, resolve_crd_dir

    return resolve_crd_dir(args.crds, os.environ.get(CRDS_ENV))


def _feature_gates(flag: str):
    """--feature-gates as the KubeRay operator reads it; a bad one is a usage error naming the flag."""
    from raytrain.validator.kuberay import FeatureGateError, FeatureGates

    try:
        return FeatureGates.parse(flag)
    except FeatureGateError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def cmd_validate(args: argparse.Namespace) -> int:
    from raytrain.validator.validate import validate_paths

    found = validate_paths([Path(p) for p in args.paths], _crd_dir(args),
                           values=Path(args.values) if args.values else None,
                           chart=Path(args.chart) if args.chart else None, gates=args.feature_gates,
                           kueue_queues=Path(args.kueue_queues) if args.kueue_queues else None)
    errors = [p for p in found if p.is_error]
    for problem in found:
        print(f"{'error' if problem.is_error else 'note'}: {problem}", file=sys.stderr)
    if errors:
        print(f"raytrain validate: {len(errors)} problem(s)", file=sys.stderr)
        return EXIT_FAILED
    print(f"raytrain validate: OK ({', '.join(args.paths)})")
    return EXIT_OK


def cmd_emulate(args: argparse.Namespace) -> int:
    from raytrain.cluster.emulate import emulate

    return emulate(Path(args.rayjob), Path(args.values) if args.values else None, args.keep, _crd_dir(args),
                   shared_dir=Path(args.shared) if args.shared else None, max_worker_nodes=_emulated_worker_nodes())


def _emulated_worker_nodes() -> Optional[int]:
    """RAYTRAIN_EMULATE_MAX_WORKER_NODES: the most worker nodes `raytrain emulate` starts (None: one per CPU)."""
    raw = os.environ.get("RAYTRAIN_EMULATE_MAX_WORKER_NODES", "").strip()
    if not raw:
        return None
    if not raw.isdigit() or not 1 <= int(raw) <= 64:
        raise UsageError(f"RAYTRAIN_EMULATE_MAX_WORKER_NODES={raw!r} is not a count of worker nodes from 1 to 64. "
                         f"Fix: unset it (one node per CPU of this machine, at least 2) or set e.g. 3.")
    return int(raw)


def cmd_drain(args: argparse.Namespace) -> int:
    """A Ray pod's preStop hook: drain this node, stop its raytrain drivers gracefully, wait for them (drain.py)."""
    from raytrain.worker.prestop import container_log, drain

    log = container_log()  # kubelet keeps no hook output: `kubectl logs` shows these lines only through it

    def say(line: str) -> None:
        console.info("drain", line)
        if log is not None:
            console.info("drain", f"preStop: {line}", out=log)

    # --temp-dir, else the node's own $RAY_TMPDIR (a preStop hook runs with the container's environment)
    temp_dir = args.temp_dir or os.environ.get("RAY_TMPDIR") or None
    outcome = drain(args.wait, temp_dir=temp_dir, say=say)
    return EXIT_OK if outcome["ended"] else EXIT_FAILED


def add_drain_command(sub) -> None:
    drain = sub.add_parser(
        "drain", help="a Ray pod's preStop hook: checkpoint and stop the training on this node before kubelet's SIGTERM",
        description="Run on a Ray node about to go away (the chart's and the standalone RayJob's preStop hook): marks "
                    "this worker node DRAINING in Ray's GCS (no new work; the workers checkpoint at their next step "
                    "and the run goes on elsewhere), sends SIGTERM to the raytrain run/tune drivers on this node "
                    "(they checkpoint and stop), and waits until the training here has ended. Exit 1 when it still "
                    "runs after --wait.")
    drain.add_argument("--wait", type=float, default=50.0, metavar="SECONDS",
                       help="wait at most this long (keep it below the pod's terminationGracePeriodSeconds, leaving "
                            "`ray start` time to stop; default 50, for the chart's 60)")
    drain.add_argument("--temp-dir", default=None, metavar="DIR",
                       help="this node's `ray start --temp-dir`, only where several Ray nodes share one machine "
                            "(default: $RAY_TMPDIR; a pod has one node)")
    drain.set_defaults(func=cmd_drain)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="raytrain", description="Distributed PyTorch training with Ray Train, on KubeRay or a laptop."
    )
    parser.add_argument("--version", action="version", version=f"raytrain {__version__}")
    parser.add_argument("--log-format", choices=console.FORMATS, default=argparse.SUPPRESS, help=LOG_FORMAT_HELP)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def config_command(name: str, func: Callable, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text)
        add_config_options(p)
        p.set_defaults(func=func)
        return p

    run = config_command("run", cmd_run, "train with Ray Train (embedded local Ray, or join a cluster)")
    add_address_option(run)
    add_lease_option(run)
    local = config_command("local", cmd_local, "train in one plain PyTorch process, no Ray (the baseline)")
    add_lease_option(local)
    add_tune_and_data_commands(sub, config_command)

    report = sub.add_parser("report", help="plot runs: loss, accuracy, throughput, restarts, goodput, summary "
                                           "(PNG + HTML)")
    report.add_argument("run_dirs", nargs="+", metavar="RUN_DIR",
                        help="STORAGE/NAME of a run; several compare runs; a `raytrain tune` directory stands for its trials")
    report.add_argument("--out", metavar="FILE.png", help="the PNG (the HTML page goes beside it; default: "
                                                          "RUN_DIR/report.png for one directory, else ./report.png)")
    report.add_argument("--json", action="store_true", help="one JSON object (each run's goodput by cause, the "
                                                            "files written), for machines")
    report.set_defaults(func=cmd_report)

    why = sub.add_parser("why", help="why each attempt of a run ended: the rank that failed first, its node, "
                                     "exception and last lines, from the run's records (after its pods are gone)",
                         description="A post-mortem of a run from the records it keeps in its directory or bucket "
                                     "(results, events, every rank's log and failure record under worker-logs/), so "
                                     "it works after the pods, the Ray cluster and the driver are gone: for each "
                                     "attempt, how it ended, the rank that failed first (its node, exception, "
                                     "traceback and last lines of output) and the ranks that failed after it.")
    why.add_argument("run_dir", metavar="RUN_DIR", help="STORAGE/NAME of a run (a directory, or s3://, gs://)")
    why.add_argument("--json", action="store_true", help="one JSON object, for machines")
    why.set_defaults(func=cmd_why)

    track = sub.add_parser("track", help="send a run's experiment trackers (run.tracking: MLflow, W&B) the metrics "
                                         "they miss, e.g. after the tracker was down when the run ended")
    track.add_argument("run_dir", metavar="RUN_DIR", help="STORAGE/NAME of a run")
    add_lease_option(track)
    track.set_defaults(func=cmd_track)

    export = sub.add_parser("export", help="the newest checkpoint's model as one file for serving (sharded ones "
                                           "consolidated)")
    export.add_argument("run_dir", metavar="RUN_DIR", help="STORAGE/NAME of a run")
    export.add_argument("--out", metavar="FILE.pt", help="default: RUN_DIR/exported/model_epoch<E>[_step<S>].pt")
    export.set_defaults(func=cmd_export)

    presets = sub.add_parser("presets", help="list the built-in run configs")
    presets.set_defaults(func=cmd_presets)

    validate = sub.add_parser("validate", help="check values files, charts and manifests before they reach a cluster")
    validate.add_argument("paths", nargs="+", metavar="PATH",
                          help="values files, charts, kustomization directories and manifests")
    validate.add_argument("--crds", metavar="DIR", help="KubeRay CRD directory (default: $RAYTRAIN_KUBERAY_CRDS); "
                          "other operators' CRD files in it check their kinds too")
    validate.add_argument("--values", metavar="VALUES.yaml",
                          help="chart values a clusterSelector RayJob's target cluster is rendered with "
                               "(default: the chart's values.yaml); may live anywhere")
    validate.add_argument("--chart", metavar="DIR", help="the chart that --values and values files given as PATH "
                                                         "belong to (default: their own folder if it holds a chart, "
                                                         "else helm/raytrain-cluster)")
    validate.add_argument("--feature-gates", metavar="GATE=BOOL,...", type=_feature_gates,
                          help="the KubeRay operator's --feature-gates, e.g. RayClusterNetworkPolicy=true "
                               "(default: KubeRay v1.7.0's defaults)")
    validate.add_argument("--kueue-queues", metavar="QUEUES.yaml",
                          help="Kueue ClusterQueues and LocalQueues: a RayJob or RayCluster labelled "
                               "kueue.x-k8s.io/queue-name is checked against its ClusterQueue's quota")
    validate.set_defaults(func=cmd_validate)

    emulate = sub.add_parser("emulate", help="run a RayJob as KubeRay would, on a local multi-node Ray cluster")
    emulate.add_argument("rayjob", metavar="RAYJOB.yaml", help="a RayJob with its ConfigMaps, or a kustomization "
                         "directory (rendered with `kubectl kustomize`)")
    emulate.add_argument("--values", metavar="VALUES.yaml", help="chart values for a clusterSelector RayJob")
    emulate.add_argument("--keep", action="store_true", help="leave the cluster running afterwards")
    emulate.add_argument("--shared", metavar="DIR", help="directory backing /mnt/shared (reuse it to resubmit a "
                                                         "job against an earlier emulation's runs)")
    emulate.add_argument("--crds", metavar="DIR", help="KubeRay CRD directory (default: $RAYTRAIN_KUBERAY_CRDS)")
    emulate.set_defaults(func=cmd_emulate)
    cluster.add_cluster_command(sub)
    add_drain_command(sub)
    for command in sub.choices.values():  # after the command too, as `raytrain run digits --log-format json`
        command.add_argument("--log-format", choices=console.FORMATS, default=argparse.SUPPRESS, help=LOG_FORMAT_HELP)
    return parser


def main(argv: Optional[list[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    log_format = getattr(args, "log_format", None) or os.environ.get("RAYTRAIN_LOG_FORMAT") or "human"
    if log_format not in console.FORMATS:
        _error(f"RAYTRAIN_LOG_FORMAT={log_format!r} is not one of {', '.join(console.FORMATS)}. "
               f"Fix: set it to json or human, or unset it")
        return EXIT_USAGE
    console.configure(log_format)
    error: Optional[BaseException] = None  # the paragraph the command ended with, if any
    try:
        return args.func(args)
    except RaytrainError as err:
        error = err
        _error(str(err))
        return err.exit_code
    except ModuleNotFoundError as err:
        if (err.name or "").split(".")[0] not in KUBE_EXTRA_MODULES:
            raise
        _error(f"`raytrain {args.command}` needs raytrain's Kubernetes tooling (the Helm library, the Kubernetes "
               f"schemas and a JSON-schema validator), which this installation lacks: the module '{err.name}' is "
               "missing. Fix: pip install 'raytrain[kube]' (into the same environment as raytrain), then run the "
               "command again.")
        return EXIT_USAGE
    except KeyboardInterrupt:
        error = KeyboardInterrupt()
        _error("interrupted; checkpoints written so far are kept, run the same command again to resume")
        return 130
    finally:
        console.stop_copy(error)
