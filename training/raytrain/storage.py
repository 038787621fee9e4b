"""The storage path, checked before Ray starts: it must be a directory that this user can create files in.

A write is tried for real: os.access misses read-only mounts and NFS exports that squash or map users.
"""

from __future__ import annotations

import errno
import os
import uuid
from pathlib import Path

from raytrain.errors import UsageError


class StorageError(UsageError):
    """The storage path cannot hold runs; str() is one paragraph naming the path, the uid and the fix."""


def _who() -> str:
    return f"uid {os.geteuid()} (gid {os.getegid()})"


def _fix(path: Path) -> str:
    return (f"Fix: pass --storage a directory that {_who()} can write, or make {path} writable for it: on "
            f"Kubernetes the Ray pods run as uid 1000, gid 100, so the shared volume's export must let them "
            f"write (chown 1000:100 the export, or export it with all_squash,anonuid=1000,anongid=100).")


def _probe(directory: Path) -> None:
    probe = directory / f".raytrain-write-probe-{uuid.uuid4().hex}"
    probe.write_bytes(b"")
    probe.unlink()


def check_storage(storage_path: str, run_name: str = "", source: str = "run.storage_path") -> Path:
    """The storage directory (created if missing), or StorageError. With run_name, an existing run directory
    (perhaps left by another user) must be writable too."""
    if not storage_path:
        raise StorageError(f"{source} is empty. Fix: give a directory for runs, on a cluster the shared volume "
                           f"such as /mnt/shared/runs.")
    path = Path(storage_path).expanduser().absolute()
    try:
        path.stat()
    except FileNotFoundError:
        pass
    except OSError as err:  # a parent directory that this user may not enter
        raise StorageError(f"the storage path {path} ({source}) cannot be reached by {_who()}: {err.strerror}. "
                           f"{_fix(path)}") from None
    if path.exists() and not path.is_dir():
        raise StorageError(f"the storage path {path} ({source}) is a file, not a directory. Fix: pass --storage "
                           f"a directory (it is created if missing), e.g. {path.parent / 'runs'}.")
    run_path = path / run_name if run_name else None
    if run_path is not None and os.path.lexists(run_path) and not run_path.is_dir():
        raise StorageError(f"the run directory {run_path} ({source} and the run's name) is a file, not a directory. "
                           f"Fix: train under another --name, or move that file away.")
    target = path
    try:
        path.mkdir(parents=True, exist_ok=True)
        _probe(path)
        if run_name and (path / run_name).is_dir():
            target = path / run_name
            _probe(target)
    except OSError as err:
        if err.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise StorageError(f"the storage path {path} ({source}) cannot be used by {_who()}: "
                               f"{err.strerror or err}. {_fix(path)}") from None
        what = "is on a read-only file system" if err.errno == errno.EROFS else f"is not writable by {_who()}"
        existing = next(p for p in (target, *target.parents) if os.path.lexists(p))
        where = "" if existing == target else f" (it does not exist, and {existing} does not let it be created)"
        owner = f", owner uid {existing.stat().st_uid}" if err.errno != errno.EROFS else ""
        label = "run directory" if target != path else "storage path"
        raise StorageError(f"the {label} {target} ({source}{owner}) {what}{where}: {err.strerror}. "
                           f"{_fix(existing)}") from None
    return path
