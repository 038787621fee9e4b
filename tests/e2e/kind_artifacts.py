"""Checks of one kind e2e run from what scripts/kind-e2e copied out of the cluster, with the assertions the emulate
tier uses (tests/support/checks.py): only the Kubernetes plumbing differs between the tiers.

An artifact directory (ARTIFACTS/run1, ARTIFACTS/run2) holds:
    rayjob.yaml   `kubectl get rayjob NAME -o yaml` once KubeRay called the job finished
    run/          the run directory from the shared volume (config.yaml, metrics.jsonl, events.jsonl,
                  result.json, checkpoint_*), copied out of the head pod
    killed.json   run 2 only: the worker pod deleted, the epoch reached and the newest checkpoint at that moment

scripts/kind-e2e runs it after each RayJob; tests/e2e/test_kind.py runs the same checks again on the same files:
    python -m tests.e2e.kind_artifacts ARTIFACTS/run1 --epochs 60
    python -m tests.e2e.kind_artifacts ARTIFACTS/run2 --epochs 60 --killed-pod POD --epoch-before 7 \
        --newest-checkpoint-before 5 --interval 5
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

try:
    from tests.support import checks
except ImportError:  # run as a file, or by pytest without the repo root on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from tests.support import checks


def check_run(artifacts: Path, epochs: int) -> str:
    """The RayJob succeeded and the run on the shared volume is complete; where a worker pod was deleted
    (killed.json), the run resumed from the newest checkpoint it then had, losing at most one interval.
    Returns a one-line summary; raises AssertionError naming what is wrong."""
    artifacts = Path(artifacts)
    rayjob_file = artifacts / "rayjob.yaml"
    assert rayjob_file.is_file(), f"no RayJob status in {artifacts} (scripts/kind-e2e writes rayjob.yaml)"
    rayjob = yaml.safe_load(rayjob_file.read_text())
    checks.assert_job_succeeded(rayjob)
    run_dir = artifacts / "run"
    checks.assert_run_completed(run_dir, epochs)
    summary = f"{artifacts.name}: RayJob {rayjob['metadata']['name']} Complete/SUCCEEDED, {epochs} epochs, " \
              f"checkpoints at epochs {checks.checkpoint_epochs(run_dir)}"
    killed_file = artifacts / "killed.json"
    if killed_file.is_file():
        killed = json.loads(killed_file.read_text())
        resume = checks.assert_resumed(run_dir, newest_checkpoint_before=killed["newest_checkpoint_before"],
                                       epoch_before=killed["epoch_before"], interval=killed["interval"])
        summary += f"; worker pod {killed['pod']} deleted at epoch {killed['epoch_before']}, resumed from epoch " \
                   f"{resume['resumed_from_epoch']}"
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.e2e.kind_artifacts", description=__doc__.split("\n")[0])
    parser.add_argument("artifacts", type=Path)
    parser.add_argument("--epochs", type=int, required=True, help="train.epochs of the RayJob's run config")
    parser.add_argument("--killed-pod", help="the worker pod deleted mid-training (records killed.json)")
    parser.add_argument("--epoch-before", type=int, help="epochs in metrics.jsonl when the pod was deleted")
    parser.add_argument("--newest-checkpoint-before", type=int, help="newest checkpoint epoch at that moment")
    parser.add_argument("--interval", type=int, help="run.checkpoint_every")
    args = parser.parse_args(argv)
    if args.killed_pod:
        missing = [flag for flag, value in (("--epoch-before", args.epoch_before), ("--interval", args.interval),
                                            ("--newest-checkpoint-before", args.newest_checkpoint_before))
                   if value is None]
        if missing:
            parser.error(f"--killed-pod needs {', '.join(missing)}")
        (args.artifacts / "killed.json").write_text(json.dumps({
            "pod": args.killed_pod, "epoch_before": args.epoch_before,
            "newest_checkpoint_before": args.newest_checkpoint_before, "interval": args.interval}) + "\n")
    try:
        print(check_run(args.artifacts, args.epochs))
    except AssertionError as exc:
        print(f"kind e2e check failed for {args.artifacts}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
