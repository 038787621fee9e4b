"""`scripts/build-image --project DIR` without a Docker engine (unit tier): its arguments, the tag, and the one
`docker build` it runs (shown with --dry-run) on images/Dockerfile.project with the project as the context. The
build itself needs an engine and a pullable raytrain image: the image tier."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "build-image"
DOCKERFILE = ROOT / "images" / "Dockerfile.project"


def build_image(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in ("IMAGE", "TAG", "PROJECT_IMAGE", "DOCKER")}
    return subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, timeout=60, env=base | (env or {}))


def raytrain_tag() -> str:
    return build_image("--print-tag").stdout.strip()


def test_the_project_image_is_named_after_the_directory_with_the_raytrain_tag(tmp_path):
    project = tmp_path / "My_Project"
    project.mkdir()
    tag = raytrain_tag().rpartition(":")[2]
    assert build_image("--project", str(project), "--print-tag").stdout.strip() == f"my_project:{tag}"
    named = build_image("--project", str(project), "--print-tag", env={"PROJECT_IMAGE": "registry.example/me/proj"})
    assert named.stdout.strip() == f"registry.example/me/proj:{tag}"
    assert build_image("--project", str(project), "--gpu", "--print-tag").stdout.strip() == f"my_project:{tag}-gpu"


def test_dry_run_shows_one_build_on_top_of_the_raytrain_image_with_the_project_as_context(tmp_path):
    project = tmp_path / "proj"
    project.mkdir()
    out = build_image("--project", str(project), "--dry-run", "--", "--progress=plain",
                      env={"DOCKER": "docker", "CA_BUNDLE": "/etc/ssl/certs/ca-certificates.crt"})
    assert out.returncode == 0, out.stderr
    [command] = out.stdout.strip().splitlines()
    words = shlex.split(command)
    assert words[:2] == ["docker", "build"]
    assert words[words.index("--file") + 1] == "images/Dockerfile.project"
    assert words[words.index("--tag") + 1] == f"proj:{raytrain_tag().rpartition(':')[2]}"
    assert f"RAYTRAIN_IMAGE={raytrain_tag()}" in words
    assert "id=ca_bundle,src=/etc/ssl/certs/ca-certificates.crt" in words
    assert words[-2:] == ["--progress=plain", str(project)]  # extra docker args, then the context


def test_push_and_kind_load_apply_to_the_project_image(tmp_path):
    out = build_image("--project", str(tmp_path), "--dry-run", "--push", env={"DOCKER": "docker",
                                                                               "PROJECT_IMAGE": "reg.example/p"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == f"docker push reg.example/p:{raytrain_tag().rpartition(':')[2]}"


BAD = [  # (arguments, exit status, text on stderr)
    (["--project", "/nonexistent/project"], 2, "--project /nonexistent/project: not a directory. Fix:"),
    (["--project", "{tmp}", "--local-base"], 2, "--local-base only applies to that image"),
    (["--project"], 1, "--project needs the project directory"),
]


@pytest.mark.parametrize("args, status, text", BAD, ids=["missing directory", "with --local-base", "no directory"])
def test_bad_project_arguments(tmp_path, args, status, text):
    out = build_image("--dry-run", *(a.replace("{tmp}", str(tmp_path)) for a in args))
    assert out.returncode == status and text in out.stderr, out.stderr
    assert out.stdout == ""


def test_the_project_dockerfile_builds_on_the_tag_build_image_makes():
    """A bare `docker build -f images/Dockerfile.project DIR` starts from the raytrain image of this version."""
    default = next(line for line in DOCKERFILE.read_text().splitlines() if line.startswith("ARG RAYTRAIN_IMAGE="))
    assert default == f"ARG RAYTRAIN_IMAGE={raytrain_tag()}"


def test_the_project_context_leaves_out_what_raytrain_never_ships():
    from raytrain.driver.runtimeenv import SHIP_EXCLUDES

    ignored = {line.strip().removeprefix("**/") for line in
               (ROOT / "images" / "Dockerfile.project.dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    assert ignored == set(SHIP_EXCLUDES)
