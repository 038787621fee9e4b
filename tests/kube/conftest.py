"""Fixtures for the Kubernetes-side tests: the chart, the manifests and the KubeRay CRD directory."""

import os
from pathlib import Path

import pytest

from raytrain.kube.schemas import default_crd_dir


@pytest.fixture(scope="session")
def crd_dir() -> Path:
    """RAYTRAIN_KUBERAY_CRDS if set (as the CLI does), else ../shared/kuberay-crds-v1.7.0 beside the checkout."""
    path = Path(os.environ.get("RAYTRAIN_KUBERAY_CRDS") or default_crd_dir())
    if not (path / "ray.io_rayjobs.yaml").is_file():
        pytest.fail(f"KubeRay v1.7.0 CRDs not found in {path}: set RAYTRAIN_KUBERAY_CRDS or put them in {default_crd_dir()}")
    return path
