"""The `raytrain` command: the only module that reads argv and the environment. One function per command.

Environment it reads:
  RAY_ADDRESS             when --address is not given: join that cluster (set for drivers of submitted Ray jobs)
  RAY_JOB_CONFIG_JSON_ENV_VAR  set by Ray for a submitted job's driver: the job's runtime env ships the user's code
  RAYTRAIN_KUBERAY_CRDS   directory holding the KubeRay v1.7.0 CRDs (validate, emulate); default: the
                          checkout's ../shared/kuberay-crds-v1.7.0
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Callable, Optional

from raytrain import __version__

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def _error(message: str) -> None:
    print(f"raytrain: error: {message}", file=sys.stderr, flush=True)


def _load(args: argparse.Namespace):
    from raytrain import workdir
    from raytrain.config import load_config

    # The user's modules (`_component_: my_models.Net`) resolve from the project directory, as `python train.py`.
    workdir.use(args.working_dir or os.getcwd())
    overrides = list(args.set or [])
    if args.name:
        overrides.append(f"run.name={args.name}")
    if args.storage:
        overrides.append(f"run.storage_path={args.storage}")
    return load_config(args.config, overrides, smoke=args.smoke_test)


def _address(args: argparse.Namespace) -> Optional[str]:
    return args.address or os.environ.get("RAY_ADDRESS") or None


def _report(outcome) -> int:
    result = outcome.result
    metrics = result.get("metrics", {})
    parts = [f"{result['status']}: {result['epochs_completed']} epochs"]
    for key in ("train_loss", "val_loss", "val_accuracy"):
        if key in metrics:
            parts.append(f"{key} {metrics[key]:.4f}")
    if "peak_rss_mb" in metrics:
        parts.append(f"peak worker RSS {metrics['peak_rss_mb']:.0f} MiB, {metrics['samples_per_s']:.0f} samples/s")
    if result.get("resumed_from_epoch") is not None:
        parts.append(f"resumed from epoch {result['resumed_from_epoch']}")
    parts.append(f"{result['duration_s']:.1f}s -> {outcome.run_dir}")
    print("raytrain: " + ", ".join(parts), flush=True)
    if not outcome.ok:
        _error(result.get("error", "training failed"))
        return EXIT_FAILED
    return EXIT_OK


def _in_submitted_job() -> bool:
    return "RAY_JOB_CONFIG_JSON_ENV_VAR" in os.environ


def cmd_run(args: argparse.Namespace) -> int:
    from raytrain.launcher import train

    return _report(train(_load(args), address=_address(args), in_submitted_job=_in_submitted_job()))


def cmd_local(args: argparse.Namespace) -> int:
    from raytrain.local import train_local

    return _report(train_local(_load(args)))


# ---------------------------------------------------------------------------------------------- tune, data


def cmd_tune(args: argparse.Namespace) -> int:
    from raytrain.tune import load_search, resolve_search_path, tune_run

    cfg = _load(args)
    search = load_search(resolve_search_path(args.search, args.config), smoke=args.smoke_test)
    summary = tune_run(cfg, search, address=_address(args), in_submitted_job=_in_submitted_job())
    for trial in summary["trials"]:
        params = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in trial["params"].items())
        score = trial["metrics"].get(search.metric)
        shown = f"{search.metric} {score:.4f}" if score is not None else f"error: {trial['error'] or 'no metric'}"
        print(f"raytrain: trial {trial['trial_id']}: {params}: {shown}", flush=True)
    if summary["status"] != "succeeded":
        _error(f"{summary['error']} under {summary['run_dir']}")
        return EXIT_FAILED
    best = summary["best"]
    params = ", ".join(f"{k}={v}" for k, v in best["params"].items())
    print(f"raytrain: best trial {best['trial_id']}: {params} ({search.metric} {best['metrics'][search.metric]:.4f}); "
          f"run it with: raytrain run {summary['best_config']}", flush=True)
    return EXIT_OK


def cmd_data(args: argparse.Namespace) -> int:
    """Stage a dataset ahead of training (on a machine with internet, or straight onto the shared volume)."""
    from raytrain.data import DataContext, DataUnavailable

    ctx = DataContext(root=Path(args.root).expanduser().absolute())
    try:
        if args.dataset == "mnist":
            from raytrain.data import mnist

            mnist.prepare(mnist.MNIST(download=True), ctx)
            print(f"raytrain: MNIST is in {ctx.root / 'MNIST'}", flush=True)
        else:
            from raytrain.data import cifar10

            p = cifar10.CIFAR10(synthetic=args.synthetic, synthetic_train=args.synthetic_train,
                                      synthetic_val=args.synthetic_val)
            cifar10.prepare(p, ctx)
            if not args.synthetic:
                print(f"raytrain: CIFAR-10 is in {ctx.root / 'cifar-10-batches-py'}", flush=True)
            if args.to_parquet:
                out = cifar10.to_parquet(p, ctx, Path(args.to_parquet).expanduser().absolute())
                print(f"raytrain: CIFAR-10{' (synthetic)' if args.synthetic else ''} as Parquet in {out}/{{train,val}}; "
                      f"train from it with --set data.parquet_dir={out}", flush=True)
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
    data.add_argument("dataset", choices=["cifar10", "mnist"])
    data.add_argument("--root", default="./runs/datasets", metavar="DIR",
                      help="datasets directory: <storage>/datasets of the runs that use it (default: ./runs/datasets)")
    data.add_argument("--to-parquet", metavar="DIR", help="cifar10: also write the Parquet form (for data.loader=ray)")
    data.add_argument("--synthetic", action="store_true", help="cifar10: generated CIFAR-shaped data (offline)")
    data.add_argument("--synthetic-train", type=int, default=50000, metavar="N")
    data.add_argument("--synthetic-val", type=int, default=10000, metavar="N")
    data.set_defaults(func=cmd_data)


def cmd_presets(args: argparse.Namespace) -> int:
    from raytrain.config import PRESETS_DIR, preset_names

    for name in preset_names():
        first = (PRESETS_DIR / f"{name}.yaml").read_text().splitlines()[0].lstrip("# ")
        print(f"{name:14s} {first}")
    return EXIT_OK


def _crd_dir(args: argparse.Namespace) -> Path:
    from raytrain.kube.schemas import default_crd_dir

    return Path(args.crds or os.environ.get("RAYTRAIN_KUBERAY_CRDS") or default_crd_dir())


def cmd_validate(args: argparse.Namespace) -> int:
    from raytrain.kube.validate import validate_paths

    problems = validate_paths([Path(p) for p in args.paths], _crd_dir(args),
                              values=Path(args.values) if args.values else None)
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    if problems:
        print(f"raytrain validate: {len(problems)} problem(s)", file=sys.stderr)
        return EXIT_FAILED
    print(f"raytrain validate: OK ({', '.join(args.paths)})")
    return EXIT_OK


def cmd_emulate(args: argparse.Namespace) -> int:
    from raytrain.kube.emulate import emulate

    return emulate(Path(args.rayjob), Path(args.values) if args.values else None, args.keep, _crd_dir(args),
                   shared_dir=Path(args.shared) if args.shared else None)


def cmd_bench(args: argparse.Namespace) -> int:
    from raytrain.bench import ALL_PARTS, BenchSettings, run_bench

    unknown = [p for p in args.parts if p not in ALL_PARTS]
    if unknown:
        _error(f"bench: unknown part(s) {', '.join(unknown)}. Fix: choose from {', '.join(ALL_PARTS)}, or none for all")
        return EXIT_USAGE
    if args.rounds < 1 or args.steps < 2 or args.threads < 1:
        _error("bench: --rounds and --threads must be >= 1 and --steps >= 2. Fix: e.g. --rounds 3 --steps 20")
        return EXIT_USAGE
    return run_bench(BenchSettings(rounds=args.rounds, parts=tuple(args.parts or ALL_PARTS), out_dir=args.out,
                                   steps=args.steps, torch_threads=args.threads, p3_preset=args.preset))


def add_bench_command(sub) -> None:
    from raytrain.bench import ALL_PARTS, BenchSettings

    d = BenchSettings()
    bench = sub.add_parser("bench", help="measure raytrain against raw PyTorch: throughput, ingest, time to first "
                                         "step, recovery, scaling (JSON lines, results.json, bench.png)")
    bench.add_argument("parts", nargs="*", metavar="PART",
                       help=f"what to measure (default: all): {', '.join(ALL_PARTS)}")
    bench.add_argument("--rounds", type=int, default=d.rounds, help="interleaved rounds per figure (>= 1)")
    bench.add_argument("--out", default=d.out_dir, metavar="DIR", help="where results.json and bench.png go")
    bench.add_argument("--steps", type=int, default=d.steps, help="timed training steps per side and round")
    bench.add_argument("--threads", type=int, default=d.torch_threads, help="torch threads, the same on both sides")
    bench.add_argument("--preset", default=d.p3_preset, help="the config p3 and p4 run (smoke mode for p3)")
    bench.set_defaults(func=cmd_bench)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="raytrain", description="Distributed PyTorch training with Ray Train, on KubeRay or a laptop."
    )
    parser.add_argument("--version", action="version", version=f"raytrain {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def config_command(name: str, func: Callable, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.add_argument("config", metavar="CONFIG", help="a run-config YAML file or a preset name (raytrain presets)")
        p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a key, e.g. train.lr=0.01")
        p.add_argument("--name", help="run name: the directory under the storage path (same name = resume)")
        p.add_argument("--storage", metavar="PATH", help="storage path for runs (on a cluster: the shared volume)")
        p.add_argument("--smoke-test", action="store_true", help="apply the config's smoke block: a seconds-long run")
        p.add_argument("--working-dir", metavar="DIR", help="your project's directory, where the config's "
                                                            "_component_ modules are imported from (default: the "
                                                            "current directory)")
        p.set_defaults(func=func)
        return p

    run = config_command("run", cmd_run, "train with Ray Train (embedded local Ray, or join a cluster)")
    run.add_argument("--address", help="Ray cluster to join, e.g. auto on a head pod (default: $RAY_ADDRESS, "
                                        "else start an embedded local Ray)")
    config_command("local", cmd_local, "train in one plain PyTorch process, no Ray (the baseline)")
    add_tune_and_data_commands(sub, config_command)

    presets = sub.add_parser("presets", help="list the built-in run configs")
    presets.set_defaults(func=cmd_presets)

    validate = sub.add_parser("validate", help="check values files, charts and manifests before they reach a cluster")
    validate.add_argument("paths", nargs="+", metavar="PATH")
    validate.add_argument("--crds", metavar="DIR", help="KubeRay CRD directory (default: $RAYTRAIN_KUBERAY_CRDS)")
    validate.add_argument("--values", metavar="VALUES.yaml",
                          help="chart values a clusterSelector RayJob's target cluster is rendered with "
                               "(default: the chart's values.yaml)")
    validate.set_defaults(func=cmd_validate)

    emulate = sub.add_parser("emulate", help="run a RayJob as KubeRay would, on a local multi-node Ray cluster")
    emulate.add_argument("rayjob", metavar="RAYJOB.yaml")
    emulate.add_argument("--values", metavar="VALUES.yaml", help="chart values for a clusterSelector RayJob")
    emulate.add_argument("--keep", action="store_true", help="leave the cluster running afterwards")
    emulate.add_argument("--shared", metavar="DIR", help="directory backing /mnt/shared (reuse it to resubmit a "
                                                         "job against an earlier emulation's runs)")
    emulate.add_argument("--crds", metavar="DIR", help="KubeRay CRD directory (default: $RAYTRAIN_KUBERAY_CRDS)")
    emulate.set_defaults(func=cmd_emulate)
    add_bench_command(sub)
    return parser


def main(argv: Optional[list[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    from raytrain.errors import UserError

    try:
        return args.func(args)
    except UserError as err:
        _error(str(err))
        return err.exit_code
    except KeyboardInterrupt:
        _error("interrupted; checkpoints written so far are kept, run the same command again to resume")
        return 130


if __name__ == "__main__":
    sys.exit(main())
