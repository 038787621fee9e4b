"""Helpers of the image tier: build-image with the build inputs of tests/image/conftest.py."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD_TIMEOUT_S = 1800


def sh(cmd: list[str], timeout: float, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kwargs)


def build_env(overrides: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("IMAGE", "TAG", "BASE_IMAGE")} | (overrides or {})
    wheels = env.get("RAYTRAIN_IMAGE_WHEELS", "/opt/wheels")
    if wheels and list(Path(wheels).glob("torch-*.whl")):
        env["WHEELS_DIR"] = wheels
        env.setdefault("TORCH_INDEX_URL", "https://pypi.org/simple")
    if "PIP_CONF" not in env and Path("/etc/pip.conf").is_file():
        env["PIP_CONF"] = "/etc/pip.conf"
    if "CA_BUNDLE" not in env:
        for bundle in (env.get("SSL_CERT_FILE", ""), "/etc/ssl/certs/ca-certificates.crt"):
            if bundle and Path(bundle).is_file():
                env["CA_BUNDLE"] = bundle
                break
    return env


def build(*args: str, cwd: Path = ROOT, env_extra: dict[str, str] | None = None) -> tuple[str, float]:
    """Run build-image (plain progress); returns its output and seconds taken. Fails the test with the output's
    tail when the build fails. RAYTRAIN_IMAGE_BASE=official builds on the Dockerfile's default base
    (rayproject/ray, pulled) instead of the offline local base."""
    env = build_env(env_extra)
    base = [] if env.get("RAYTRAIN_IMAGE_BASE") == "official" else ["--local-base"]
    start = time.monotonic()
    out = sh([str(cwd / "scripts" / "build-image"), *base, *args, "--", "--progress=plain"],
              timeout=BUILD_TIMEOUT_S, env=env, cwd=cwd)
    seconds = time.monotonic() - start
    output = out.stdout + out.stderr
    if out.returncode != 0:
        pytest.fail(f"scripts/build-image failed ({out.returncode}):\n{output[-6000:]}")
    return output, seconds
