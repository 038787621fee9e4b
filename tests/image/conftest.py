"""Fixtures of the image tier (marker `image`): a Docker engine, and the raytrain image built for real from
images/Dockerfile on the offline local base (scripts/image-local-base) with scripts/build-image.

    scripts/image-tier          # installs docker.io/debootstrap if missing, starts dockerd, runs this tier
    .venv/bin/python -m pytest -m image tests/image

Without a Docker engine that answers or can be started (scripts/docker-engine) the tier skips with the reason.
Build inputs, from the environment (the defaults fit this project's CI machines):
  RAYTRAIN_IMAGE_BASE    local (default: scripts/image-local-base, no pulls) or official (rayproject/ray)
  RAYTRAIN_IMAGE_WHEELS  wheels for pip --find-links (default /opt/wheels when it holds a torch wheel)
  TORCH_INDEX_URL        default PyPI when such a local torch wheel is used (the PyTorch CPU index may be
                         unreachable), else the Dockerfile's own default
  PIP_CONF, CA_BUNDLE    BuildKit secrets for pip (default /etc/pip.conf and the system CA bundle, if present)
"""

from __future__ import annotations

import sys

import pytest

from tests.image.support import ROOT, sh, build, build_env


@pytest.fixture(scope="session")
def docker() -> str:
    """The Docker client to use, once an engine answers; skips the tier when none can."""
    started = sh([str(ROOT / "scripts" / "docker-engine")], timeout=120)
    if started.returncode != 0:
        pytest.skip(f"no Docker engine: {(started.stderr or started.stdout).strip()}")
    client = sh(["bash", "-c", f"source {ROOT}/scripts/lib/docker.sh; raytrain_docker_client"], timeout=30)
    return client.stdout.strip()


@pytest.fixture(scope="session")
def image(docker) -> str:
    """The CPU image under its real tag, built (or brought up to date from the cache) once per session."""
    output, seconds = build()
    tag = sh([str(ROOT / "scripts" / "build-image"), "--print-tag"], timeout=30, env=build_env()).stdout.strip()
    print(f"\n[image tier] {tag} built in {seconds:.0f} s", file=sys.stderr)
    return tag
