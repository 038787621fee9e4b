"""Where runs are stored, and the storage path checked before Ray starts.

A storage path is a directory (a shared volume such as NFS on a cluster) or an object-store URL, `s3://bucket/prefix`
or `gs://bucket/prefix`, reached through fsspec (s3fs, gcsfs) with each cloud's standard credentials and endpoint
settings (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID..., IRSA or Workload Identity on a pod): none is ever in a run config.
`as_path` gives a run's paths one interface for both: a pathlib.Path, or a upath.UPath (pathlib's interface over
fsspec) for a URL. The few operations whose semantics differ between a POSIX directory and an object store live
here, side by side: writing an object whole, creating one only if absent, listing, removing a tree.

An object store has no rename and no append. What stands in for them (raytrain.rundir.atomicfile, raytrain.rundir.runrecords, raytrain.rundir.lease,
raytrain.rundir.checkpointstore): a PUT replaces an object whole (what a rename gives a POSIX reader); a conditional PUT
(If-None-Match: *) creates a lease claim once; a checkpoint is uploaded from a local staging directory and committed
by its manifest, uploaded last. S3 and GCS read their own writes and list them at once (strong consistency), and
every listing here bypasses fsspec's listings cache.

A directory is checked by a write tried for real: os.access misses read-only mounts and NFS exports that squash or
map users. A URL is checked in shape (scheme, bucket, the filesystem package installed); a run's first write then
reaches it for real, and its error names the bucket and the settings to check.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Optional, Union

from raytrain.errors import LaunchError, UsageError

# The object stores a storage path may name, and the fsspec package that reaches each.
URL_SCHEMES = {"s3": "s3fs", "gs": "gcsfs"}
_URL = re.compile(r"^(?P<scheme>[a-z][a-z0-9+.-]*)://(?P<rest>[^/].*)$", re.DOTALL)
# What a mistyped URL looks like (a Windows drive letter is no storage path on a Ray node either)
_LOOSE_URL = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*):/+")
# Bucket naming rules, which the store enforces at CreateBucket (so no bucket of another name exists to write to).
# S3 (docs.aws.amazon.com/AmazonS3/latest/userguide/bucketnamingrules.html, general purpose buckets): 3-63 of
# a-z 0-9 . -, a letter or digit at each end, no '..', not an IPv4 address, none of the prefixes and suffixes S3
# keeps for itself. GCS (cloud.google.com/storage/docs/buckets#naming): '_' too, dotted names up to 222 with each
# dot-separated part at most 63, not an IPv4 address, not beginning with 'goog' nor holding 'google'.
_BUCKET = {"s3": re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$"),
           "gs": re.compile(r"^[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]$")}
_IPV4 = re.compile(r"^\d{1,3}(\.\d{1,3}){3}$")
_S3_RESERVED_PREFIXES = ("xn--", "sthree-", "amzn-s3-demo-")
# Not refused: "-s3alias" (an access point's alias works wherever a bucket name does for object operations, and some
# IAM setups grant access only through one) and "--x-s3" (a directory bucket's own name).
_S3_RESERVED_SUFFIXES = ("--ol-s3", ".mrap", "--table-s3")


def bucket_problem(scheme: str, bucket: str) -> Optional[str]:
    """Why `bucket` is not a bucket name the store (s3 or gs) accepts, or None. One rule for `raytrain run`'s start
    and `raytrain validate` (both through url_problem)."""
    if not _BUCKET[scheme].match(bucket):
        if scheme == "gs":
            return "3-63 characters of a-z, 0-9, '.', '-' and '_' (222 with dots), a letter or digit at each end"
        return "3-63 characters of a-z, 0-9, '.' and '-', a letter or digit at each end"
    if ".." in bucket:
        return "two periods in a row"
    if _IPV4.match(bucket):
        return "it is written as an IP address"
    if scheme == "s3":
        reserved = [p for p in _S3_RESERVED_PREFIXES if bucket.startswith(p)]
        reserved += [s for s in _S3_RESERVED_SUFFIXES if bucket.endswith(s)]
        if reserved:
            return f"S3 keeps names {'beginning' if bucket.startswith(reserved[0]) else 'ending'} with " \
                   f"'{reserved[0]}' for itself"
    elif any(len(part) > 63 for part in bucket.split(".")):
        return "a dot-separated part is longer than 63 characters"
    elif bucket.startswith("goog") or "google" in bucket:
        return "GCS keeps names beginning with 'goog' or holding 'google' for Google"
    return None


class StorageError(UsageError):
    """The storage path cannot hold runs; str() is one paragraph naming the path, the uid and the fix."""


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
    why = bucket_problem(scheme, bucket)
    if why is not None:
        return (f"{bucket!r} is not a bucket name {'S3' if scheme == 's3' else 'GCS'} accepts ({why})",
                f"give the name of your bucket as {scheme}://BUCKET/PREFIX, e.g. {scheme}://my-bucket/runs")
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

    return UPath(text.rstrip("/"), **fsspec_options(text))  # type: ignore[return-value]


# S3's own advice (and the AWS SDKs' "standard" retry mode): a 500, 502, 503 (SlowDown), 504, a throttling code or a
# dropped connection is retried, each wait drawn at random up to 2**attempt seconds (full jitter), capped at 20 s.
# Six attempts ride out about 15 s of such answers (31 s at most) where botocore's default legacy mode gave up
# after five; then the error is raised. The one retry policy for every request raytrain (and DCP's writer of
# sharded checkpoints) makes to an object store: nothing above it retries these again. AWS_MAX_ATTEMPTS, the SDKs'
# own setting, still decides the attempts where it is set (an explicit botocore Config would otherwise override it).
S3_RETRIES = {"mode": "standard", "max_attempts": 6}


def s3_retries() -> dict[str, Any]:
    retries = dict(S3_RETRIES)
    attempts = os.environ.get("AWS_MAX_ATTEMPTS", "").strip()
    if attempts.isdigit() and int(attempts) >= 1:
        retries["max_attempts"] = int(attempts)
    return retries


def fsspec_options(url: str) -> dict[str, Any]:
    """The filesystem options of every client raytrain opens on an object store (upath.UPath, DCP's fsspec reader
    and writer): no listings cache (a lease's claims and a run's checkpoints are listed while other nodes write
    them); on S3 the retry policy above (s3_retries) and a connect timeout of 10 s (botocore's is 60 s per attempt: an endpoint
    that drops packets fails a start in under a minute)."""
    options: dict[str, Any] = {"use_listings_cache": False}
    if url_scheme(url) == "s3":
        options["config_kwargs"] = {"connect_timeout": 10, "retries": s3_retries()}
    return options


def filesystem(path: Any) -> Any:
    return path.fs


def object_key(path: Any) -> str:
    return path.path


def put_bytes(path: Path, data: bytes) -> None:
    """Replace the object at `path` whole (an object store's PUT is atomic: a reader sees the old object or this)."""
    filesystem(path).pipe_file(object_key(path), data)


def read_bytes(path: Path, attempts: int = 10) -> bytes:
    """The whole object (or file) at `path`, as one GET: S3 answers a GET with one version of the object whole, while
    s3fs's file reads (UPath.read_bytes) fetch ranges pinned to the ETag seen at open and raise FileExpired when a
    writer replaced the object in between, as rank 0 does metrics.jsonl and events.jsonl with each append. A
    FileExpired that still comes (a retried range) reads again."""
    if not is_remote(path):
        return Path(path).read_bytes()
    for _ in range(attempts - 1):
        try:
            return filesystem(path).cat_file(object_key(path))
        except OSError as err:
            if err.errno != errno.EBUSY:  # s3fs's FileExpired is an EBUSY
                raise
    return filesystem(path).cat_file(object_key(path))


def read_bytes_from(path: Path, start: int) -> bytes:
    """The bytes of the object (or file) at `path` from offset `start` on, as one ranged GET: a follower of a growing
    log reads only what is new. b"" when there is nothing there (yet)."""
    try:
        if not is_remote(path):
            with open(path, "rb") as handle:
                handle.seek(start)
                return handle.read()
        return filesystem(path).cat_file(object_key(path), start=start) if size_of(path) > start else b""
    except FileNotFoundError:
        return b""


def size_of(path: Path) -> int:
    """The size in bytes of the file (or object) at `path`; 0 when there is none (yet)."""
    try:
        if not is_remote(path):
            return os.path.getsize(path)
        return int(filesystem(path).info(object_key(path), refresh=True)["size"])
    except FileNotFoundError:
        return 0


def create_exclusive(path: Path, data: bytes) -> bool:
    """Create the object `path` holding `data` unless it exists (If-None-Match: *, and GCS's generation match):
    True if this call created it. Exactly one of several concurrent callers gets True."""
    try:
        filesystem(path).pipe_file(object_key(path), data, mode="create")
        return True
    except FileExistsError:  # s3fs's answer to 412 Precondition Failed
        return False


def append_bytes(path: Path, data: bytes, attempts: int = 20) -> None:
    """Append to an object: read it and PUT it back longer, only if nobody replaced it meanwhile (S3's If-Match on
    the ETag read; a lost race reads again). Two processes append to a run's events.jsonl (the driver and rank 0)."""
    fs, key = filesystem(path), object_key(path)
    if getattr(path, "protocol", "") != "s3":  # gs: generation preconditions are not reached through gcsfs here
        try:
            old = fs.cat_file(key)
        except FileNotFoundError:
            old = b""
        fs.pipe_file(key, old + data)
        return
    bucket, _, name = key.partition("/")
    for attempt in range(attempts):
        try:
            etag: Optional[str] = fs.info(key, refresh=True)["ETag"]
            old = fs.cat_file(key)  # at least as new as the ETag: if it is newer, the conditional PUT fails
        except FileNotFoundError:
            etag, old = None, b""
        condition = {"IfMatch": etag} if etag else {"IfNoneMatch": "*"}
        try:
            fs.call_s3("put_object", Bucket=bucket, Key=name, Body=old + data, **condition)
            return
        except FileExistsError:  # 412: another writer's append landed first: read again
            continue
        except FileNotFoundError:  # 404: the object was deleted meanwhile (read again), or its bucket was
            if attempt == 0 and not _bucket_exists(fs, bucket):
                raise bucket_missing(path) from None
            continue
        except OSError as err:
            if _precondition_failed(err):
                continue
            raise
    raise OSError(errno.EAGAIN, f"{path}: {attempts} appends in a row lost a race with other writers")


def _bucket_exists(fs: Any, bucket: str) -> bool:
    try:
        fs.call_s3("head_bucket", Bucket=bucket)
        return True
    except FileNotFoundError:
        return False
    except Exception:  # another answer (a permission, an outage) is not a missing bucket: the caller's error stands
        return True


def bucket_missing(path: Any) -> StorageError:
    bucket = object_key(path).split("/", 1)[0]
    return StorageError(f"the bucket {bucket} of {path} does not exist any more (deleted while the run wrote to it, "
                        f"or these credentials can no longer see it): nothing more of the run can be saved there. "
                        f"Fix: create the bucket again (or correct the storage path) and run the same command again; "
                        f"what was in the deleted bucket is gone.")


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
    filesystem(target).put_file(str(source), object_key(target))


def download_tree(source: Path, target: Path) -> None:
    """Copy an object-store prefix to a local directory (created)."""
    target.mkdir(parents=True, exist_ok=True)
    fs = filesystem(source)
    base = object_key(source).rstrip("/") + "/"
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
        return [entry.rstrip("/").rsplit("/", 1)[-1] for entry in filesystem(path).ls(object_key(path), detail=False,
                                                                                refresh=True)]
    except FileNotFoundError:
        return []


def list_tree(path: Path) -> dict[str, dict]:
    """Every object under an object-store prefix, in as few requests as the store allows: {key relative to `path`:
    {"size", "mtime"}}."""
    base = object_key(path).rstrip("/") + "/"
    try:
        found = filesystem(path).find(base, detail=True, refresh=True)
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


def fsync_dir(directory: Path) -> None:
    """A directory's entries (a rename, a new file) made durable; an object store's writes are durable when they
    return: nothing to do. Best effort: a filesystem that cannot fsync a directory is left as it is."""
    if is_remote(directory):
        return
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def remove_tree(path: Path) -> None:
    """Delete a directory or an object-store prefix and everything under it; errors ignored (as rmtree's
    ignore_errors): what is left is found again by the next look."""
    if not is_remote(path):
        shutil.rmtree(path, ignore_errors=True)
        return
    try:
        filesystem(path).rm(object_key(path), recursive=True)
    except (FileNotFoundError, OSError):
        pass


def local_root() -> Path:
    """This node's own directory for a run on an object store: staged uploads, datasets, Ray Train's scratch. Under
    the system's temporary directory (TMPDIR; an emptyDir on the chart's pods)."""
    return Path(tempfile.gettempdir()) / "raytrain-local"


def nodes_share(storage_path: Any) -> bool:
    """Whether every node sees the files under `storage_path` as this one does (a shared volume, or one machine), as
    opposed to an object store: what one node prepared beside it (a dataset) every other node must then prepare."""
    return not is_remote(storage_path)


def beside_on_this_node(storage_path: Any, name: str) -> Path:
    """A directory for `name` that this node can use as a plain filesystem: STORAGE/name where the storage is a
    directory (shared by every node that mounts it), else this node's own local_root()/name."""
    return local_root() / name if is_remote(storage_path) else Path(storage_path).absolute() / name


def output_dir(path: Any) -> Path:
    """Where a command writes what it derives from a run (a report, an exported model): beside the run when it is a
    directory here, else the current directory."""
    return Path.cwd() if is_remote(path) else Path(path).expanduser().absolute()


def run_path(ref: Any) -> Path:
    """A run directory named by a user: a local path made absolute (~ expanded), or the URL's UPath."""
    return as_path(ref) if is_remote(ref) else Path(ref).expanduser().absolute()


def run_scratch(run_dir: Any, name: str) -> Path:
    """A directory on this node's filesystem for a run's files that need no object store (Ray Train's own):
    RUN_DIR/name where the run is a directory, else local_root()/name/RUN_NAME."""
    return local_root() / name / as_path(run_dir).name if is_remote(run_dir) else Path(run_dir) / name


def is_full(err: OSError) -> bool:
    """A write failed for want of space (the disk, or the user's quota)."""
    return err.errno in _FULL_ERRNOS


def staging_full(staging: Path, err: OSError) -> "StagingFull":
    """The error for a local staging directory that filled (not the bucket's: an object store has no full disk)."""
    return StagingFull(f"the local staging directory {staging} is full ({err.strerror or err}): a checkpoint is "
                       f"written there before its upload, and nothing of it was committed. Fix: free space in "
                       f"{local_root()} (TMPDIR; on Kubernetes the Ray pods' /tmp emptyDir, whose sizeLimit must hold "
                       f"two checkpoints), or point TMPDIR at a larger disk; then run the same command again to "
                       f"resume from the newest committed checkpoint.")


class StagingFull(LaunchError):
    """A node's local staging directory for uploads filled up; str() names it and the fix."""


# The scratch directories this process made, each held by an flock on its own descriptor: a process that is killed
# lets go of its locks, so the next start on the node knows its directories are no one's (remove_stale_scratch).
_held: dict[str, int] = {}
# Changed more recently, a directory may be one whose maker has not locked it yet (microseconds), or a writer's
# that does not lock (a raytrain before this one on the same node)
STALE_AFTER_S = 30.0


def scratch_dir(purpose: str) -> Path:
    """A new local directory for what is staged here before an upload (a checkpoint, a driver log); the caller
    removes it. It is locked while this process lives (see remove_stale_scratch)."""
    for made, fd in list(_held.items()):  # the ones removed since: let their descriptors go
        if not os.path.isdir(made):
            os.close(_held.pop(made))
    base = local_root() / "scratch"
    base.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix=f"{purpose}-", dir=base))
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    _held[str(path)] = fd
    return path


def _newest_change(directory: Path) -> float:
    """The newest modification time in a (small) tree: something written into it just now is someone's."""
    newest = directory.stat().st_mtime
    for parent, directories, files in os.walk(directory):
        for name in directories + files:
            try:
                newest = max(newest, os.stat(os.path.join(parent, name)).st_mtime)
            except OSError:
                pass
    return newest


def remove_stale_scratch() -> list[Path]:
    """Remove this node's scratch directories that no live process holds: staged checkpoints and logs of attempts
    (or workers) that were killed before they could remove them. Called by every start (the driver's, each
    worker's); a directory a live process made stays."""
    base = local_root() / "scratch"
    try:
        entries = list(base.iterdir())
    except OSError:
        return []
    removed = []
    for entry in entries:
        if str(entry) in _held:
            continue
        try:
            fd = os.open(entry, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if time.time() - _newest_change(entry) < STALE_AFTER_S:
                continue
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
        except OSError:  # held by a live process (BlockingIOError), or gone meanwhile
            continue
        finally:
            os.close(fd)
    return removed
