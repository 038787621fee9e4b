"""The storage path is checked before Ray starts: each bad one gets one paragraph naming the path, the uid and the
fix, and exit 2 from the real CLI. Tests run as root here, so the unwritable cases run the CLI as uid 65534
(in a fork of the test process)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from raytrain.rundir.storage import StorageError
from raytrain.rundir.storagecheck import check_storage
from tests.support.cli import Done, in_forked_child

NOBODY = 65534


def _become_nobody() -> None:
    os.chdir("/")
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)


def raytrain_run_as_nobody(*args: str) -> Done:
    """`raytrain run linear ARGS` as uid 65534: a fork of this process (a new uid needs its own process; a fork
    needs no second interpreter to import Ray first)."""
    # What `raytrain run` imports before its storage check is imported before the fork, as root: the interpreter
    # and the package live under /root here, out of uid 65534's reach.
    import raytrain.checkpoint.resume
    import raytrain.driver.attempt  # noqa: F401
    import raytrain.driver.raytrainer
    import raytrain.rundir.storage
    import raytrain.spec.config
    raytrain.spec.config.load_config("linear")  # and what loading the config needs (its components, pydantic's plugins)
    return in_forked_child(["run", "linear", *args], before=_become_nobody)


@pytest.fixture
def root_only_dir():
    # pytest's own tmp_path is under a root-only directory: this one lets others in, but not write
    top = Path(tempfile.mkdtemp(prefix="raytrain-storage-", dir="/tmp"))
    top.chmod(0o755)
    target = top / "shared"
    target.mkdir(mode=0o755)
    yield target
    shutil.rmtree(top)


@pytest.mark.parametrize("make, expected", [
    (lambda d: "", ["run.storage_path is empty"]),
    (lambda d: (d / "afile").write_text("x") and str(d / "afile"), ["is a file, not a directory", "afile"]),
])
def test_bad_storage_paths_are_named(tmp_path, make, expected):
    with pytest.raises(StorageError) as err:
        check_storage(make(tmp_path))
    assert all(text in str(err.value) for text in expected)


@pytest.mark.parametrize("storage, expected", [
    ("", ["--storage '': is empty"]),
    ("{afile}", ["is a file, not a directory"]),
    ("{shared}", ["is not writable by uid 65534 (gid 65534)", "owner uid 0", "anonuid=1000"]),
    ("{shared}/deeper/runs", ["does not exist, and", "does not let it be created", "uid 65534"]),
])
def test_the_cli_refuses_storage_it_cannot_write_before_ray_starts(root_only_dir, storage, expected):
    afile = root_only_dir.parent / "afile"
    afile.write_text("x")
    path = storage.format(afile=afile, shared=root_only_dir)
    done = raytrain_run_as_nobody("--storage", path, "--name", "w")
    assert done.returncode == 2, done.stdout + done.stderr
    message = done.stderr.strip()
    assert message.startswith("raytrain: error: ") and message.count("\n") == 0, message  # one paragraph
    assert all(text in message for text in expected), message
    assert "Traceback" not in done.stderr and "embedded Ray" not in done.stdout


def test_a_run_directory_left_by_another_user_is_named(root_only_dir):
    root_only_dir.chmod(0o777)
    (root_only_dir / "w").mkdir(mode=0o755)
    done = raytrain_run_as_nobody("--storage", str(root_only_dir), "--name", "w")
    assert done.returncode == 2, done.stderr
    assert f"the run directory {root_only_dir / 'w'}" in done.stderr and "uid 65534" in done.stderr
