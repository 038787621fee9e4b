"""The `raytrain` command on bad input: one clear paragraph on stderr, a non-zero exit, never a traceback.
These cases fail before Ray starts, so they run in the unit tier, in this process (the `raytrain` fixture calls
main() as the console script does: tests/conftest.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("args, exit_code, fragment", [
    (["run", "no-such-preset"], 2, "neither a YAML file nor a preset"),
    (["run", "linear", "--set", "train.epochs=0"], 2, "train.epochs"),
    (["run", "linear", "--set", "train.batch_size=25"], 2, "does not split evenly over 3 workers"),
    (["local", "linear", "--set", "model.widht=3"], 2, "unknown key 'model.widht'"),
    (["run", "linear", "--set", "scaling.cpus_per_worker=0"], 2, "scaling.cpus_per_worker"),
    (["run", "linear", "--set", "train.lr=nan"], 2, "--set train.lr=nan: train.lr: 'nan' is not allowed (Input should be a finite number)"),
    (["run", "linear", "--set", "model.hidden=-1"], 2, "--set model.hidden=-1: model.hidden: -1 is not allowed"),
    (["run", "linear", "--name", ""], 2, "--name '': is empty"),
    (["local", "linear", "--name", "a/b"], 2, "--name a/b: run.name: 'a/b' cannot name a run directory"),
])
def test_bad_input_gives_one_clear_error(raytrain, args, exit_code, fragment, tmp_path):
    done = raytrain(*args, "--storage", str(tmp_path))
    assert done.returncode == exit_code, done.stderr
    assert done.stderr.startswith("raytrain: error: ") and fragment in done.stderr, done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    assert not (tmp_path / "linear").exists()  # rejected before anything was written


def test_an_empty_storage_path_is_refused_not_ignored(raytrain, tmp_path):
    done = raytrain("run", "linear", "--storage", "", cwd=tmp_path)
    assert done.returncode == 2 and "--storage '': is empty" in done.stderr, done.stderr
    assert not (tmp_path / "runs").exists()


def test_missing_data_fails_fast_with_how_to_stage_it(raytrain, tmp_path):
    done = raytrain("run", "mnist", "--storage", str(tmp_path), "--set", "data.download=false")
    assert done.returncode == 1
    assert "MNIST is not available" in done.stderr and "copy the files" in done.stderr
    assert "Traceback" not in done.stderr + done.stdout


def test_presets_and_version(raytrain):
    assert "linear" in raytrain("presets").stdout
    version = raytrain("--version")
    assert version.returncode == 0 and version.stdout.startswith("raytrain ")


def test_local_linear_trains_and_writes_the_run_files(raytrain, tmp_path):
    done = raytrain("local", "linear", "--storage", str(tmp_path), "--name", "loc", "--set", "train.epochs=30")
    assert done.returncode == 0, done.stderr
    result = json.loads((tmp_path / "loc" / "result.json").read_text())
    assert result["status"] == "succeeded" and result["epochs_completed"] == 30
    assert result["resumed_from_epoch"] is None
    assert result["metrics"]["train_loss"] <= 0.09
    assert (tmp_path / "loc" / "config.yaml").is_file()


def test_a_diverged_run_fails_in_one_line_and_its_exit_status_agrees_with_its_result(raytrain, tmp_path):
    """A NaN loss (issue 40, item 7): the run is `failed` with the reason, exit 1 as result.json says, no traceback;
    no checkpoint of NaN weights is written, and the same run resumes with a lower learning rate."""
    done = raytrain("local", "linear", "--storage", str(tmp_path), "--name", "nan", "--set", "train.lr=1e30",
                    "--set", "train.epochs=2")
    result = json.loads((tmp_path / "nan" / "result.json").read_text())
    assert done.returncode == 1 and result["status"] == "failed", done.output
    assert "Traceback" not in done.output
    diverged = [line for line in done.output.splitlines() if "diverged at" in line]
    assert len(diverged) == 1 and "training diverged at epoch 1: train_loss" in diverged[0], done.output
    assert "lower train.lr (it is 1e+30)" in diverged[0] and result["error"] in diverged[0]
    assert not list((tmp_path / "nan").glob("checkpoint_*"))
    again = raytrain("local", "linear", "--storage", str(tmp_path), "--name", "nan", "--set", "train.epochs=2")
    result = json.loads((tmp_path / "nan" / "result.json").read_text())
    assert again.returncode == 0 and result["status"] == "succeeded", again.output
    assert [row["epoch"] for row in map(json.loads, (tmp_path / "nan" / "metrics.jsonl").read_text().splitlines())
            ] == [1, 2]


# A Python without the [kube] extra, in a fresh process (this one has imported the extra's modules already): a
# finder in front of the others refuses its modules, as an environment that never installed them would (the extra's
# packages are installed here, so they are hidden, not removed).
WITHOUT_KUBE_EXTRA = """
import sys
from importlib.abc import MetaPathFinder

class Absent(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("helm_python", "kubernetes_validate", "jsonschema"):
            raise ModuleNotFoundError(f"No module named '{name}'", name=name)
        return None

sys.meta_path.insert(0, Absent())
from raytrain.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("args", [["validate", "manifests/rayjob.yaml"], ["emulate", "manifests/rayjob.yaml"]])
def test_without_the_kube_extra_one_paragraph_names_it(args):
    done = subprocess.run([sys.executable, "-c", WITHOUT_KUBE_EXTRA, *args], capture_output=True, text=True,
                          timeout=120, cwd=REPO)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(f"raytrain: error: `raytrain {args[0]}` needs raytrain's Kubernetes tooling")
    assert "pip install 'raytrain[kube]'" in done.stderr and done.stderr.count("\n") == 1
    assert "Traceback" not in done.stderr + done.stdout


def test_crds_that_cannot_be_found_or_fetched_say_how_to_stage_them(raytrain, tmp_path, monkeypatch):
    monkeypatch.delenv("RAYTRAIN_KUBERAY_CRDS", raising=False)
    done = raytrain("validate", "manifests/rayjob.yaml", "--crds", str(tmp_path / "none"), cwd=REPO)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert f"--crds {tmp_path / 'none'} does not hold ray.io_rayclusters.yaml" in done.stderr


def _main(args, capsys) -> tuple[int, str]:
    """`raytrain ARGS` in this process (no interpreter start-up): the exit status and what it printed."""
    from raytrain.cli import main

    try:
        code = main(args)
    except SystemExit as exit_:
        code = exit_.code
    out = capsys.readouterr()
    assert "Traceback" not in out.out + out.err
    return code, out.out + out.err


@pytest.mark.parametrize("name", ["2024", "true", "null", "1e3"])
def test_name_is_the_string_typed(tmp_path, capsys, name):
    """--name 2024 and --name true were refused and --name null trained under the preset's name: the value is the
    run's name as typed. (The run stops at the GPU check, after the name has chosen the run directory.)"""
    torch = pytest.importorskip("torch", reason="torch is not installed (scripts/setup installs it)")
    if torch.cuda.is_available():
        pytest.skip("needs a machine without CUDA: there the GPU check is what stops the run")
    code, said = _main(["local", "linear", "--name", name, "--storage", str(tmp_path), "--set",
                        "scaling.use_gpu=true"], capsys)
    assert code == 2 and "scaling.use_gpu is true, but torch finds no CUDA device" in said, said
    assert [p.name for p in tmp_path.iterdir()] == [name]


@pytest.mark.parametrize("content, code, fragment", [
    (b"", 1, "nothing to check"),
    (b"---\n---\n", 1, "nothing to check"),
    (b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: caf\xe9}\n", 1, "is not UTF-8 text"),
    (b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\ndata: {a: 1, a: 2}\n", 1, "found the key 'a' twice"),
    (b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\ndata: {a: '1'}\n", 0, "raytrain validate: OK"),
])
def test_validate_in_process(tmp_path, capsys, content, code, fragment):
    path = tmp_path / "objects.yaml"
    path.write_bytes(content)
    got, said = _main(["validate", str(path)], capsys)
    assert got == code and fragment in said, said


@pytest.mark.parametrize("content, fragment", [
    (b"apiVersion: ray.io/v1\nkind: RayJob\nmetadata: {name: caf\xe9}\n", "is not UTF-8 text (byte 0xe9 at line 3)"),
    (b"apiVersion: ray.io/v1\nkind: RayJob\nkind: RayJob\n", "found the key 'kind' twice"),
])
def test_emulate_reads_manifests_as_validate_does(tmp_path, capsys, content, fragment):
    path = tmp_path / "rayjob.yaml"
    path.write_bytes(content)
    code, said = _main(["emulate", str(path)], capsys)
    assert code != 0 and fragment in said, said


@pytest.mark.parametrize("args, env, fragment", [
    (["cluster", "delete-node", "rte000000", "worker-0", "--pending", "soon"], {}, "'soon' is not a number of seconds"),
    (["cluster", "delete-node", "rte000000", "worker-0", "--pending", "-5"], {}, "a finite number of seconds"),
    (["cluster", "delete-node", "rte000000", "worker-0", "--pending", "inf"], {}, "a finite number of seconds"),
    (["cluster", "delete-node", "rte000000", "worker-0", "--pending", "nan"], {}, "a finite number of seconds"),
    (["emulate", "manifests/rayjob-standalone.yaml"], {"RAYTRAIN_EMULATE_MAX_WORKER_NODES": "three"},
     "RAYTRAIN_EMULATE_MAX_WORKER_NODES='three' is not a count of worker nodes from 1 to 64"),
    (["emulate", "manifests/rayjob-standalone.yaml"], {"RAYTRAIN_EMULATE_MAX_WORKER_NODES": "0"}, "Fix: unset it"),
    (["run", "linear"], {"RAYTRAIN_RESIZE_CHECKPOINT_TIMEOUT_S": "forever"},
     "RAYTRAIN_RESIZE_CHECKPOINT_TIMEOUT_S='forever' is not a number of seconds"),
    (["run", "linear"], {"RAY_metrics_report_interval_ms": "1s"},
     "RAY_metrics_report_interval_ms='1s' is not a whole number of milliseconds"),
    (["tune", "text-rnn"], {"RAY_metrics_report_interval_ms": "0"}, "Fix: unset it"),
])
def test_bad_elastic_and_emulation_settings_are_usage_errors(capsys, monkeypatch, args, env, fragment):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    code, said = _main(args, capsys)
    assert code == 2 and fragment in said, said


def test_presets_lists_each_description_whole(raytrain):
    """Each preset's opening paragraph, not its first line cut mid-sentence (issue 41)."""
    listing = " ".join(raytrain("presets").stdout.split())
    assert "Acceptance: final loss <= 0.09." in listing  # linear's second line
    assert "nothing is materialised, so memory stays bounded" in listing  # streaming's third line


@pytest.mark.parametrize("where, fragment", [
    ("missing", "does not exist"),
    ("empty", "holds no raytrain records"),
])
def test_why_on_a_path_without_a_run_names_it_and_the_fix(raytrain, tmp_path, where, fragment):
    (tmp_path / "empty").mkdir()
    done = raytrain("why", str(tmp_path / where))
    assert done.returncode == 2 and done.stderr.startswith("raytrain: error: "), done.stderr
    assert fragment in done.stderr and str(tmp_path / where) in done.stderr and "Fix:" in done.stderr
    assert "Traceback" not in done.stderr + done.stdout


def test_why_says_how_each_attempt_ended_in_text_and_json(raytrain, tmp_path):
    from raytrain.rundir import workerlogs

    run_dir = tmp_path / "run"
    (run_dir / ".lease").mkdir(parents=True)
    (run_dir / ".lease" / "1.json").write_text(json.dumps({"token": 1, "host": "h", "pid": 7, "since": 1e9}))
    (run_dir / "results.jsonl").write_text(json.dumps({"attempt": 1, "status": "failed", "error": "it broke"}) + "\n")
    try:
        raise KeyError("missing column")
    except KeyError as err:
        workerlogs.record_failure(run_dir, 1, 2, 3, err, node_ip="10.0.0.3", last_lines=["loading", "\udcff"])
    text = raytrain("why", str(run_dir))
    assert text.returncode == 0, text.stderr
    assert "attempt 1: failed" in text.stdout and "it broke" in text.stdout
    assert "first failure: rank 2 of 3 (node 10.0.0.3" in text.stdout and "KeyError: 'missing column'" in text.stdout
    machine = raytrain("why", str(run_dir), "--json")
    found = json.loads(machine.stdout)
    assert found["attempts"][0]["first_failure"]["rank"] == 2 and found["attempts"][0]["ending"] == "failed"
