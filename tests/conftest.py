"""Fixtures every tier shares: the KubeRay CRD directory (found as `raytrain validate` finds it), the `raytrain`
command run in-process, the CLI's process-wide state put back after each test, and the tiers' time limits."""

import os
import sys
from pathlib import Path

import pytest

from raytrain.rundir import console
from raytrain.spec import workdir
from raytrain.validator.crds import CRDS_ENV, CRDError, resolve_crd_dir
from tests.support.cli import Done, exit_status

# pyproject.toml's `timeout` (60 s) bounds a unit test; a tier that runs real clusters or builds gets its own limit
# here (a test's own @pytest.mark.timeout wins), so a hung Ray test fails with a traceback instead of running to CI's
# kill. integration: about three times its slowest test on this 2-core machine under a load of 20 (292 s); image:
# the first test builds the image (a subprocess limit of 900 s); e2e: above scripts/kind-e2e's own limit
# (RAYTRAIN_E2E_TIMEOUT, 5400 s).
TIER_TIMEOUTS_S = {"integration": 900, "image": 1800, "e2e": 6000, "gpu": 900}


# The integration tier's longest tests and xdist groups, longest first (CI's slowest-15 lists at d540f27 and 7695f74,
# seconds on this machine). pytest-xdist hands out work in collection order, where the 190 s suspend test came
# last-but-two: started first instead, no worker is left running a 3-minute test alone while the other idles
# (longest-processing-time-first). The rest keep their order after these; a stale entry only loses its effect.
LONGEST_FIRST = (
    "tests/integration/test_suspend.py::",  # 184-207 s
    "tests/integration/test_prometheus.py::",  # the group: 85-90 s set-up, then two runs
    "tests/integration/test_emulate.py::test_killed_driver_is_retried_and_resumes",  # 113-148 s
    "tests/integration/test_fsdp.py::",  # 110-138 s
    "tests/integration/test_attempt.py::",  # 88-120 s each
    "tests/integration/test_emulate.py::",  # 77-115 s each
    "tests/integration/test_tracking.py::",  # 93-98 s
    "tests/integration/test_run.py::test_linear_reaches",  # 85-88 s
    "tests/integration/test_ray_train_scripts.py::",  # 76-81 s each
)


def _longest_first(item) -> int:
    return next((i for i, prefix in enumerate(LONGEST_FIRST) if item.nodeid.startswith(prefix)), len(LONGEST_FIRST))


def pytest_collection_modifyitems(config, items):
    items.sort(key=_longest_first)  # stable: the order within each entry, and of the rest, is collection order
    for item in items:
        if item.get_closest_marker("timeout"):
            continue
        limits = [seconds for marker, seconds in TIER_TIMEOUTS_S.items() if item.get_closest_marker(marker)]
        if limits:
            item.add_marker(pytest.mark.timeout(max(limits)))


@pytest.fixture(scope="session")
def _s3_process():
    """One real S3-compatible server per test session (tests.support.objectstore): fsspec caches its filesystem
    objects, so every test's client must keep meeting the same endpoint."""
    from tests.support.objectstore import running_s3_server

    with running_s3_server() as server:
        yield server


@pytest.fixture
def s3_server(_s3_process, monkeypatch):
    """The session's server, its endpoint and keys in the environment for this test only (and the processes it
    starts), as AWS_ENDPOINT_URL points users' clients at MinIO."""
    import s3fs

    for key, value in _s3_process.env.items():
        monkeypatch.setenv(key, value)
    # s3fs caches a filesystem per thread ident (reused by later threads) with the credentials it met when it first
    # connected: one made between two tests, with these variables gone, failed every later S3 test of a CI run
    # (NoCredentialsError). Each test's clients start from its own environment.
    s3fs.S3FileSystem.clear_instance_cache()
    return _s3_process


@pytest.fixture
def s3_prefix(s3_server) -> str:
    """A fresh bucket on the session's S3 server, as a storage path URL."""
    return f"s3://{s3_server.new_bucket()}/runs"


@pytest.fixture(scope="session")
def crd_dir() -> Path:
    """$RAYTRAIN_KUBERAY_CRDS if set (CI), else the user cache, downloaded there once (a machine with internet)."""
    try:
        return resolve_crd_dir(None, os.environ.get(CRDS_ENV))
    except CRDError as exc:
        pytest.fail(str(exc))


@pytest.fixture(autouse=True)
def _cli_state_restored():
    """main() configures the console (format, run name, a copy file), puts the working directory on sys.path and sets
    Ray's variables for the process: each test starts from the defaults, whatever the one before ran."""
    settings, path, current = dict(console._settings), list(sys.path), workdir._current
    environ = dict(os.environ)  # ray.init() sets RAY_ADDRESS in this process; a later test's Ray must not inherit it
    yield
    if dict(os.environ) != environ:
        os.environ.clear()
        os.environ.update(environ)
    console.stop_copy()
    console._settings.clear()
    console._settings.update(settings, copy=None)
    sys.path[:] = path
    workdir._current = current


@pytest.fixture
def raytrain(capsys, monkeypatch):
    """raytrain(*args, cwd=None) -> Done(returncode, stdout, stderr): the command run in this process."""
    def run(*args: str, cwd=None) -> Done:
        if cwd is not None:
            monkeypatch.chdir(cwd)
        capsys.readouterr()
        code = exit_status(list(args))
        out, err = capsys.readouterr()
        return Done(code, out, err)

    return run
