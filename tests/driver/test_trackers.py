"""training/raytrain/driver/trackers.py: what a metrics row sends, the config as MLflow's params, a tracker client
that is not installed, and MLflow's own tracker on MLflow's SQLite store; the real MLflow server and W&B's offline
files are in tests/integration/test_tracking.py."""

from __future__ import annotations

import pytest

from raytrain.driver import trackers
from raytrain.errors import UsageError

ROW = {"epoch": 3, "train_loss": 0.5, "val_accuracy": 1, "samples_per_s": 10.0, "resumed_from_epoch": 2,
       "attempt": 4, "note": "text", "flag": True, "diverged": float("inf"), "missing": None}


def test_a_rows_measurements_are_its_finite_numbers_the_epoch_included():
    assert trackers.metric_values(ROW) == {"epoch": 3.0, "train_loss": 0.5, "val_accuracy": 1.0,
                                           "samples_per_s": 10.0}


def test_the_config_is_flattened_to_dotted_text():
    assert trackers.flat_config({"train": {"lr": 0.01, "betas": [0.9, 0.95], "loss": "mse"}, "run": {"name": "x",
                                 "tracking": None, "empty": {}}}) == {
        "train.lr": "0.01", "train.betas": "[0.9, 0.95]", "train.loss": "mse", "run.name": "x",
        "run.tracking": "null", "run.empty": "{}"}


def test_a_missing_client_package_is_named_with_its_install_command(monkeypatch):
    monkeypatch.setitem(trackers.PACKAGES, "wandb", ("raytrain_no_such_module", "pip install wandb"))
    with pytest.raises(UsageError, match=r"run.tracking.wandb is set, but the raytrain_no_such_module package is "
                                         r"not installed. Fix: pip install wandb, or remove run.tracking.wandb"):
        trackers.check_installed(["wandb"])
    trackers.check_installed([])


def test_a_run_whose_tracker_client_is_missing_is_refused_before_it_starts(raytrain, tmp_path, monkeypatch):
    monkeypatch.setitem(trackers.PACKAGES, "mlflow", ("raytrain_no_such_module", "pip install mlflow-skinny"))
    done = raytrain("local", "linear", "--storage", str(tmp_path), "--set", "run.tracking.mlflow.uri=http://m:5000")
    assert done.returncode == 2 and "Fix: pip install mlflow-skinny" in done.stderr, done
    assert not (tmp_path / "linear" / "lease.json").exists() and not (tmp_path / "linear" / "config.yaml").exists()


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # SQLAlchemy's, inside MLflow's store
# No Ray and no server, so the unit tier; MLflow's first SQLite store runs its schema migrations: seconds, and
# more than the unit limit on a loaded machine.
@pytest.mark.timeout(180)
def test_an_mlflow_run_created_just_before_a_kill_is_found_again_and_asked_what_it_holds(tmp_path):
    """The MLflow tracker itself, on MLflow's own SQLite store (no server needed for this): a kill between creating
    the run and saving its id in tracking.json leaves only the uid saved; the next attempt finds that run by its
    uid tag instead of making a second one, logs the config once, and learns the newest epoch it holds."""
    pytest.importorskip("mlflow", reason="the dev extra's mlflow (pip install -e '.[dev]')")
    from mlflow.tracking import MlflowClient

    from raytrain.driver.trackers import Mlflow
    from raytrain.spec.sections import MlflowTracking

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    experiment = client.create_experiment("found")
    made = client.create_run(experiment, tags={"raytrain.uid": "u-1"}).info.run_id
    state = {"uid": "u-1", "config": {"train": {"lr": 0.01}}}
    saved = []
    tracker = Mlflow(MlflowTracking(uri=uri, experiment="found"), "killed", tmp_path)
    assert tracker.open(state, lambda: saved.append(dict(state))) == 0
    assert state["run_id"] == made and state["config_logged"] and "config" not in state
    tracker.send([{"epoch": 1, "train_loss": 0.5}, {"epoch": 2, "train_loss": 0.25, "bad name!": 1.0}])
    again = Mlflow(MlflowTracking(uri=uri, experiment="found"), "killed", tmp_path)
    assert again.open(state, lambda: None) == 2  # what MLflow holds, whatever tracking.json says
    assert [r.info.run_id for r in client.search_runs([experiment])] == [made]
    assert client.get_run(made).data.params == {"train.lr": "0.01"}
    assert sorted(client.get_run(made).data.metrics) == ["epoch", "train_loss"]  # an invalid name is not sent
    # Each attempt's end logs the run's goodput so far at the attempt's step: the newest is the run's, the
    # history says how it went
    again.summarize({"goodput": 0.5, "goodput/training_s": 10.0}, 1)
    again.summarize({"goodput": 0.75, "goodput/training_s": 30.0}, 2)
    assert client.get_run(made).data.metrics["goodput"] == 0.75
    assert [(m.step, m.value) for m in client.get_metric_history(made, "goodput/training_s")] == [(1, 10.0), (2, 30.0)]
