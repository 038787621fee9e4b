"""The image tier: the raytrain image built for real (tests/image/conftest.py) and run: its user, pins and
presets; `raytrain run linear` inside it; a head and a worker container on one Docker network with one shared
volume running manifests/rayjob.yaml's job the way KubeRay's submitter does; and a code change rebuilding only
the last layers.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import tomllib
import uuid
from pathlib import Path

import pytest
import yaml

from tests.image.support import ROOT, build, build_env
from tests.support.checks import assert_run_completed

pytestmark = pytest.mark.image

SHARED = "/mnt/shared"


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def pin(name: str) -> str:
    for requirement in pyproject()["project"]["dependencies"]:
        match = re.fullmatch(rf"{re.escape(name)}(\[[^\]]*\])?==([\w.]+)", requirement)
        if match:
            return match.group(2)
    raise AssertionError(f"no pin for {name}")


def dock(docker: str, *args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
    out = subprocess.run([docker, *args], capture_output=True, text=True, timeout=timeout)
    if check and out.returncode != 0:
        raise AssertionError(f"docker {' '.join(args)} failed ({out.returncode}):\n{(out.stdout + out.stderr)[-4000:]}")
    return out


@pytest.fixture
def names(docker):
    """Unique names for this test's containers, networks and volumes; all removed afterwards."""
    suffix = uuid.uuid4().hex[:8]
    made: dict[str, list[str]] = {"container": [], "network": [], "volume": []}

    def name(kind: str, base: str) -> str:
        made[kind].append(f"rt-img-{base}-{suffix}")
        return made[kind][-1]

    yield name
    for container in made["container"]:
        dock(docker, "rm", "--force", container, check=False)
    for network in made["network"]:
        dock(docker, "network", "rm", network, check=False)
    for volume in made["volume"]:
        dock(docker, "volume", "rm", "--force", volume, check=False)


def copy_run_dir(docker: str, image: str, volume: str, run_name: str, dest: Path, names) -> Path:
    """Copy STORAGE/NAME out of a Docker volume for the shared run-directory checks."""
    holder = names("container", "copy")
    dock(docker, "create", "--name", holder, "-v", f"{volume}:{SHARED}", image, "true")
    dock(docker, "cp", f"{holder}:{SHARED}/runs/{run_name}", str(dest))
    return dest / run_name


# ------------------------------------------------------------------------------------------ what the image holds

def test_runs_as_non_root_ray_user(docker, image):
    config = json.loads(dock(docker, "image", "inspect", image).stdout)[0]["Config"]
    assert config["User"] == "1000:100"
    out = dock(docker, "run", "--rm", image, "sh", "-c", 'id -u; id -g; id -un; echo "$HOME"').stdout.split()
    assert out == ["1000", "100", "ray", "/home/ray"]
    # The shared volume's mount point is the user's: a fresh Docker volume mounted there is writable.
    owner = dock(docker, "run", "--rm", image, "stat", "-c", "%u:%g", SHARED).stdout.strip()
    assert owner == "1000:100"


def test_pins_package_and_presets_inside(docker, image):
    probe = ("import json, ray, torch, torchvision, raytrain, importlib.metadata as md, importlib.resources as r; "
             "print(json.dumps({'ray': ray.__version__, 'torch': torch.__version__, "
             "'torchvision': torchvision.__version__, 'raytrain': md.version('raytrain'), "
             "'presets': sorted(p.name for p in (r.files('raytrain') / 'configs').iterdir() if p.name.endswith('.yaml'))}))")
    inside = json.loads(dock(docker, "run", "--rm", image, "python", "-c", probe).stdout.strip().splitlines()[-1])
    assert inside["ray"] == pin("ray")
    assert inside["torch"].split("+")[0] == pin("torch")
    assert inside["torchvision"].split("+")[0] == pin("torchvision")
    assert inside["raytrain"] == pyproject()["project"]["version"]
    assert inside["presets"] == sorted(p.name for p in (ROOT / "training" / "raytrain" / "configs").glob("*.yaml"))
    version = dock(docker, "run", "--rm", image, "raytrain", "--version").stdout.strip()
    assert version == f"raytrain {pyproject()['project']['version']}"


def test_no_build_secrets_or_tests_in_image(docker, image):
    config = json.loads(dock(docker, "image", "inspect", image).stdout)[0]["Config"]
    assert not [e for e in config["Env"] if e.startswith(("PIP_CERT=", "PIP_CONFIG_FILE="))]
    out = dock(docker, "run", "--rm", image, "sh", "-c",
               'ls -A /run/secrets 2>/dev/null; ls /tmp; python -c "import tests" 2>&1 | tail -n1').stdout
    assert "pip_conf" not in out and "ca_bundle" not in out and "raytrain-src" not in out
    assert "No module named 'tests'" in out


# ------------------------------------------------------------------------------------------------ training runs

def test_raytrain_run_linear_inside(docker, image, names, tmp_path):
    volume = names("volume", "local")
    dock(docker, "volume", "create", volume)
    run = dock(docker, "run", "--rm", "--name", names("container", "local"), "--shm-size=512m",
               "-v", f"{volume}:{SHARED}", image,
               "raytrain", "run", "linear", "--name", "img-local", "--storage", f"{SHARED}/runs",
               timeout=600, check=False)
    assert run.returncode == 0, f"raytrain run linear failed in the image:\n{(run.stdout + run.stderr)[-4000:]}"
    epochs = yaml.safe_load((ROOT / "training" / "raytrain" / "configs" / "linear.yaml").read_text())["train"]["epochs"]
    assert_run_completed(copy_run_dir(docker, image, volume, "img-local", tmp_path, names), epochs)


def rayjob_manifest() -> tuple[dict, dict]:
    docs = [d for d in yaml.safe_load_all((ROOT / "manifests" / "rayjob.yaml").read_text()) if d]
    configmap = next(d for d in docs if d["kind"] == "ConfigMap")
    rayjob = next(d for d in docs if d["kind"] == "RayJob")
    return configmap, rayjob


def with_run_name(entrypoint: str, name: str) -> list[str]:
    words = shlex.split(entrypoint)
    assert "--name" in words, f"the RayJob entrypoint names no run: {entrypoint}"
    words[words.index("--name") + 1] = name
    return words


def container_logs(docker: str, *containers: str) -> str:
    logs = []
    for container in containers:
        out = dock(docker, "logs", "--tail", "40", container, check=False)
        logs.append(f"--- docker logs {container} (tail):\n{out.stdout}{out.stderr}")
    return "\n".join(logs)


def wait_for_nodes(docker: str, head: str, worker: str, count: int, timeout_s: float = 240) -> None:
    """Until `ray status` on the head lists `count` active nodes (Ray starts slowly on a loaded 2-core machine)."""
    deadline = time.monotonic() + timeout_s
    status = ""
    while time.monotonic() < deadline:
        out = dock(docker, "exec", head, "ray", "status", check=False, timeout=60)
        status = out.stdout + out.stderr
        active = status.split("Active:", 1)[-1].split("Pending:", 1)[0] if "Active:" in status else ""
        if len(re.findall(r"node_[0-9a-f]+", active)) >= count:
            return
        time.sleep(3)
    raise AssertionError(f"the cluster did not reach {count} nodes in {timeout_s:.0f} s:\n{status[-2000:]}\n"
                         + container_logs(docker, head, worker))


def wait_for_dashboard(docker: str, head: str, worker: str, timeout_s: float = 240) -> None:
    """Until the head's dashboard (the Jobs API that KubeRay's submitter calls) answers with the token."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        out = dock(docker, "exec", head, "ray", "job", "list", "--address", "http://127.0.0.1:8265",
                   check=False, timeout=60)
        if out.returncode == 0:
            return
        time.sleep(3)
    raise AssertionError(f"the dashboard did not answer in {timeout_s:.0f} s:\n{(out.stdout + out.stderr)[-2000:]}\n"
                         + container_logs(docker, head, worker))


def test_head_and_worker_containers_run_the_rayjob(docker, image, names, tmp_path):
    """manifests/rayjob.yaml run as KubeRay runs it: its ConfigMap mounted into a submitter container at
    /etc/raytrain-job, `ray job submit --runtime-env-json {working_dir}` to the head's dashboard with token
    auth, the entrypoint on the head; the head has num-cpus 0 (as the chart sets), so the Ray Train workers
    run in the worker container and both write to the one shared volume."""
    configmap, rayjob = rayjob_manifest()
    job_dir = tmp_path / "raytrain-job"
    job_dir.mkdir()
    (job_dir / "job.yaml").write_text(configmap["data"]["job.yaml"])
    job_dir.chmod(0o755)
    epochs = yaml.safe_load(configmap["data"]["job.yaml"])["train"]["epochs"]
    runtime_env = yaml.safe_load(rayjob["spec"]["runtimeEnvYAML"])
    assert runtime_env["working_dir"] == "/etc/raytrain-job"
    entrypoint = with_run_name(rayjob["spec"]["entrypoint"], "img-e2e")

    network, volume = names("network", "net"), names("volume", "shared")
    head, worker = names("container", "head"), names("container", "worker")
    dock(docker, "network", "create", network)
    dock(docker, "volume", "create", volume)
    token = uuid.uuid4().hex
    auth = ["-e", "RAY_AUTH_MODE=token", "-e", f"RAY_AUTH_TOKEN={token}"]
    node = ["--network", network, "--shm-size=512m", "-v", f"{volume}:{SHARED}", *auth]
    ray_start = ["ray", "start", "--block", "--disable-usage-stats", "--object-store-memory=200000000"]
    # A loaded 2-core CI machine can take longer than the dashboard's default 30 s to start its modules; a
    # dashboard that gives up ends `ray start --block` and the head container with it.
    slow_machine = ["-e", "RAY_DASHBOARD_SUBPROCESS_MODULE_WAIT_READY_TIMEOUT=300"]
    dock(docker, "run", "-d", "--name", head, "--hostname", "head", "--network-alias", "head", *node, *slow_machine,
         image, *ray_start, "--head", "--port=6379", "--dashboard-host=0.0.0.0", "--num-cpus=0")
    # The worker joins once the head answers, as KubeRay's wait-gcs-ready init container makes worker pods do.
    wait_for_nodes(docker, head, worker, 1)
    dock(docker, "run", "-d", "--name", worker, "--hostname", "worker", *node, image,
         *ray_start, "--address=head:6379", "--num-cpus=3")
    wait_for_nodes(docker, head, worker, 2)
    wait_for_dashboard(docker, head, worker)

    # Token auth is on: without the token the dashboard refuses.
    refused = dock(docker, "run", "--rm", "--network", network, image,
                   "ray", "job", "list", "--address", "http://head:8265", check=False)
    assert refused.returncode != 0 and "Authentication" in refused.stdout + refused.stderr

    submit = dock(docker, "run", "--rm", "--name", names("container", "submitter"), "--network", network, *auth,
                  "-v", f"{job_dir}:/etc/raytrain-job:ro", image,
                  "ray", "job", "submit", "--address", "http://head:8265", "--submission-id", "img-e2e",
                  "--runtime-env-json", json.dumps(runtime_env), "--", *entrypoint,
                  timeout=900, check=False)
    output = submit.stdout + submit.stderr
    assert submit.returncode == 0 and "Job 'img-e2e' succeeded" in output, \
        f"the job failed:\n{output[-5000:]}\n" + container_logs(docker, head, worker)

    # Where the Ray Train workers ran, from Ray's state API on the head (dead actors stay listed).
    nodes = json.loads(dock(docker, "exec", head, "ray", "list", "nodes", "--format", "json").stdout)
    node_ip = {n["node_id"]: n["node_ip"] for n in nodes}
    actors = json.loads(dock(docker, "exec", head, "ray", "list", "actors", "--format", "json", "--detail",
                             "--filter", "class_name=RayTrainWorker", "--limit", "1000").stdout)
    worker_ip = dock(docker, "inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
                     worker).stdout.strip()
    train_ips = sorted(node_ip.get(a["node_id"], "?") for a in actors)
    num_workers = yaml.safe_load(configmap["data"]["job.yaml"])["scaling"]["num_workers"]
    assert len(train_ips) >= num_workers and set(train_ips) == {worker_ip}, \
        f"Ray Train workers ran on {train_ips}; expected all in the worker container ({worker_ip}): {nodes}"
    assert_run_completed(copy_run_dir(docker, image, volume, "img-e2e", tmp_path, names), epochs)


# ------------------------------------------------------------------------------------------------ layer caching

def build_steps(output: str) -> dict[str, bool]:
    """From plain BuildKit progress: each `[final ...]` step's instruction -> whether it came from the cache."""
    titles, cached = {}, set()
    for line in output.splitlines():
        match = re.match(r"#(\d+) \[final +\d+/\d+\] (.*)", line)
        if match:
            titles[match.group(1)] = match.group(2)
        match = re.match(r"#(\d+) CACHED", line)
        if match:
            cached.add(match.group(1))
    return {title: step in cached for step, title in titles.items()}


def test_code_change_rebuilds_only_the_last_layers(docker, image, tmp_path):
    """A copy of the build context with one line added to the package and a comment to pyproject.toml (not to
    its dependencies): the torch and requirements layers come from the cache; only the package layers run
    again, and the image has the change."""
    context = tmp_path / "context"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("training", "scripts", "images"):
        shutil.copytree(ROOT / name, context / name, ignore=ignore)
    for name in ("pyproject.toml", "README.md", ".dockerignore"):
        if (ROOT / name).exists():
            shutil.copy2(ROOT / name, context / name)
    marker = f"# image-tier rebuild probe {uuid.uuid4().hex}"
    for changed in (context / "training" / "raytrain" / "__init__.py", context / "pyproject.toml"):
        with open(changed, "a") as f:
            f.write(f"\n{marker}\n")

    probe = f"rebuild-probe-{os.getpid()}"
    output, seconds = build(cwd=context, env_extra={"TAG": probe})
    tagged = f"ghcr.io/raytrain/raytrain:{probe}"
    try:
        print(f"\n[image tier] rebuild after a code change: {seconds:.0f} s", file=sys.stderr)
        steps = build_steps(output)
        pip_layers = {t: c for t, c in steps.items() if "pip install" in t and "raytrain-src" not in t}
        assert len(pip_layers) == 2 and all(pip_layers.values()), f"dependency layers rebuilt: {pip_layers}"
        package = {t: c for t, c in steps.items() if "training" in t and t.startswith("COPY")}
        assert package and not any(package.values()), f"package layer not rebuilt: {steps}"
        source = dock(docker, "run", "--rm", tagged, "python", "-c",
                      "import pathlib, raytrain; print(pathlib.Path(raytrain.__file__).read_text())").stdout
        assert marker in source
    finally:
        dock(docker, "rmi", tagged, check=False)


# ------------------------------------------------------------------------------------------ a user's project

PYPROJECT = """[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "probe-project"
version = "0.0.1"
"""


@pytest.mark.parametrize("packaged", [False, True], ids=["plain directory", "pyproject"])
def test_project_image_trains_its_own_code_from_any_directory(docker, image, names, tmp_path, packaged):
    """scripts/build-image --project: examples/own-code as one layer on the raytrain image (pip-installed when it
    has a pyproject.toml, else on the import path); `raytrain run` finds its modules from another directory."""
    project = tmp_path / "own-code"
    shutil.copytree(ROOT / "examples" / "own-code", project)
    if packaged:
        (project / "pyproject.toml").write_text(PYPROJECT + '\n[tool.setuptools]\npy-modules = ["my_models", "my_data"]\n')
    tagged = f"raytrain-probe-{uuid.uuid4().hex[:8]}"
    env = build_env({"PROJECT_IMAGE": tagged})
    out = subprocess.run([str(ROOT / "scripts" / "build-image"), "--project", str(project), "--", "--progress=plain"],
                         capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    built = f"{tagged}:{image.rpartition(':')[2]}"
    try:
        run = dock(docker, "run", "--rm", "--name", names("container", "project"), "--shm-size=512m", "-w", "/tmp",
                   built, "raytrain", "run", "/home/ray/project/job.yaml", "--smoke-test", "--storage", "/tmp/runs",
                   timeout=600, check=False)
        assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
        assert "succeeded" in run.stdout
    finally:
        dock(docker, "rmi", built, check=False)


# ------------------------------------------------------------------------------------------------------- GPU

@pytest.mark.gpu
def test_gpu_image_sees_the_gpu(docker):
    """The CUDA variant on the official -gpu base (pulled) sees the GPU through the NVIDIA container runtime."""
    if not shutil.which("nvidia-smi"):
        pytest.skip("no NVIDIA GPU on this machine")
    # No local wheels here: a CPU torch wheel among find-links would win over the CUDA build.
    build("--gpu", env_extra={"RAYTRAIN_IMAGE_BASE": "official", "RAYTRAIN_IMAGE_WHEELS": ""})
    tag = subprocess.run([str(ROOT / "scripts" / "build-image"), "--print-tag", "--gpu"],
                         capture_output=True, text=True, check=True).stdout.strip()
    out = dock(docker, "run", "--rm", "--gpus", "all", tag, "python", "-c",
               "import torch; assert torch.cuda.is_available(); print(torch.version.cuda, torch.cuda.device_count())",
               timeout=300)
    assert int(out.stdout.split()[-1]) >= 1
