"""Fixtures for the Kubernetes-side tests: the KubeRay CRD directory, found as `raytrain validate` finds it."""

import os
from pathlib import Path

import pytest

from raytrain.validator.crds import CRDS_ENV, CRDError, resolve_crd_dir


@pytest.fixture(scope="session")
def crd_dir() -> Path:
    """$RAYTRAIN_KUBERAY_CRDS if set (CI), else the user cache, downloaded there once (a machine with internet)."""
    try:
        return resolve_crd_dir(None, os.environ.get(CRDS_ENV))
    except CRDError as exc:
        pytest.fail(str(exc))
