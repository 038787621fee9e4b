"""`python -m bench [PART...] [--rounds N] [--out DIR] [--steps N] [--threads N] [--preset NAME]` (scripts/bench):
run the selected parts, print one JSON line per figure, write OUT/results.json, OUT/results.md, OUT/bench.png."""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Optional, TextIO

from bench.harness import ALL_PARTS, BenchSettings, Results, machine_info

EXIT_OK, EXIT_USAGE = 0, 2
CLUSTER_PARTS = ("p3", "scaling", "p4", "p4ft", "shrink", "e2e")  # in the order they run on the one local cluster


def build_parser() -> argparse.ArgumentParser:
    d = BenchSettings()
    parser = argparse.ArgumentParser(
        prog="scripts/bench", description="measure raytrain against raw PyTorch: throughput, the product's own loop, "
                                          "checkpoint reads, ingest, time to first step, recovery, sharded "
                                          "checkpoints and FSDP memory, scaling, GPU "
                                          "(JSON lines, results.json, bench.png)")
    parser.add_argument("parts", nargs="*", metavar="PART",
                        help=f"what to measure (default: all): {', '.join(ALL_PARTS)}")
    parser.add_argument("--rounds", type=int, default=d.rounds, help="interleaved rounds per figure (>= 1)")
    parser.add_argument("--out", default=d.out_dir, metavar="DIR", help="where results.json and bench.png go")
    parser.add_argument("--steps", type=int, default=d.steps, help="timed training steps per side and round")
    parser.add_argument("--threads", type=int, default=d.torch_threads, help="torch threads, the same on both sides")
    parser.add_argument("--preset", default=d.p3_preset, help="the config p3 and p4 run (smoke mode for p3)")
    return parser


def settings_from(argv: Optional[list[str]]) -> BenchSettings | str:
    """The settings the command line asks for, or the message that says what is wrong with it and the fix."""
    args = build_parser().parse_args(argv)
    unknown = [p for p in args.parts if p not in ALL_PARTS]
    if unknown:
        return f"unknown part(s) {', '.join(unknown)}. Fix: choose from {', '.join(ALL_PARTS)}, or none for all"
    if args.rounds < 1 or args.steps < 2 or args.threads < 1:
        return "--rounds and --threads must be >= 1 and --steps >= 2. Fix: e.g. --rounds 3 --steps 20"
    return BenchSettings(rounds=args.rounds, parts=tuple(args.parts or ALL_PARTS), out_dir=args.out,
                         steps=args.steps, torch_threads=args.threads, p3_preset=args.preset)


def main(argv: Optional[list[str]] = None) -> int:
    settings = settings_from(argv)
    if isinstance(settings, str):
        print(f"bench: {settings}", file=sys.stderr)
        return EXIT_USAGE
    return run_bench(settings)


def run_bench(s: BenchSettings, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    """Run the selected parts; print one JSON line per figure; write results.json, results.md and bench.png."""
    from bench.report import write_report

    machine = machine_info()
    results = Results(s, machine, out, err)
    results.log(f"{machine['cores']} cores ({machine['cpu']}), load average {machine['load_avg_at_start'][0]:.1f}; "
                f"{s.rounds} interleaved rounds; parts {', '.join(s.parts)}")
    work = Path(tempfile.mkdtemp(prefix="raytrain-bench-"))
    try:
        if "p1" in s.parts or "p2" in s.parts:
            from bench.throughput import bench_throughput

            results.attempt("p1_p2", lambda: results.emit(bench_throughput(s, work, results.log)))
        if "p1core" in s.parts:
            from bench.core import bench_core

            results.attempt("p1core", lambda: results.emit(bench_core(s, work, results.log)))
        if "ckptread" in s.parts:
            from bench.ckptread import bench_ckptread

            results.attempt("ckptread", lambda: results.emit(bench_ckptread(s, work, results.log)))
        if "p5" in s.parts:
            from bench.sharded import bench_sharded

            results.attempt("p5", lambda: results.emit(bench_sharded(s, work, results.log)))
        if any(p in s.parts for p in CLUSTER_PARTS):
            results.attempt("cluster", lambda: run_cluster_parts(s, work, results))
        if "gpu" in s.parts:
            from bench.gpu import bench_gpu

            results.attempt("gpu", lambda: results.emit(bench_gpu(s, work, results.log)))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    path = results.write()
    table, png = write_report(results.figures, machine, s, results.out_dir)
    results.log(f"results {path}, {table.name}, chart {png}")
    return EXIT_OK


def run_cluster_parts(s: BenchSettings, work: Path, results: Results) -> None:
    """p3, scaling, p4, shrink and e2e on one local cluster (started once: it takes a while), each part on its own."""
    from bench.cluster import bench_cluster
    from bench.e2e import bench_e2e
    from bench.first_step import bench_first_step
    from bench.recovery import bench_recovery
    from bench.replicas import bench_replicas
    from bench.scaling import bench_scaling
    from bench.shrink import bench_shrink

    parts = {"p3": bench_first_step, "scaling": bench_scaling, "p4": bench_recovery, "p4ft": bench_replicas,
             "shrink": bench_shrink, "e2e": bench_e2e}
    results.log("starting a local cluster: head (num-cpus 0) + 2 worker nodes, token auth")
    cluster = bench_cluster(work / "shared")
    try:
        for name in CLUSTER_PARTS:
            if name in s.parts:
                results.attempt(name, lambda part=parts[name]: results.emit(part(cluster, s, work, results.log)))
    finally:
        cluster.stop()
