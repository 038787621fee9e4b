"""The pre-start check of a storage path, before any run writes there: a directory this user can create files in
(a real write), else one paragraph with the uid and the fix; or an s3:// or gs:// URL in shape whose bucket answers
(a probe object), else one paragraph naming the URL, the settings and the fix. Also the reachability check of a run
directory a command names (report, export, track)."""

from __future__ import annotations

import errno
import os
import uuid
from pathlib import Path
from typing import Any

from raytrain.rundir import storage
from raytrain.rundir.storage import StorageError, as_path, is_remote, url_scheme


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
    (perhaps left by another user) must be writable too. An object-store URL is checked in shape and reached once:
    a probe object written and deleted under the run's prefix."""
    if not storage_path:
        raise StorageError(f"{source} is empty. Fix: give a directory for runs, on a cluster the shared volume "
                           f"such as /mnt/shared/runs.")
    if url_scheme(storage_path) or storage.url_problem(storage_path) is not None:  # s3:/b is a typo, not a directory
        return _check_object_store(storage_path, run_name, source)
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


def check_reachable(path: Path, source: str) -> Path:
    """For commands that read a run on an object store (report, export, track): the run's prefix can be listed
    with this environment's credentials, else StorageError in one paragraph (never the SDK's traceback)."""
    if not is_remote(path):
        return path
    path = as_path(path)
    try:
        path.exists()
    except Exception as err:
        raise _unreachable(str(path), source, err) from None
    return path


def _unreachable(url: str, source: str, err: BaseException) -> StorageError:
    if isinstance(err, PermissionError):
        return StorageError(f"the storage path {url} ({source}) refused this request: {err}. Fix: give these "
                            f"credentials s3:PutObject, GetObject, DeleteObject and ListBucket on the prefix (on "
                            f"Kubernetes, the service account's IRSA role or Workload Identity binding).")
    return StorageError(f"the storage path {url} ({source}) cannot be reached: {err.__class__.__name__}: "
                        f"{str(err)[:300]}. Fix: check the endpoint and credentials in the environment "
                        f"(AWS_ENDPOINT_URL for an S3-compatible store such as MinIO, AWS_ACCESS_KEY_ID/"
                        f"AWS_SECRET_ACCESS_KEY or the pod's IRSA role; for gs://, GOOGLE_APPLICATION_CREDENTIALS or "
                        f"Workload Identity).")


def _check_object_store(storage_path: str, run_name: str, source: str) -> Path:
    """A write and a delete of a probe object under the run's prefix: the bucket exists and these credentials may
    write there. Every failure is one paragraph naming the URL and what to check."""
    storage.check_url(storage_path, source)
    root = as_path(storage_path)
    target = root / run_name if run_name else root
    probe = target / f".raytrain-write-probe-{uuid.uuid4().hex}"
    try:
        storage.put_bytes(probe, b"")
        storage.filesystem(probe).rm_file(storage.object_key(probe))
    except FileNotFoundError:
        raise StorageError(f"the storage path {storage_path} ({source}): its bucket does not exist (or these "
                           f"credentials cannot see it). Fix: create the bucket, or correct the URL.") from None
    except Exception as err:  # botocore, aiohttp and gcsfs raise their own types for a store that cannot be reached
        raise _unreachable(storage_path, source, err) from None
    return root


def run_dir_for(ref: Any, command: str) -> Path:
    """A run directory named on the command line: a local path made absolute, or a URL checked reachable (one
    paragraph naming the URL and the settings when it is not)."""
    return check_reachable(storage.run_path(ref), command)
