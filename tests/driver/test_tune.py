"""training/raytrain/driver/tune.py without a cluster: the search file, its smoke block, the space checked against the run
config, and how many trials run at once."""

from __future__ import annotations

from pathlib import Path

import pytest

from raytrain.driver.tune import concurrent_trials, check_space, load_search, param_space, resolve_search_path
from raytrain.spec.config import PRESETS_DIR, ConfigError, load_config


def test_the_text_rnn_search_is_the_issue_space_and_smoke_makes_it_two_short_trials():
    path = resolve_search_path(None, "text-rnn")
    assert path == PRESETS_DIR / "text-rnn" / "search.yaml"
    search = load_search(path)
    assert (search.metric, search.mode) == ("val_accuracy", "max")
    assert search.space == {"train.lr": {"uniform": [1e-4, 1e-2]}, "train.epochs": {"choice": [5, 10, 20]}}
    smoke = load_search(path, smoke=True)
    assert smoke.num_samples == 2 and max(smoke.space["train.epochs"]["choice"]) <= 2
    space = param_space(smoke)
    assert set(space) == {"train.lr", "train.epochs"}
    check_space(load_config("text-rnn", smoke=True), smoke)


def write(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "search.yaml"
    path.write_text(body)
    return path


@pytest.mark.parametrize("body, expected", [
    ("space: {train.lr: {uniform: [0.1, 0.01]}}", "lo < hi"),
    ("space: {train.lr: {normal: [0, 1]}}", "not a distribution"),
    ("space: {train.lr: {uniform: [0.1]}}", "takes [lo, hi]"),
    ("space: {train.lr: {loguniform: [0, 1]}}", "lo > 0"),
    ("space: {scaling.num_workers: {choice: [1, 2]}}", "only keys of model, data, train"),
    ("space: {}", "space is missing or empty"),
    ("space: {train.lr: {choice: [0.1]}}\nmode: maximum", "use max or min"),
    ("space: {train.lr: {choice: [0.1]}}\nnum_samples: 0", "1 or more"),
    ("space: {train.lr: {choice: [0.1]}}\nsampels: 2", "unknown key 'sampels'"),
])
def test_bad_search_files_name_the_file_and_the_fix(tmp_path, body, expected):
    path = write(tmp_path, body)
    with pytest.raises(ConfigError) as err:
        load_search(path)
    assert str(path) in str(err.value) and expected in str(err.value) and "Fix" in str(err.value)


@pytest.mark.parametrize("space, expected", [
    ("{train.epochs: {choice: [2, 0]}}", "train.epochs = 0"),
    ("{model.cell: {choice: [lstm, transformer]}}", "model.cell = 'transformer'"),
    ("{train.lrate: {uniform: [0.1, 0.2]}}", "train.lrate"),
])
def test_every_value_the_space_can_produce_must_make_a_valid_run_config(tmp_path, space, expected):
    search = load_search(write(tmp_path, f"space: {space}"))
    with pytest.raises(ConfigError) as err:
        check_space(load_config("text-rnn", smoke=True), search)
    assert expected in str(err.value) and str(search.source) in str(err.value)


def test_missing_search_file_says_what_to_pass(tmp_path):
    with pytest.raises(ConfigError, match="--search"):
        resolve_search_path(str(tmp_path / "nope.yaml"), "text-rnn")
    with pytest.raises(ConfigError, match="Fix: pass --search"):
        resolve_search_path(None, "digits")


@pytest.mark.parametrize("nodes, per_worker, workers, asked, expected", [
    ([{"CPU": 2.0}], {"CPU": 1.0}, 2, 0, 1),
    ([{"CPU": 8.0}], {"CPU": 1.0}, 2, 0, 4),
    ([{"CPU": 8.0}], {"CPU": 1.0}, 2, 3, 3),
    ([{"CPU": 4.0}, {"CPU": 4.0, "GPU": 1.0}], {"CPU": 1.0, "GPU": 1.0}, 1, 0, 1),
    ([{"CPU": 1.0}], {"CPU": 1.0}, 2, 0, 1),  # never fits: Tune still runs one at a time and Ray reports why
])
def test_trials_run_concurrently_only_as_far_as_the_cluster_holds_them(nodes, per_worker, workers, asked, expected):
    assert concurrent_trials(nodes, per_worker, workers, asked) == expected


def test_ray_data_keeps_its_reserved_cpu_when_trials_are_packed():
    # 2 CPUs, workers at 0.5 CPU (the launcher's auto sizing with Ray Data): one trial, not two.
    assert concurrent_trials([{"CPU": 2.0}], {"CPU": 0.5}, 2, 0, reserve_cpus=1.0) == 1
    assert concurrent_trials([{"CPU": 2.0}], {"CPU": 0.5}, 2, 0) == 2


@pytest.mark.parametrize("overrides, expected", [
    (["scaling.num_workers=[1, 2]"], "--set scaling.num_workers=2"),
    (["scaling.fault_tolerance=torchft"], "--set scaling.fault_tolerance=restart"),
])
def test_a_run_config_tune_cannot_run_is_refused_before_any_trial(tmp_path, overrides, expected):
    search = load_search(write(tmp_path, "space: {train.lr: {loguniform: [0.001, 0.01]}}"))
    with pytest.raises(ConfigError) as err:
        check_space(load_config("text-rnn", overrides, smoke=True), search)
    assert expected in str(err.value) and str(search.source) in str(err.value)
