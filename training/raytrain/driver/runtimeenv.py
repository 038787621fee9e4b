"""How the user's code reaches the workers: a driver joining a cluster from outside ships, as its runtime env's
working_dir, the working directory the config's components were imported from, without the Python environments and
Ray temporary directories in it and within a bound on its size; an embedded Ray or a submitted job ships nothing.
"""

from __future__ import annotations

import os
import sysconfig
import tempfile
from pathlib import Path
from typing import Optional

from raytrain.errors import ConfigError
from raytrain.platform.rayinternals import walk_working_dir
from raytrain.spec import components, workdir
from raytrain.spec.sections import RunConfig

# Never shipped with the user's code: version control, environments, caches and run output.
SHIP_EXCLUDES = [".git", ".venv", "venv", "__pycache__", "*.pyc", ".pytest_cache", ".mypy_cache", "runs", "*.pt",
                 "*.ckpt"]


# A working_dir Ray ships is zipped whole into its GCS (at most its gRPC message size, 512 MiB) and unpacked on every
# node: bound what raytrain measures well below where it would take the machine's disk or memory with it, and the
# walk's time with it (a home directory's caches hold hundreds of thousands of files).
SHIP_LIMIT_BYTES = 512 * 1024 * 1024
SHIP_LIMIT_FILES = 50_000


class _TooBig(Exception):
    pass


def in_environment(path: Path) -> bool:
    """Whether `path` lies in an installed Python environment (a venv of any name, a conda environment or
    installation, site-packages) or is raytrain's own package (which the workers' image installs): a component
    found there is not the user's code, and never a reason to ship a directory."""

    path = path.resolve()
    ours = Path(__file__).resolve().parents[1]  # the raytrain package (this module is in its driver/ room)
    # The library folders themselves, not sys.prefix: a Python installed with --prefix=$HOME would make every
    # project in the home directory an "environment".
    roots = {Path(p).resolve() for p in (sysconfig.get_paths().get(k) for k in ("purelib", "platlib", "stdlib")) if p}
    if any(r == path or r in path.parents for r in (ours, *roots)):
        return True
    return any(_is_environment(parent) for parent in path.parents)


def _is_environment(directory: Path) -> bool:
    """A Python environment's root (pyvenv.cfg: any venv or virtualenv; conda-meta: a conda environment or
    installation) or its packages folder."""
    return (directory.name in ("site-packages", "dist-packages") or (directory / "pyvenv.cfg").is_file()
            or (directory / "conda-meta").is_dir())


def _is_ray_temp(directory: Path) -> bool:
    """Ray's temporary directory (its sessions, logs, sockets and the packages it unpacks), wherever it is."""

    default = Path(os.environ.get("RAY_TMPDIR") or tempfile.gettempdir()) / "ray"
    return (directory / "session_latest").exists() or directory == default


def user_code_dir(cfg: RunConfig) -> Optional[Path]:
    """The working directory, if any component of the config was imported from it (the code workers need) and not
    from an installed environment inside it."""
    directory = workdir.current()
    if directory is None:
        return None
    for component in cfg.components():
        module = components.module_file(component.path)
        if module is not None and directory in module.parents and not in_environment(module):
            return directory
    return None


def ship_plan(directory: Path, limit_bytes: int = SHIP_LIMIT_BYTES,
              limit_files: int = SHIP_LIMIT_FILES) -> list[str]:
    """The excludes with which `directory` ships as a runtime env's working_dir: SHIP_EXCLUDES, and every Python
    environment or Ray temporary directory found under it (anchored, so a folder of the same name elsewhere still
    ships). Measured as Ray will walk it (.gitignore and .rayignore honoured); one paragraph (ConfigError) when what
    remains exceeds `limit_bytes` or `limit_files`, found without walking further than the bound."""

    found: list[str] = []
    total = {"bytes": 0, "files": 0}

    def skip(path: Path) -> bool:
        if path != directory and path.is_dir() and not path.is_symlink() and (
                _is_environment(path) or _is_ray_temp(path)):
            found.append("/" + path.relative_to(directory).as_posix())
            return True
        return False

    def visit(path: Path) -> None:
        if path.is_symlink() or not path.is_file():
            return
        total["files"] += 1
        total["bytes"] += path.stat().st_size
        if total["bytes"] > limit_bytes or total["files"] > limit_files:
            raise _TooBig

    try:
        walk_working_dir(directory, list(SHIP_EXCLUDES), skip, visit)
    except _TooBig:
        raise ConfigError(
            f"raytrain would ship {directory} to the cluster as your code (a component of the config is imported "
            f"from it), but it holds more than {_size(limit_bytes)} or {limit_files} files ({_size(total['bytes'])} "
            f"in {total['files']} files before raytrain stopped counting): that is data, caches or environments, "
            f"not code. Fix: run from your project's directory or give it with --working-dir DIR, or leave the large "
            f"paths out with a .rayignore (or .gitignore) file in {directory}.") from None
    except OSError as err:
        raise ConfigError(f"raytrain cannot read {directory} to ship it to the cluster as your code: {err}. Fix: "
                          f"give your project's directory with --working-dir DIR.") from None
    return [*SHIP_EXCLUDES, *found]


def _size(count: int) -> str:
    return f"{count / 2**20:.0f} MiB" if count < 2**30 else f"{count / 2**30:.1f} GiB"


def runtime_env(cfg: RunConfig, embedded: bool, in_submitted_job: bool) -> dict:
    """How the user's code reaches the workers. An embedded Ray's workers inherit the driver's PYTHONPATH (set by
    the launcher); a submitted Ray job brings its own runtime env (`ray job submit --working-dir`, a RayJob's
    runtimeEnvYAML); a driver joining a cluster from outside ships the working directory, without the environments
    and Ray temporary directories in it, within ship_plan's bound."""
    directory = user_code_dir(cfg)
    if directory is None or embedded or in_submitted_job:
        return {}
    return {"working_dir": str(directory), "excludes": ship_plan(directory)}
