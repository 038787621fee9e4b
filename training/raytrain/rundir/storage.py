"""Where runs are stored, and the storage path checked before Ray starts.

A storage path is a directory (a shared volume such as NFS on a cluster) or an object-store URL, `s3://bucket/prefix`
or `gs://bucket/prefix`, reached through fsspec (s3fs, gcsfs) with each cloud's standard credentials and endpoint
settings (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID..., IRSA or Workload Identity on a pod): none is ever in a run config.
`as_path` gives a run's paths one interface for both: a pathlib.Path, or a upath.UPath (pathlib's interface over
fsspec) for a URL. The few operations whose semantics differ between a POSIX directory and an object store live
here, side by side: writing an object whole, creating one only if absent, listing, removing a tree.

An object store has no rename and no append. What stands in for them (raytrain.rundir.atomicfile, raytrain.rundir.runrecords, raytrain.rundir.lease,
raytrain.checkpoint.checkpoints): a PUT replaces an object whole (what a rename gives a POSIX reader); a conditional PUT
(If-None-Match: *) creates a lease claim once; a checkpoint is uploaded from a local staging directory and committed
by its manifest, uploaded last. S3 and GCS read their own writes and list them at once (strong consistency), and
every listing here bypasses fsspec's listings cache.

A directory is checked by a write tried for real: os.access misses read-only mounts and NFS exports that squash or
map users. A URL is checked in shape (scheme, bucket, the filesystem package installed); a run's first write then
reaches it for real, and its error names the bucket and the settings to check.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any, Optional, Union

from raytrain.errors import UsageError

# The object stores a storage path may name, and the fsspec package that reaches each.
URL_SCHEMES = {"s3": "s3fs", "gs": "gcsfs"}
_URL = re.compile(r"^(?P<scheme>[a-z][a-z0-9+.-]*)://(?P<rest>[^/].*)$", re.DOTALL)
# What a mistyped URL looks like (a Windows drive letter is no storage path on a Ray node either)
_LOOSE_URL = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*):/+")
# S3's bucket naming rules (GCS's are a superset for the names people use): 3-63 of a-z 0-9 . -
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


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


def url_scheme(value: Union[str, os.PathLike, Any]) -> str:
    """The scheme of an object-store URL ("s3", "gs"), or "" for a local path."""
    match = _URL.match(str(value))
    return match.group("scheme") if match else ""


def is_remote(path: Any) -> bool:
    """Whether `path` (a str, a Path or a UPath) names an object-store location rather than a local directory."""
    return bool(url_scheme(path)) or getattr(path, "protocol", "") in URL_SCHEMES


def url_problem(storage_path: str) -> Optional[tuple[str, str]]:
    """(what is wrong, the fix) with an object-store URL's shape, or None: a known scheme, a bucket name, a prefix
    without '.' or '..' parts. Needs no package and makes no request (raytrain validate, the config check)."""
    loose = _LOOSE_URL.match(storage_path)
    if loose is None:
        return None
    match = _URL.match(storage_path)
    if match is None or loose.group("scheme").lower() != loose.group("scheme"):  # s3:/b, s3:///b, S3://b
        scheme = loose.group("scheme").lower()
        return (f"{loose.group(0)!r} is not how a URL begins",
                f"write {scheme}://BUCKET/PREFIX (lower case, two slashes), e.g. {scheme}://my-bucket/runs"
                if scheme in URL_SCHEMES else "give a directory, s3://BUCKET/PREFIX or gs://BUCKET/PREFIX")
    scheme, rest = match.group("scheme"), match.group("rest")
    if scheme not in URL_SCHEMES:
        return (f"{scheme}:// is not a storage raytrain can use",
                "give a directory (a shared volume on a cluster), s3://BUCKET/PREFIX or gs://BUCKET/PREFIX")
    bucket = rest.split("/", 1)[0]
    if not _BUCKET.match(bucket):
        return (f"{bucket!r} is not a bucket name (3-63 characters of a-z, 0-9, '.' and '-')",
                f"write it as {scheme}://BUCKET/PREFIX, e.g. {scheme}://my-bucket/runs")
    if any(part in (".", "..") for part in rest.split("/")[1:]) or "//" in rest or not rest.isprintable():
        return ("its prefix has an empty, '.' or '..' part, or a character that is not printable (a control "
                "character, bytes that are not UTF-8), which an object store would keep as a literal key", f"write the prefix out, e.g. {scheme}://{bucket}/runs")
    return None


def check_url(storage_path: str, source: str = "run.storage_path") -> None:
    """An object-store URL's shape (url_problem) and its fsspec package installed; no request is made."""
    problem = url_problem(storage_path)
    if problem is not None:
        raise StorageError(f"{source} is {storage_path!r}: {problem[0]}. Fix: {problem[1]}.")
    scheme = url_scheme(storage_path)
    package = URL_SCHEMES[scheme]
    try:
        __import__(package)
        __import__("upath")
    except ImportError:
        raise StorageError(f"{source} is {storage_path!r}, and {package} is not installed here. Fix: pip install "
                           f"'raytrain[object-storage]' (the raytrain image has it).") from None


def as_path(value: Union[str, os.PathLike, Any]) -> Path:
    """A run path: a pathlib.Path for a directory, a upath.UPath for an object-store URL. Typed as Path because
    UPath has pathlib's interface (read_bytes, write_text, glob, iterdir, stat, /); what it lacks (os.* calls, open(),
    rename, append) goes through this module's functions."""
    if getattr(value, "protocol", None) in URL_SCHEMES:
        return value  # already a UPath
    text = os.fspath(value) if isinstance(value, os.PathLike) else str(value)
    if not url_scheme(text):
        return Path(text)
    check_url(text)
    from upath import UPath

    # No listings cache: a lease's claims and a run's checkpoints are listed while other nodes write them. A connect
    # timeout of 10 s (botocore's is 60 s, per retry): an endpoint that drops packets fails a start in under a minute.
    options: dict[str, Any] = {"use_listings_cache": False}
    if url_scheme(text) == "s3":
        options["config_kwargs"] = {"connect_timeout": 10}
    return UPath(text.rstrip("/"), **options)  # type: ignore[return-value]


def _fs(path: Any) -> Any:
    return path.fs


def _key(path: Any) -> str:
    return path.path


def put_bytes(path: Path, data: bytes) -> None:
    """Replace the object at `path` whole (an object store's PUT is atomic: a reader sees the old object or this)."""
    _fs(path).pipe_file(_key(path), data)


def read_bytes(path: Path, attempts: int = 10) -> bytes:
    """The whole object (or file) at `path`, as one GET: S3 answers a GET with one version of the object whole, while
    s3fs's file reads (UPath.read_bytes) fetch ranges pinned to the ETag seen at open and raise FileExpired when a
    writer replaced the object in between, as rank 0 does metrics.jsonl and events.jsonl with each append. A
    FileExpired that still comes (a retried range) reads again."""
    if not is_remote(path):
        return Path(path).read_bytes()
    for _ in range(attempts - 1):
        try:
            return _fs(path).cat_file(_key(path))
        except OSError as err:
            if err.errno != errno.EBUSY:  # s3fs's FileExpired is an EBUSY
                raise
    return _fs(path).cat_file(_key(path))


def create_exclusive(path: Path, data: bytes) -> bool:
    """Create the object `path` holding `data` unless it exists (If-None-Match: *, and GCS's generation match):
    True if this call created it. Exactly one of several concurrent callers gets True."""
    try:
        _fs(path).pipe_file(_key(path), data, mode="create")
        return True
    except FileExistsError:  # s3fs's answer to 412 Precondition Failed
        return False


def append_bytes(path: Path, data: bytes, attempts: int = 20) -> None:
    """Append to an object: read it and PUT it back longer, only if nobody replaced it meanwhile (S3's If-Match on
    the ETag read; a lost race reads again). Two processes append to a run's events.jsonl (the driver and rank 0)."""
    fs, key = _fs(path), _key(path)
    if getattr(path, "protocol", "") != "s3":  # gs: generation preconditions are not reached through gcsfs here
        try:
            old = fs.cat_file(key)
        except FileNotFoundError:
            old = b""
        fs.pipe_file(key, old + data)
        return
    bucket, _, name = key.partition("/")
    for _ in range(attempts):
        try:
            etag: Optional[str] = fs.info(key, refresh=True)["ETag"]
            old = fs.cat_file(key)  # at least as new as the ETag: if it is newer, the conditional PUT fails
        except FileNotFoundError:
            etag, old = None, b""
        condition = {"IfMatch": etag} if etag else {"IfNoneMatch": "*"}
        try:
            fs.call_s3("put_object", Bucket=bucket, Key=name, Body=old + data, **condition)
            return
        except (FileExistsError, FileNotFoundError):  # 412 (or 404: deleted meanwhile): read again
            continue
        except OSError as err:
            if _precondition_failed(err):
                continue
            raise
    raise OSError(errno.EAGAIN, f"{path}: {attempts} appends in a row lost a race with other writers")


def _precondition_failed(err: OSError) -> bool:
    """s3fs turns S3's 412 into an OSError(EINVAL) with the service's message; the ClientError is its cause."""
    cause = getattr(err, "__cause__", None) or getattr(err, "__context__", None)
    code = (getattr(cause, "response", None) or {}).get("Error", {}).get("Code")
    return code in ("PreconditionFailed", "412") or "pre-condition" in str(err).lower()


# torch's zip writer (torch.save, and DCP's shards through it) turns a write the disk refused into its own error,
# "[enforce fail at inline_container.cc:NNN] . unexpected pos X vs Y" or "file write failed", losing the errno.
_SHORT_WRITE = re.compile(r"unexpected pos \d+ vs \d+|file write failed|PytorchStreamWriter failed writing",
                          re.IGNORECASE)
_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


def _chain(err: BaseException) -> list[BaseException]:
    """`err`, its causes and contexts, and DCP's per-worker failures (CheckpointException.failures), each once."""
    seen: list[BaseException] = []
    todo = [err]
    while todo and len(seen) < 50:
        current = todo.pop()
        if current is None or any(current is s for s in seen):
            continue
        seen.append(current)
        todo += [current.__cause__, current.__context__]
        failures = getattr(current, "failures", None)
        if isinstance(failures, dict):
            todo += [pair[0] if isinstance(pair, tuple) else pair for pair in failures.values()]
    return [e for e in seen if isinstance(e, BaseException)]


def mount_of(path: Path) -> Path:
    """The mount point of the filesystem `path` (or its nearest existing parent) is on."""
    path = Path(os.path.abspath(path))
    while not path.exists() and path != path.parent:
        path = path.parent
    while not os.path.ismount(path) and path != path.parent:
        path = path.parent
    return path


def disk_full(err: BaseException, where: Path) -> Optional[str]:
    """When `err` is a full disk while writing under local `where`, what to say first: "the disk is full at MOUNT
    (F free of T)". A full disk is an ENOSPC or EDQUOT anywhere in the error's chain, or torch's short write on a
    filesystem found with little space left (under 1 GiB or 2%: the errno is gone, the space is the evidence). None
    otherwise, and for an object store (its local staging is a path of its own)."""
    if is_remote(where):
        return None
    chain = _chain(err)
    refused = any(isinstance(e, OSError) and e.errno in _FULL_ERRNOS for e in chain)
    short = any(_SHORT_WRITE.search(str(e)) for e in chain)
    if not (refused or short):
        return None
    try:
        usage = shutil.disk_usage(mount_of(where))
    except OSError:
        return f"the disk is full at {where}" if refused else None
    if not refused and usage.free >= min(2**30, usage.total // 50):
        return None
    return f"the disk is full at {mount_of(where)} ({_bytes(usage.free)} free of {_bytes(usage.total)})"


def _bytes(count: int) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if count >= size:
            return f"{count / size:.1f} {unit}"
    return f"{count} B"


def upload_file(source: Path, target: Path) -> None:
    """Copy a local file to an object store (multipart for large files, by fsspec)."""
    _fs(target).put_file(str(source), _key(target))


def download_tree(source: Path, target: Path) -> None:
    """Copy an object-store prefix to a local directory (created)."""
    target.mkdir(parents=True, exist_ok=True)
    fs = _fs(source)
    base = _key(source).rstrip("/") + "/"
    for key in fs.find(base):
        local = target / key[len(base):]
        local.parent.mkdir(parents=True, exist_ok=True)
        fs.get_file(key, str(local))


def listdir(path: Path) -> list[str]:
    """The names directly under `path` ([] when there is none)."""
    if not is_remote(path):
        try:
            return os.listdir(path)
        except FileNotFoundError:
            return []
    try:
        return [entry.rstrip("/").rsplit("/", 1)[-1] for entry in _fs(path).ls(_key(path), detail=False,
                                                                                refresh=True)]
    except FileNotFoundError:
        return []


def list_tree(path: Path) -> dict[str, dict]:
    """Every object under an object-store prefix, in as few requests as the store allows: {key relative to `path`:
    {"size", "mtime"}}."""
    base = _key(path).rstrip("/") + "/"
    try:
        found = _fs(path).find(base, detail=True, refresh=True)
    except FileNotFoundError:
        return {}
    listed = {}
    for key, info in found.items():
        modified = info.get("LastModified") or info.get("updated") or info.get("mtime")
        stamp = modified.timestamp() if hasattr(modified, "timestamp") else 0.0
        listed[key[len(base):]] = {"size": info.get("size"), "mtime": stamp}
    return listed


def makedirs(path: Path) -> None:
    """A directory made where directories exist (an object store has only keys: nothing to do)."""
    if not is_remote(path):
        Path(path).mkdir(parents=True, exist_ok=True)


def remove_tree(path: Path) -> None:
    """Delete a directory or an object-store prefix and everything under it; errors ignored (as rmtree's
    ignore_errors): what is left is found again by the next look."""
    if not is_remote(path):
        shutil.rmtree(path, ignore_errors=True)
        return
    try:
        _fs(path).rm(_key(path), recursive=True)
    except (FileNotFoundError, OSError):
        pass


def local_root() -> Path:
    """This node's own directory for a run on an object store: staged uploads, datasets, Ray Train's scratch. Under
    the system's temporary directory (TMPDIR; an emptyDir on the chart's pods)."""
    return Path(tempfile.gettempdir()) / "raytrain-local"


def scratch_dir(purpose: str) -> Path:
    """A new local directory for what is staged here before an upload (a checkpoint, a driver log); the caller
    removes it."""
    base = local_root() / "scratch"
    base.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f"{purpose}-", dir=base))


def check_storage(storage_path: str, run_name: str = "", source: str = "run.storage_path") -> Path:
    """The storage directory (created if missing), or StorageError. With run_name, an existing run directory
    (perhaps left by another user) must be writable too. An object-store URL is checked in shape and reached once:
    a probe object written and deleted under the run's prefix."""
    if not storage_path:
        raise StorageError(f"{source} is empty. Fix: give a directory for runs, on a cluster the shared volume "
                           f"such as /mnt/shared/runs.")
    if url_scheme(storage_path) or url_problem(storage_path) is not None:  # s3:/b is a typo, not a directory
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
    check_url(storage_path, source)
    root = as_path(storage_path)
    target = root / run_name if run_name else root
    probe = target / f".raytrain-write-probe-{uuid.uuid4().hex}"
    try:
        put_bytes(probe, b"")
        _fs(probe).rm_file(_key(probe))
    except FileNotFoundError:
        raise StorageError(f"the storage path {storage_path} ({source}): its bucket does not exist (or these "
                           f"credentials cannot see it). Fix: create the bucket, or correct the URL.") from None
    except Exception as err:  # botocore, aiohttp and gcsfs raise their own types for a store that cannot be reached
        raise _unreachable(storage_path, source, err) from None
    return root
