"""Where the KubeRay CRDs come from (--crds, $RAYTRAIN_KUBERAY_CRDS, the user cache, a sha256-checked download)
and what their schemas do (defaults as the API server applies them)."""

from __future__ import annotations

import functools
import http.server
import shutil
import threading
from pathlib import Path

import pytest

from raytrain.validator.crds import (
    CRD_FILES, CRD_SHA256, CRDError, apply_defaults, cache_dir, crd_validator, openapi_schema, resolve_crd_dir,
)

UNREACHABLE = "http://127.0.0.1:9/nothing"  # the discard port: nothing listens, the download fails at once


def stage(directory: Path, crd_dir: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name in CRD_FILES.values():
        shutil.copy(crd_dir / name, directory / name)
    return directory


@pytest.fixture
def serve(tmp_path):
    """An HTTP server on 127.0.0.1 serving a directory: the download path, for real, without the internet."""
    servers = []

    def start(directory: Path) -> str:
        handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(directory))
        handler.log_message = lambda *args: None
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}/bases"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def test_the_pinned_digests_are_the_files_ci_uses(crd_dir):
    import hashlib

    for name in CRD_FILES.values():
        assert hashlib.sha256((crd_dir / name).read_bytes()).hexdigest() == CRD_SHA256[name]


def test_cache_dir_follows_xdg(tmp_path):
    assert cache_dir({"XDG_CACHE_HOME": str(tmp_path)}) == tmp_path / "raytrain" / "kuberay-crds-v1.7.0"
    assert cache_dir({"HOME": str(tmp_path)}) == tmp_path / ".cache" / "raytrain" / "kuberay-crds-v1.7.0"


def test_resolution_order(tmp_path, crd_dir):
    flag, env_dir = stage(tmp_path / "flag", crd_dir), stage(tmp_path / "env", crd_dir)
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    cached = stage(cache_dir(env), crd_dir)
    assert resolve_crd_dir(str(flag), str(env_dir), env=env, base_url=UNREACHABLE) == flag
    assert resolve_crd_dir(None, str(env_dir), env=env, base_url=UNREACHABLE) == env_dir
    assert resolve_crd_dir(None, None, env=env, base_url=UNREACHABLE) == cached


def test_a_named_directory_without_the_files_is_an_error_not_a_fallback(tmp_path, crd_dir):
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    stage(cache_dir(env), crd_dir)
    for explicit, from_env, named in ((str(tmp_path / "empty"), None, "--crds"),
                                      (None, str(tmp_path / "empty"), "RAYTRAIN_KUBERAY_CRDS")):
        with pytest.raises(CRDError, match=f"{named} .*empty does not hold ray.io_rayclusters.yaml"):
            resolve_crd_dir(explicit, from_env, env=env, base_url=UNREACHABLE)


def test_download_into_the_cache_checked_by_sha256(tmp_path, crd_dir, serve):
    url = serve(stage(tmp_path / "site" / "bases", crd_dir).parent)
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    got = resolve_crd_dir(None, None, env=env, base_url=url)
    assert got == cache_dir(env)
    assert sorted(p.name for p in got.iterdir()) == sorted(CRD_FILES.values())  # no temp files left
    crd_validator(str(got), "RayJob")  # loads
    # a damaged cached file is fetched again
    (got / "ray.io_rayjobs.yaml").write_text("damaged")
    assert resolve_crd_dir(None, None, env=env, base_url=url) == got
    assert (got / "ray.io_rayjobs.yaml").read_bytes() == (crd_dir / "ray.io_rayjobs.yaml").read_bytes()


def test_a_download_that_is_not_the_pinned_file_is_refused(tmp_path, crd_dir, serve):
    site = stage(tmp_path / "site" / "bases", crd_dir)
    (site / "ray.io_rayjobs.yaml").write_text((crd_dir / "ray.io_rayjobs.yaml").read_text() + "\n# changed\n")
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    with pytest.raises(CRDError, match=r"ray.io_rayjobs.yaml is not KubeRay's v1.7.0 .* sha256 is [0-9a-f]{64}, "
                                       r"expected 01a5cf3b"):
        resolve_crd_dir(None, None, env=env, base_url=serve(site.parent))
    assert not (cache_dir(env) / "ray.io_rayjobs.yaml").exists()


def test_offline_without_the_crds_says_how_to_stage_them(tmp_path):
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    with pytest.raises(CRDError) as caught:
        resolve_crd_dir(None, None, env=env, base_url=UNREACHABLE)
    message = str(caught.value)
    assert not cache_dir(env).exists()  # nothing half-made is left
    assert "\n" not in message and "downloading" in message and str(cache_dir(env)) in message
    assert "--crds DIR" in message and "RAYTRAIN_KUBERAY_CRDS" in message and "raw.githubusercontent.com" in message


def test_parsed_crds_are_cached_by_content(tmp_path, crd_dir, monkeypatch):
    from raytrain.validator import crds

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    staged = stage(tmp_path / "crds", crd_dir)
    crds._load_crd.cache_clear()
    first = crds._load_crd(str(staged / "ray.io_rayjobs.yaml"))
    [parsed] = (tmp_path / "cache" / "raytrain" / "parsed-crds").iterdir()
    assert parsed.name == CRD_SHA256["ray.io_rayjobs.yaml"] + ".json"
    crds._load_crd.cache_clear()
    assert crds._load_crd(str(staged / "ray.io_rayjobs.yaml")) == first  # read back from the JSON
    crds._load_crd.cache_clear()


def test_defaults_are_applied_as_the_api_server_does(crd_dir):
    schema = openapi_schema(str(crd_dir), "RayCluster")
    group = {"groupName": "w", "template": {"spec": {"containers": [{"name": "ray", "image": "i"}]}}}
    obj = {"spec": {"headGroupSpec": {"template": {"spec": {"containers": [{"name": "ray", "image": "i"}]}}},
                    "workerGroupSpecs": [group]}}
    defaulted = apply_defaults(obj, schema)
    worker = defaulted["spec"]["workerGroupSpecs"][0]
    assert (worker["minReplicas"], worker["maxReplicas"], worker["numOfHosts"]) == (0, 2147483647, 1)
    assert "minReplicas" not in group  # the input is left alone
    given = apply_defaults({"spec": {"workerGroupSpecs": [group | {"minReplicas": 2}]}}, schema)
    assert given["spec"]["workerGroupSpecs"][0]["minReplicas"] == 2
