"""examples/frameworks: PyTorch Lightning, a Hugging Face Transformers Trainer and Hugging Face Accelerate, each
written as Ray Train's own guide writes it, run by `raytrain run` unchanged on the session's shared Ray head, then run again
under the same name with one epoch more: the second run resumes through ray.train.get_checkpoint() from the
first one's newest committed checkpoint and records each report once. Each test is two short runs of 2 workers on
generated data (docs/guides/lightning.md, transformers.md, accelerate.md say what each adds and where the
framework limits it).

    .venv/bin/python -m pytest -m integration tests/integration/test_frameworks.py -v --durations=0
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
RAYTRAIN = str(Path(sys.executable).parent / "raytrain")  # the installed CLI, as a user runs it

# The framework (pyproject.toml's extra of that name, which the dev extra includes) and its example's config.
FRAMEWORKS = {"lightning": "lightning.yaml", "transformers": "transformers.yaml", "accelerate": "accelerate.yaml"}


def raytrain(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    done = subprocess.run([RAYTRAIN, *args], cwd=cwd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"raytrain {' '.join(args)} exited {done.returncode}:\n" \
                                 f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_framework_script_runs_unchanged_and_resumes_from_its_checkpoint(framework, tmp_path, ray_head):
    config = FRAMEWORKS[framework]
    project = tmp_path / "project"
    shutil.copytree(REPO / "examples" / "frameworks", project)
    storage, run_dir = tmp_path / "runs", tmp_path / "runs" / framework
    epochs_key = "loop.train_loop_config.epochs"

    # Both runs join the session's shared Ray head (tests/integration/conftest.py), as a driver joins a cluster
    head = ("--address", ray_head.address)
    raytrain(project, "run", config, "--name", framework, "--storage", str(storage), "--set", f"{epochs_key}=2", *head)
    first = json.loads((run_dir / "result.json").read_text())
    assert first["status"] == "succeeded" and first["resumed_from_epoch"] is None
    assert len(rows(run_dir)) == 2  # one row per report: one report per epoch
    committed = sorted(p.name for p in run_dir.glob("checkpoint_*"))
    assert committed, "each report carried a checkpoint: raytrain commits them into the run directory"

    raytrain(project, "run", config, "--name", framework, "--storage", str(storage), "--set", f"{epochs_key}=3", *head)
    second = json.loads((run_dir / "result.json").read_text())
    assert second["status"] == "succeeded" and second["attempt"] == 2
    assert second["resumed_from_epoch"] == first["epochs_completed"]  # from the first run's newest checkpoint
    epochs = [row["epoch"] for row in rows(run_dir)]
    assert len(epochs) == 3 and len(set(epochs)) == 3, f"each epoch reported once across both runs: {epochs}"
    assert [row["attempt"] for row in rows(run_dir)] == [1, 1, 2]  # the resumed run trained the third epoch only
    # Goodput's data wait, from the DataLoaders the framework iterates (raytrain.worker.loadertiming)
    assert all(row["timing"]["data_s"] > 0 for row in rows(run_dir)), rows(run_dir)
