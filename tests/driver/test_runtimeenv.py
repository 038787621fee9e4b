"""training/raytrain/driver/runtimeenv.py: what a driver joining a cluster ships (issue 40, item 4): the user's code,
never an environment, within a bound."""

from __future__ import annotations

import pytest

from raytrain.driver import runtimeenv
from raytrain.spec.config import ConfigError, load_config


def _project(tmp_path, monkeypatch, module: str, where: str = ""):
    """A project directory as the working directory (what `raytrain run` in it sets), with a model component in
    `module`.py under `where` (a folder of it put on the import path, as an installed environment's is)."""
    from raytrain.spec import workdir

    folder = tmp_path / where
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{module}.py").write_text("from raytrain.models import mlp  # noqa: F401\n")
    monkeypatch.setattr(workdir, "_current", None)
    workdir.use(str(tmp_path))
    if where:
        monkeypatch.syspath_prepend(str(folder))
    else:
        monkeypatch.syspath_prepend(str(tmp_path))
    return load_config("linear", [f"model._component_={module}.mlp", f"run.storage_path={tmp_path / 'runs'}"])


@pytest.mark.parametrize("where, marker", [
    ("env/lib/python3.12/site-packages", "env/pyvenv.cfg"),   # a venv not named .venv/venv, beside the project
    ("pyenv/lib/python3.12/site-packages", None),            # site-packages alone says it
    ("miniconda3/lib/python3.12/site-packages", "miniconda3/conda-meta/history"),  # conda in a home directory
    ("miniconda3/pkgs/thing", "miniconda3/conda-meta/history"),
])
def test_a_component_from_an_installed_environment_in_the_directory_ships_nothing(tmp_path, monkeypatch, where,
                                                                                    marker):
    if marker:
        (tmp_path / marker).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / marker).write_text("")
    module = f"envmodels_{abs(hash(where))}"
    cfg = _project(tmp_path, monkeypatch, module, where)
    assert runtimeenv.user_code_dir(cfg) is None
    assert runtimeenv.runtime_env(cfg, embedded=False, in_submitted_job=False) == {}


def test_the_users_code_ships_without_the_environments_and_rays_temp_dir_in_it(tmp_path, monkeypatch):
    cfg = _project(tmp_path, monkeypatch, "usermodels_ship")
    for marker in ("env/pyvenv.cfg", "tools/conda/conda-meta/history", "lib/site-packages/x.py",
                   "raytmp/session_latest", "code/helpers.py"):
        (tmp_path / marker).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / marker).write_text("")
    # what is left out would exceed the bound on its own: a shipped environment is found by its size
    with open(tmp_path / "env" / "big.bin", "wb") as handle:
        handle.truncate(runtimeenv.SHIP_LIMIT_BYTES + 1)  # sparse: takes no disk
    assert runtimeenv.user_code_dir(cfg) == tmp_path
    env = runtimeenv.runtime_env(cfg, embedded=False, in_submitted_job=False)
    assert env["working_dir"] == str(tmp_path)
    assert set(env["excludes"]) - set(runtimeenv.SHIP_EXCLUDES) == {"/env", "/tools/conda", "/lib/site-packages",
                                                                  "/raytmp"}


def test_a_directory_over_the_bound_is_one_paragraph_naming_it_and_the_fix(tmp_path, monkeypatch):
    cfg = _project(tmp_path, monkeypatch, "usermodels_big")
    (tmp_path / "data").mkdir()
    with open(tmp_path / "data" / "big.bin", "wb") as handle:
        handle.truncate(runtimeenv.SHIP_LIMIT_BYTES + 1)
    with pytest.raises(ConfigError) as caught:
        runtimeenv.runtime_env(cfg, embedded=False, in_submitted_job=False)
    message = str(caught.value)
    assert f"ship {tmp_path} " in message and "512 MiB" in message and "--working-dir" in message
    assert ".rayignore" in message and "\n" not in message
    # the fix it names works: Ray's own ignore file leaves the data out
    (tmp_path / ".rayignore").write_text("data/\n")
    assert runtimeenv.runtime_env(cfg, embedded=False, in_submitted_job=False)["working_dir"] == str(tmp_path)


def test_a_directory_of_too_many_files_is_refused_without_walking_it_all(tmp_path, monkeypatch):
    _project(tmp_path, monkeypatch, "usermodels_many")
    for i in range(30):
        (tmp_path / f"f{i}.txt").write_text("x")
    with pytest.raises(ConfigError, match=r"more than 512 MiB or 20 files \(0 MiB in 21 files"):
        runtimeenv.ship_plan(tmp_path, limit_files=20)


@pytest.mark.parametrize("module", ["raytrain.models", "raytrain.data.digits", "raytrain.driver.runtimeenv"])
def test_raytrains_own_modules_are_never_the_users_code(module):
    """The image installs raytrain: a preset's component from any of its rooms ships nothing (a checkout of raytrain
    is not an installed environment, so only this rule keeps it from being shipped as the user's code)."""
    import importlib
    from pathlib import Path

    assert runtimeenv.in_environment(Path(importlib.import_module(module).__file__))
