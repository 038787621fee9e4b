"""Checkpoints: the protocol every checkpointer follows, and the single-file checkpointer.

A checkpointer saves a training state at a position (the last completed epoch, and steps into the next one for a
mid-epoch checkpoint), commits it atomically and fenced, finds the newest complete one, loads it and prunes old
ones. The run's workers call `save` at the same step; what each writes is the checkpointer's business (the
single-file one: rank 0 writes the whole state; a sharded one: every rank its shards).

`FileCheckpointer`, the single-file checkpointer, writes into the run directory itself:
  .staging-checkpoint_<...>/  state.pt (model, optimizer, position, resolved config, extra state; its sha256
                              computed while it is written, never by reading it back), then meta.json (the
                              manifest: format, position, sha256, size, config, attempt), each fsynced;
  checkpoint_<...>/           the same directory renamed into place: the commit. The rename happens only after
                              the run's fence passed (raytrain.rundir.runcontrol), by the lease holder's rank 0.
A directory checkpoint (a Ray Train function's `ray.train.report(..., checkpoint=...)`: raytrain.worker.raytrain_function)
is committed the same way: its files are copied into `.staging-checkpoint_<...>/data/` (each file's sha256 computed
while it is copied), then meta.json names every file with its size and sha256 (`files`, instead of the single-file
`sha256`/`size`), then the same fenced rename and the same pruning.
So a `checkpoint_*` directory was always completely written; a `.staging-*` one provably never was (a crash, a full
disk, a lost lease mid-write) and is removed by the next lease holder.

On an object store (raytrain.rundir.storage), which has no rename, the staging directory is local (under TMPDIR) and the
commit is an upload: every file, then, after the fence passed once more, meta.json last. Which of the two a run
directory is, and what differs (where a checkpoint is staged, how it is committed, listed and cleaned up), is
raytrain.rundir.checkpointstore's: this module calls it and never asks. A `checkpoint_*` prefix
without meta.json is a torn upload (a kill, a lost lease or a full quota midway): never listed as committed, and
removed by the next lease holder as a staging directory is. A committed checkpoint whose files were
damaged later is never deleted: it is verified another way where it can be (a damaged meta.json beside a state.pt
that loads) and otherwise skipped with a warning; a start with checkpoints none of which loads is refused
(raytrain.checkpoint.resume). Pruning keeps the newest `keep` complete checkpoints of the run, whichever attempt wrote them.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Protocol

from raytrain.rundir import checkpointstore, layout, storage
from raytrain.rundir.runcontrol import UNFENCED, Control

STATE_FILE = "state.pt"
META_FILE = layout.MANIFEST_FILE
DATA_DIR = "data"  # a directory checkpoint's files, as the function reported them
SHARDS_DIR = "shards"  # a sharded checkpoint's DCP files (raytrain.checkpoint.sharded)
FORMAT = 2


class CheckpointUnreadable(Exception):
    pass


@dataclass(frozen=True, order=True)
class Position:
    """Where a checkpoint was taken: `epoch` completed, then `step` batches into the next one (0: at its start)."""

    epoch: int
    step: int = 0


@dataclass
class Loaded:
    path: Path
    state: dict
    warning: Optional[str] = None  # how it was verified when its manifest was damaged


class Checkpointer(Protocol):
    """What the Session asks of the single-file checkpointer; the run control fences every commit. The sharded one
    (raytrain.checkpoint.sharded) saves from the model and optimizer themselves on every worker and loads into
    them, and commits and prunes the same way."""

    def save(self, position: Position, state: Callable[[], dict], *, writer: bool) -> Optional[Path]:
        """Called by every worker at the same step. `state` builds this worker's state (called only where it is
        written); writer: this worker writes (the single-file checkpointer: rank 0). Returns the committed path."""

    def latest(self) -> list[Path]:
        """Committed checkpoints, newest position first (complete ones; a damaged one is found by load)."""

    def load_newest(self, warn: Callable[[str], None]) -> Optional[Loaded]:
        """The newest checkpoint that loads and verifies; each skipped one reported through `warn`."""

    def prune(self, keep: int) -> None:
        """Delete complete checkpoints beyond the newest `keep`."""


def checkpoint_dir_name(position: Position) -> str:
    # Unique per save: a retrained position never overwrites (or is pruned together with) an older copy.
    at = f"_step{position.step:08d}" if position.step else ""
    return f"{layout.CHECKPOINT_PREFIX}epoch{position.epoch:06d}{at}_{uuid.uuid4().hex[:8]}"


class _HashingWriter(io.RawIOBase):
    """A file that hashes what is written through it: the sha256 of state.pt without reading it back."""

    def __init__(self, handle: Any):
        self.handle, self.digest, self.size = handle, hashlib.sha256(), 0
        self.error: Optional[OSError] = None  # torch turns a failed write into a RuntimeError: keep the cause

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self.digest.update(view)
        self.size += len(view)
        try:
            return self.handle.write(view)
        except OSError as err:
            self.error = err
            raise

    def flush(self) -> None:
        self.handle.flush()


def write_checkpoint(directory: Path, state: dict, *, config: dict, attempt: Optional[int] = None) -> None:
    """Write state.pt then meta.json into `directory` (a staging directory), both durable. `state` holds at least
    "epoch" and "step"; its sha256 is computed while it is written."""
    import torch

    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / STATE_FILE, "wb") as handle:
        writer = _HashingWriter(handle)
        try:
            torch.save(state, writer)
            handle.flush()
            os.fsync(handle.fileno())
        except Exception:
            if writer.error is not None:  # a full or read-only disk: say that, not torch's "unexpected pos"
                error = writer.error  # a failed write() names no file: the driver's message names where
                raise OSError(error.errno, error.strerror, str(directory / STATE_FILE)) from None
            raise
    meta = {"format": FORMAT, "epoch": int(state["epoch"]), "step": int(state.get("step") or 0),
            "sha256": writer.digest.hexdigest(), "size": writer.size, "config": config, "attempt": attempt}
    with open(directory / META_FILE, "w", encoding="utf-8") as handle:
        handle.write(json.dumps(meta))
        handle.flush()
        os.fsync(handle.fileno())
    storage.fsync_dir(directory)


def read_meta(directory: Path) -> dict:
    try:
        meta = json.loads((directory / META_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise CheckpointUnreadable(f"{META_FILE} missing or invalid ({err.__class__.__name__})") from None
    if not isinstance(meta, dict) or not (isinstance(meta.get("sha256"), str) or is_directory_manifest(meta)
                                          or is_sharded_manifest(meta)):
        raise CheckpointUnreadable(f"{META_FILE} is not a checkpoint's metadata")
    for key in ("epoch", "step"):
        value = meta.get(key, 0 if key == "step" else None)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
            raise CheckpointUnreadable(f"{META_FILE}'s {key} is {value!r}, not a count")
    if not isinstance(meta.get("epoch"), int):
        raise CheckpointUnreadable(f"{META_FILE} names no epoch")
    return meta


def is_directory_manifest(meta: dict) -> bool:
    """A manifest that names files (a directory checkpoint) rather than the single state.pt."""
    files = meta.get("files")
    return meta.get("kind") != "sharded" and isinstance(files, dict) and all(  # a sharded one hashes its files too
        isinstance(entry, dict) and isinstance(entry.get("sha256"), str) and isinstance(entry.get("size"), int)
        for entry in files.values())


def is_sharded_manifest(meta: dict) -> bool:
    """A sharded checkpoint's manifest (raytrain.checkpoint.sharded): files under the checkpoint, each with its size
    (and a sha256 where one was computed as it was written)."""
    files = meta.get("files")
    return meta.get("kind") == "sharded" and isinstance(files, dict) and all(
        isinstance(entry, dict) and isinstance(entry.get("size"), int) for entry in files.values())


def _listed_files(directory: Path, meta: dict) -> dict[str, tuple[Path, dict]]:
    """{name as the manifest says it: (path, entry)} of a directory or sharded checkpoint's manifest."""
    base = directory if is_sharded_manifest(meta) else directory / DATA_DIR
    prefix = "" if is_sharded_manifest(meta) else f"{DATA_DIR}/"
    return {f"{prefix}{name}": (base / name, entry) for name, entry in meta["files"].items()}


def copy_tree_hashed(source: Path, destination: Path) -> dict[str, dict]:
    """Copy every regular file under `source` into `destination` (made if missing), each durable and hashed while
    it is copied. Each file lands by an atomic replace, so that workers copying the same file name into one staging
    directory never interleave. Returns {relative path: {"size", "sha256"}}."""
    files: dict[str, dict] = {}
    source = Path(source)
    for path in sorted(source.rglob("*")):
        if not path.is_file():
            continue
        relative = path.relative_to(source).as_posix()
        target = destination / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}.partial")
        digest, size = hashlib.sha256(), 0
        try:
            with open(path, "rb") as reader, open(partial, "wb") as writer:
                for block in iter(lambda: reader.read(1 << 20), b""):
                    digest.update(block)
                    size += len(block)
                    writer.write(block)
                writer.flush()
                os.fsync(writer.fileno())
            os.replace(partial, target)
        except BaseException:
            partial.unlink(missing_ok=True)
            raise
        files[relative] = {"size": size, "sha256": digest.hexdigest()}
    return files


def write_directory_manifest(directory: Path, position: Position, files: dict[str, dict], *, config: dict,
                             attempt: Optional[int] = None) -> None:
    """meta.json of a directory checkpoint whose files are already under directory/data, durable."""
    (directory / DATA_DIR).mkdir(parents=True, exist_ok=True)
    for sub in sorted({(directory / DATA_DIR / name).parent for name in files} | {directory / DATA_DIR}):
        if sub.is_dir():
            storage.fsync_dir(sub)
    meta = {"format": FORMAT, "kind": "directory", "epoch": position.epoch, "step": position.step, "files": files,
            "config": config, "attempt": attempt}
    with open(directory / META_FILE, "w", encoding="utf-8") as handle:
        handle.write(json.dumps(meta))
        handle.flush()
        os.fsync(handle.fileno())
    storage.fsync_dir(directory)


def incomplete_reason(directory: Path) -> Optional[str]:
    """Cheap (no read of state.pt): why a committed checkpoint cannot be complete, or None if its manifest and
    state.pt's size agree. Used to choose and to prune; load() verifies the hash."""
    try:
        meta = read_meta(directory)
    except CheckpointUnreadable as why:
        return str(why)
    if is_directory_manifest(meta) or is_sharded_manifest(meta):
        for name, (path, entry) in _listed_files(directory, meta).items():
            if ".." in Path(name).parts or Path(name).is_absolute():
                return f"its manifest names {name}, outside the checkpoint"
            size = path.stat().st_size if path.is_file() else None
            if size is None:
                return f"{name} is missing"
            if size != entry["size"]:
                return f"{name} holds {size} bytes, its manifest says {entry['size']}"
        return None
    state_path = directory / STATE_FILE
    size = state_path.stat().st_size if state_path.is_file() else None
    if not size:
        return f"{STATE_FILE} is {'missing' if size is None else 'empty'}"
    if isinstance(meta.get("size"), int) and size != meta["size"]:
        return f"{STATE_FILE} holds {size} bytes, its manifest says {meta['size']}"
    return None


def verify_hash(directory: Path) -> None:
    """Read state.pt once and check it against its manifest's sha256: CheckpointUnreadable if it differs. The
    driver does this for the one checkpoint a start resumes from (its workers' rank 0 reads it once more to load)."""
    meta = read_meta(directory)
    if is_directory_manifest(meta) or is_sharded_manifest(meta):
        why = incomplete_reason(directory)  # sizes first: cheap, and a missing file says so
        if why is not None:
            raise CheckpointUnreadable(why)
        for name, (path, entry) in _listed_files(directory, meta).items():
            if not isinstance(entry.get("sha256"), str):
                continue
            try:
                found = checkpointstore.file_sha256(path)
            except OSError as err:
                raise CheckpointUnreadable(f"{name} cannot be read ({err.strerror or err.__class__.__name__})") from None
            if found != entry["sha256"]:
                raise CheckpointUnreadable(f"{name} does not match the hash in {META_FILE} (truncated or corrupted)")
        return
    digest = hashlib.sha256()
    try:
        with (directory / STATE_FILE).open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    except OSError as err:
        raise CheckpointUnreadable(f"{STATE_FILE} cannot be read ({err.strerror or err.__class__.__name__})") from None
    if digest.hexdigest() != meta["sha256"]:
        raise CheckpointUnreadable(f"{STATE_FILE} does not match the hash in {META_FILE} (truncated or corrupted)")


def _torch_load(data: bytes) -> dict:
    import torch

    state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    if not isinstance(state, dict) or "epoch" not in state:
        raise ValueError("not a raytrain checkpoint state")
    return state


def load(directory: Path) -> Loaded:
    """The checkpoint's state, read once: its sha256 is checked on the bytes read. A damaged manifest beside a
    state.pt that loads is verified another way: the state loads and names its own position (the warning says so).
    Anything else is CheckpointUnreadable, saying why."""
    state_path = directory / STATE_FILE
    if not state_path.exists() and (directory / SHARDS_DIR).is_dir():
        raise CheckpointUnreadable("a sharded checkpoint (shards/, written by every worker): the single-file "
                                   "checkpointer cannot load it. Fix: resume with run.checkpointer: sharded (or auto "
                                   "with scaling.strategy: fsdp)")
    if not state_path.exists() and (directory / DATA_DIR).is_dir():
        raise CheckpointUnreadable(f"a directory checkpoint (a Ray Train function's files under {DATA_DIR}/): "
                                   f"raytrain.Session loops cannot load it; a Ray Train function gets it from "
                                   f"ray.train.get_checkpoint()")
    try:
        data = state_path.read_bytes()
    except OSError as err:
        raise CheckpointUnreadable(f"{STATE_FILE} cannot be read ({err.strerror or err.__class__.__name__})") from None
    try:
        meta = read_meta(directory)
    except CheckpointUnreadable as why:
        try:
            state = _torch_load(data)
        except Exception as err:  # torch raises several types for a bad pickle
            raise CheckpointUnreadable(f"{why}, and {STATE_FILE} does not load ({err.__class__.__name__})") from None
        return Loaded(directory, state, f"{why}; its {STATE_FILE} loads and was used")
    if hashlib.sha256(data).hexdigest() != meta["sha256"]:
        raise CheckpointUnreadable(f"{STATE_FILE} does not match the hash in {META_FILE} (truncated or corrupted)")
    try:
        return Loaded(directory, _torch_load(data))
    except Exception as err:
        raise CheckpointUnreadable(f"{STATE_FILE} cannot be loaded ({err.__class__.__name__})") from None


def kind_of(directory: Path) -> str:
    """Which checkpointer wrote a committed checkpoint: "sharded", or "file" (a state.pt or a directory checkpoint)."""
    try:
        return "sharded" if is_sharded_manifest(read_meta(directory)) else "file"
    except CheckpointUnreadable:
        return "sharded" if (directory / SHARDS_DIR).is_dir() else "file"


def position_of(directory: Path) -> Position:
    """A checkpoint directory's position: from its manifest, else from its name."""
    try:
        meta = json.loads((directory / META_FILE).read_text(encoding="utf-8"))
        return Position(int(meta["epoch"]), int(meta.get("step") or 0))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return _position_in_name(directory.name)


def _position_in_name(name: str) -> Position:
    """The position checkpoint_dir_name wrote into a checkpoint's name (Position(-1) for another name)."""
    return Position(*layout.checkpoint_position(name))


def committed(run_dir: Path) -> list[Path]:
    """Every committed checkpoint directory of a run, newest position first (ties: the newest write first). On an
    object store, only those whose manifest was uploaded (it is uploaded last)."""
    return checkpointstore.at(run_dir).committed(position_of)


def staging_dirs(run_dir: Path) -> list[Path]:
    """Checkpoints provably never committed: staging directories; on an object store, prefixes without a manifest."""
    return checkpointstore.at(run_dir).never_committed()


def remove(directory: Path) -> None:
    """Delete a checkpoint directory: its manifest first, so that a crash midway leaves one that reads as damaged
    (on an object store, as torn)."""
    (directory / META_FILE).unlink(missing_ok=True)
    storage.remove_tree(directory)


def newest_complete(run_dir: Path) -> Optional[Path]:
    """The newest committed checkpoint whose manifest and size agree: what a result points at (load verifies the
    hash; reading every byte again here would double what a resume reads)."""
    return next((p for p in committed(run_dir) if incomplete_reason(p) is None), None)


class FileCheckpointer:
    """The single-file checkpointer: rank 0 writes the whole state into STORAGE/NAME (see the module's doc)."""

    def __init__(self, run_dir: Path, control: Control = UNFENCED, keep: int = 2):
        self.run_dir, self.control, self.keep = storage.as_path(run_dir), control, keep
        self.store = checkpointstore.at(self.run_dir)  # where checkpoints are staged, how they are committed

    def save(self, position: Position, state: Callable[[], dict], *, writer: bool,
             config: Optional[dict] = None) -> Optional[Path]:
        if not writer:
            return None
        self.control.check()  # a worker of an attempt that lost the run does not even write
        name = checkpoint_dir_name(position)
        staging = self.staging_path(name)
        return self.commit(name, lambda: write_checkpoint(staging, state(), config=config or {},
                                                          attempt=self.control.token))

    def staging_path(self, name: str) -> Path:
        """Where checkpoint `name` is written before its commit: in the run directory, or, on an object store,
        in a local directory (the commit uploads it)."""
        return self.store.staging(name)

    def commit(self, name: str, write: Callable[[], None]) -> Path:
        """`write` fills the staging directory of checkpoint `name` (its manifest last); then the fenced rename
        commits it and the newest `keep` complete checkpoints are kept. A failure leaves nothing half-written."""
        committed_path = self.store.commit(name, write, self.control.check)
        self.prune(self.keep)
        return committed_path

    def latest(self) -> list[Path]:
        return self.store.committed(position_of)

    def load_newest(self, warn: Callable[[str], None]) -> Optional[Loaded]:
        for path in self.latest():
            try:
                loaded = load(path)
            except CheckpointUnreadable as why:
                warn(f"checkpoint {path.name} is unreadable: {why}; falling back to the one before")
                continue
            if loaded.warning:
                warn(f"checkpoint {path.name}: {loaded.warning}")
            return loaded
        return None

    def prune(self, keep: int) -> None:
        """Keep the newest `keep` complete checkpoints (of any attempt: a killed one's newest are pruned here too).
        Damaged ones are never deleted: they may be all that is left, and resume names them."""
        complete = [p for p in self.latest() if incomplete_reason(p) is None]
        for old in complete[keep:]:
            self.control.check()
            remove(old)

    def remove_staging(self, warn: Callable[[str], None]) -> list[str]:
        """Delete staging directories: checkpoints provably never committed. Only while holding the run's lease (a
        live writer's staging directory looks the same)."""
        removed = []
        for path in self.store.never_committed():
            self.control.check()
            storage.remove_tree(path)
            warn(f"{path.name} was never committed (a crash or a full disk while it was written): removed")
            removed.append(path.name)
        stale = self.store.remove_stale_local()  # this node's copies staged by attempts killed before their upload
        if stale:
            warn(f"{len(stale)} local staging director{'y' if len(stale) == 1 else 'ies'} left by killed "
                 f"attempts removed from {storage.local_root() / 'scratch'}")
        return removed
