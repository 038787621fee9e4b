"""The examples as a user runs them: copied into a directory outside the checkout and started from there with the
real CLI, on the embedded Ray or the session's shared Ray head, through `raytrain emulate` (the code shipped as the RayJob's working_dir) and by
`ray job submit --working-dir .` with the token, as from a laptop; each run writes the run contract, and the custom
loop's re-run with more epochs resumes through the Session API. Tiny epochs: the machine has 2 shared cores.

    .venv/bin/python -m pytest -m integration tests/integration/test_examples.py -v --durations=0
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

from tests.support import checks

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
RAYTRAIN = str(Path(sys.executable).parent / "raytrain")  # the installed CLI, as a user runs it
KIND_VALUES = REPO / "helm" / "raytrain-cluster" / "values-kind.yaml"


def project(tmp_path: Path, example: str) -> Path:
    """A copy of examples/<example> outside the checkout: nothing of the checkout but the installed raytrain."""
    dest = tmp_path / "project"
    shutil.copytree(EXAMPLES / example, dest)
    assert REPO not in dest.resolve().parents
    return dest


def raytrain(cwd: Path, *args: str, timeout: float = 600, env: dict | None = None) -> subprocess.CompletedProcess:
    done = subprocess.run([RAYTRAIN, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    assert done.returncode == 0, f"raytrain {' '.join(args)} exited {done.returncode}:\n" \
                                 f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def stored_config(run_dir: Path) -> dict:
    return yaml.safe_load((run_dir / "config.yaml").read_text())


def result_of(run_dir: Path) -> dict:
    return json.loads((run_dir / "result.json").read_text())


def assert_trains_then_resumes(cwd: Path, run_dir: Path, first: int, second: int, *options: str) -> None:
    """`raytrain run job.yaml` for `first` epochs, then again with --set train.epochs=`second`: the second run
    resumes from the first one's last checkpoint and records each epoch once."""
    raytrain(cwd, "run", "job.yaml", *options, "--set", f"train.epochs={first}")
    checks.assert_run_completed(run_dir, first)
    assert result_of(run_dir)["resumed_from_epoch"] is None
    raytrain(cwd, "run", "job.yaml", *options, "--set", f"train.epochs={second}")
    checks.assert_run_completed(run_dir, second)
    assert result_of(run_dir)["resumed_from_epoch"] == first
    assert checks.starts(run_dir)[-1]["start_epoch"] == first + 1


def test_custom_loop_example_trains_through_the_session_api_and_resumes(tmp_path, ray_head):
    """Both runs join the session's shared Ray head (tests/integration/conftest.py): the resume is the Session API's,
    whichever Ray runs it (the embedded one is the next test's)."""
    cwd = project(tmp_path, "custom-loop")
    options = ("--storage", str(tmp_path / "runs"), "--name", "loop", "--address", ray_head.address,
               "--set", "scaling.num_workers=2",
               "--set", "run.checkpoint_every=1", "--set", "loop.num_samples=64")
    run_dir = tmp_path / "runs" / "loop"
    assert_trains_then_resumes(cwd, run_dir, 2, 3, *options)
    assert stored_config(run_dir)["loop"]["_component_"] == "train_func.train_func"
    assert {"train_loss", "lr"} <= set(result_of(run_dir)["metrics"])


def test_a_project_with_its_own_training_module_keeps_both(tmp_path):
    """The package is imported as `raytrain`: a project's own `training.py` is the one `_component_: training.x`
    finds, even with the checkout (whose package folder is training/) on the import path."""
    cwd = tmp_path / "project"
    cwd.mkdir()
    (cwd / "training.py").write_text(
        "from torch import nn\n\n\n"
        "def regressor(hidden: int = 4) -> nn.Module:\n"
        "    return nn.Sequential(nn.Linear(1, hidden), nn.Tanh(), nn.Linear(hidden, 1))\n")
    (cwd / "job.yaml").write_text(yaml.safe_dump({
        "model": {"_component_": "training.regressor", "hidden": 6},
        "data": {"_component_": "linear", "num_samples": 64},
        "train": {"epochs": 1, "batch_size": 16},
        "scaling": {"num_workers": 1},
    }))
    # The checkout on the import path too, so that a `training` package (ours, the folder) really competes.
    competing = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    raytrain(cwd, "run", "job.yaml", "--storage", str(tmp_path / "runs"), env={**os.environ, "PYTHONPATH": competing})
    run_dir = tmp_path / "runs" / "job"
    checks.assert_run_completed(run_dir, 1)
    assert stored_config(run_dir)["model"] == {"_component_": "training.regressor", "hidden": 6}


def test_own_code_ships_as_the_rayjob_working_dir_through_emulate(tmp_path):
    """examples/own-code as `kubectl apply -k` would apply it (kustomization.yaml's ConfigMap holds the code), run
    by `raytrain emulate` on a local multi-node cluster: the modules reach the head and the workers only through
    the runtime env's working_dir."""
    cwd = project(tmp_path, "own-code")
    job = yaml.safe_load((cwd / "job.yaml").read_text())
    job["train"]["epochs"] = 1
    job["data"].update(n_train=128, n_val=64)
    job["run"]["checkpoint_every"] = 1
    (cwd / "job.yaml").write_text(yaml.safe_dump(job))
    shared = tmp_path / "shared"
    emulate = ("emulate", ".", "--values", str(KIND_VALUES), "--shared", str(shared))
    run_dir = shared / "runs" / "own-code"

    done = raytrain(cwd, *emulate, timeout=900)
    checks.assert_job_succeeded(checks.rayjob_from_emulate_output(done.stdout))
    checks.assert_run_completed(run_dir, 1)
    # The kind values' head holds 1 CPU: at least one of the 2 workers imported the modules on a worker node.
    assert any(n.startswith("worker") for n in checks.train_worker_nodes(done.stdout)), done.stdout[-3000:]
    assert stored_config(run_dir)["model"]["_component_"] == "my_models.TinyConvNet"


def test_a_laptop_submits_the_project_as_its_working_dir_with_the_token(tmp_path):
    """The README's laptop route against a token-auth Ray head (`raytrain cluster head`, a stand-in for the chart's
    head behind `kubectl port-forward`): without the token Ray refuses; with RAY_AUTH_MODE=token and RAY_AUTH_TOKEN,
    `ray job submit --working-dir .` ships the project and `raytrain run --address auto` trains it."""
    cwd = project(tmp_path, "own-code")
    node = Path(tempfile.mkdtemp(prefix="rt-laptop-"))  # short: Ray's socket paths live under it
    head = raytrain(tmp_path, "cluster", "head", "--temp-dir", str(node), "--num-cpus", "2", "--free-ports")
    try:
        address = re.search(r"dashboard (http://\S+)", head.stdout).group(1)
        submit = [str(Path(RAYTRAIN).with_name("ray")), "job", "submit", "--address", address, "--working-dir", ".",
                  "--", "raytrain", "run", "job.yaml", "--name", "laptop", "--storage", str(tmp_path / "runs"),
                  "--address", "auto", "--set", "train.epochs=1", "--set", "data.n_train=128"]
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
        refused = subprocess.run(submit, cwd=cwd, capture_output=True, text=True, timeout=120, env=env)
        assert refused.returncode != 0 and "Missing authentication token" in refused.stdout + refused.stderr
        env |= {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": (node / "auth_token").read_text().strip()}
        done = subprocess.run(submit, cwd=cwd, capture_output=True, text=True, timeout=600, env=env)
        assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
        run_dir = tmp_path / "runs" / "laptop"
        checks.assert_run_completed(run_dir, 1)
        # The example's own classes by import path (the own-code path on the embedded Ray is the `training.py`
        # test above; this run ships them as the job's working_dir).
        cfg = stored_config(run_dir)
        assert cfg["model"]["_component_"] == "my_models.TinyConvNet" and cfg["model"]["channels"] == 8
        assert cfg["data"]["_component_"] == "my_data.make_datasets"
        assert "val_accuracy" in result_of(run_dir)["metrics"]  # cross_entropy: classification metrics
    finally:
        raytrain(tmp_path, "cluster", "stop", str(node))
        shutil.rmtree(node, ignore_errors=True)
