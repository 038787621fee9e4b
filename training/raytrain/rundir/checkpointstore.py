"""Where a run's checkpoints are written and how they are committed: on a directory (a shared volume) or on an
object store (s3://, gs://). `at` chooses the one or the other once, from the run directory's address (the part Ray
Train's StorageContext plays for its own checkpoints); the checkpointers (raytrain.checkpoint) and a Ray Train
function's reports (raytrain.worker.raytrain_function) call its methods and never ask which it is. What a checkpoint
holds (state.pt, shards, a manifest's contents) is theirs; where its files go, and when they count, is this module's:

                   a directory                                 an object store (no rename, no shared staging)
  staging(name)    RUN/.staging-NAME, one for every worker     a scratch directory of this process (TMPDIR), per name
  reported_staging rank 0: staging(name); another rank:        staging(name): this process's own already
  (name, rank)     RUN/.staging-NAME.rankR, its own
  in_place(PART)   RUN/.staging-NAME/PART                      RUN/NAME/PART: what every worker writes (shards) goes
                                                               straight under the checkpoint's prefix
  commit           the fenced rename to RUN/NAME, then the     the files uploaded, the fence passed before each, the
                   run directory fsynced                       manifest last: its upload is the commit
  a full disk      raised as it is (the run's own disk)        StagingFull: the node's TMPDIR, named with the fix
  other workers'   each renames the ones it owns into          each uploads the ones it owns; rank 0 checks them in
  reported files   staging(name); rank 0 checks them there     the bucket at their sizes before its commit
  torn writes      RUN/.staging-* directories (a rank's own    those, and checkpoint_* prefixes with no manifest;
                   ones included)                              this node's scratch of killed processes
  committed ones   checkpoint_* directories, newest position   checkpoint_* prefixes holding a manifest, from one
                   (their manifest's) first, then mtime        listing: the position in their name, then the
                                                               manifest's time

The layouts are those run directories and buckets already hold (raytrain.rundir.layout); a torn write is never listed
as committed, and the next lease holder removes it (raytrain.checkpoint.resume). Where several workers report a file
under one name, the owner's copy (the lowest rank's, the saver's in a DDP script) is the one committed on either
kind: the others' copies never reach staging(name), so a rank copying a file its rank 0 is still writing commits
nothing of it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

from raytrain.lifecycle.endings import AttemptEnded
from raytrain.rundir import layout, storage

Fence = Callable[[], None]


def at(address: Any) -> "CheckpointStore":
    """The store for a run directory (or a checkpoint in one), chosen by its address."""
    path = storage.as_path(address)
    return ObjectStore(path) if storage.is_remote(path) else DirectoryStore(path)


def shard_reader(shards: Path) -> Any:
    """torch.distributed.checkpoint's reader of a sharded checkpoint's shards at `shards`."""
    return at(shards).shard_reader(shards)


def file_sha256(path: Path) -> str:
    """The sha256 of a file (or object), read once in blocks."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class CheckpointStore(ABC):
    """The commit protocol both kinds of storage share; each subclass owns what differs (the module's table)."""

    def __init__(self, run_dir: Path):
        self.run_dir = run_dir

    # ------------------------------------------------------------------------------------------ where

    @abstractmethod
    def staging(self, name: str) -> Path:
        """Where this process writes checkpoint `name` before its commit (a local directory, made by the writer)."""

    @abstractmethod
    def reported_staging(self, name: str, rank: int) -> Path:
        """Where worker `rank` copies the files it reports for checkpoint `name` (a Ray Train function's): rank 0's,
        the committer's, is staging(name); another worker's files reach it only through upload_own."""

    @abstractmethod
    def in_place(self, name: str, part: str) -> Path:
        """Where every worker writes the part `part` of checkpoint `name` itself (a sharded checkpoint's shards)."""

    @abstractmethod
    def shard_writer(self, shards: Path) -> Any:
        """torch.distributed.checkpoint's storage writer for shards at in_place(name, part)."""

    @abstractmethod
    def shard_reader(self, shards: Path) -> Any:
        """torch.distributed.checkpoint's storage reader of shards at `shards`."""

    # ------------------------------------------------------------------------------------------ commit

    def commit(self, name: str, write: Callable[[], None], fence: Fence) -> Path:
        """`write` fills staging(name) (its manifest, layout.MANIFEST_FILE, last); once `fence` passed, the commit
        makes it checkpoint `name` of the run. A failure leaves nothing half-written; the local staging copy goes
        either way."""
        staging = self.staging(name)
        try:
            try:
                write()
            except OSError as err:
                full = self.staging_full(staging, err)
                if full is not None:
                    raise full from None
                raise
            fence()  # the commit is the rename (the manifest's upload) below: fenced at the last moment
            self._publish(staging, self.run_dir / name, fence)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)  # never committed: nothing half-written stays
            raise
        finally:
            self._release(name)
        storage.fsync_dir(self.run_dir)
        return self.run_dir / name

    @abstractmethod
    def _publish(self, staging: Path, target: Path, fence: Fence) -> None:
        """Make the filled staging directory checkpoint `target` of the run."""

    @abstractmethod
    def _release(self, name: str) -> None:
        """This process's own scratch for checkpoint `name` removed, if it made one."""

    @abstractmethod
    def staging_full(self, staging: Path, err: OSError) -> Optional[storage.StagingFull]:
        """The error to raise for `err`, raised while writing the local staging copy `staging`, when it is a node's
        staging directory that filled; None when `err` is to be raised as it is."""

    @abstractmethod
    def upload_own(self, name: str, part: str, relatives: Iterable[str], fence: Fence) -> Optional[str]:
        """A worker other than the committer: make the files it staged under reported_staging(name, rank)/`part`
        (`relatives`, the ones it owns) part of checkpoint `name`, then remove its staging copy. Why that failed
        ("could not upload ..."), or None."""

    def _hand_over(self, name: str, relatives: Iterable[str], fence: Fence, put: Callable[[str], None], verb: str,
                   target: Path) -> Optional[str]:
        """upload_own's loop for either store: `put` each file once `fence` passed; this worker's own staging copy
        released either way. Why a file could not be handed over, or None."""
        relative = ""
        try:
            for relative in relatives:
                fence()
                put(relative)
        except (Exception, AttemptEnded) as err:
            return f"could not {verb} {relative} to {target}: {err.__class__.__name__}: {err}"
        finally:
            self._release(name)
        return None

    @abstractmethod
    def not_uploaded(self, name: str, part: str, sizes: dict[str, int]) -> Optional[str]:
        """The committer, before its commit: the first of the other workers' files (`sizes`: {name under `part`:
        size}) that is not in checkpoint `name` at its size, or None."""

    # ------------------------------------------------------------------------------------------ cleanup

    @abstractmethod
    def discard(self, name: str, *, last: bool) -> None:
        """A checkpoint that will not be committed: this process's staging copy removed. `last`: this process
        removes a staging directory the workers share, and every worker's own one (they all stopped writing)."""

    @abstractmethod
    def abandon(self, name: str) -> None:
        """The committer's checkpoint `name` that failed: its staging copy, and whatever of it reached the run's
        storage, removed (it would read as torn anyway)."""

    @abstractmethod
    def never_committed(self) -> list[Path]:
        """Checkpoints provably never committed, by name. Removed only by the run's lease holder: a live writer's
        look the same."""

    def _staging_dirs(self) -> list[Path]:
        return [p for p in self.run_dir.glob(f"{layout.STAGING_PREFIX}{layout.CHECKPOINT_PREFIX}*") if p.is_dir()]

    @abstractmethod
    def remove_stale_local(self) -> list[Path]:
        """This node's local staging copies left by processes that were killed before their commit, removed."""

    # ------------------------------------------------------------------------------------------ listing

    @abstractmethod
    def committed(self, manifest_position: Callable[[Path], Any]) -> list[Path]:
        """Every committed checkpoint of the run, newest first. `manifest_position`: a checkpoint's position as its
        manifest says it (a directory's order; an object store's is its name's, from one listing)."""


class DirectoryStore(CheckpointStore):
    """A run directory on a filesystem every worker of the run sees (one machine, or a shared volume)."""

    def __init__(self, run_dir: Path):
        super().__init__(run_dir)
        self._own: dict[str, Path] = {}  # this worker's own staging directory per checkpoint name (rank > 0)

    def staging(self, name: str) -> Path:
        return self.run_dir / f"{layout.STAGING_PREFIX}{name}"

    def reported_staging(self, name: str, rank: int) -> Path:
        if rank == 0:
            return self.staging(name)
        # Its own, not the shared one: a copy of a file rank 0 is still writing (ranks sharing a cwd) must not
        # replace rank 0's. In the run directory, so that handing an owned file over is an atomic rename.
        self._own[name] = self.run_dir / f"{layout.STAGING_PREFIX}{name}{layout.RANK_STAGING_SUFFIX}{rank}"
        return self._own[name]

    def _ranks_staging(self, name: str) -> list[Path]:
        """Every worker's own staging directory of checkpoint `name` (a killed worker's included)."""
        return list(self.run_dir.glob(f"{layout.STAGING_PREFIX}{name}{layout.RANK_STAGING_SUFFIX}*"))

    def in_place(self, name: str, part: str) -> Path:
        return self.staging(name) / part

    def shard_writer(self, shards: Path) -> Any:
        from torch.distributed.checkpoint import FileSystemWriter

        return FileSystemWriter(str(shards))

    def shard_reader(self, shards: Path) -> Any:
        from torch.distributed.checkpoint import FileSystemReader

        return FileSystemReader(str(shards))

    def _publish(self, staging: Path, target: Path, fence: Fence) -> None:
        staging.rename(target)

    def _release(self, name: str) -> None:
        own = self._own.pop(name, None)  # the shared staging directory is the run's, and the commit renamed it
        if own is not None:
            shutil.rmtree(own, ignore_errors=True)

    def staging_full(self, staging: Path, err: OSError) -> Optional[storage.StagingFull]:
        return None  # the run's own disk: the driver names it (storage.disk_full)

    def upload_own(self, name: str, part: str, relatives: Iterable[str], fence: Fence) -> Optional[str]:
        """Each file renamed into staging(name) after `fence` passed (a file lands whole or not at all); then this
        worker's own staging directory goes, with the copies of names a lower rank owns."""
        own = self._own.get(name)
        if own is None:
            return None  # it staged nothing of its own (it reported no checkpoint)
        target = self.staging(name) / part

        def move(relative: str) -> None:
            (target / relative).parent.mkdir(parents=True, exist_ok=True)
            os.replace(own / part / relative, target / relative)

        return self._hand_over(name, relatives, fence, move, "move", target)

    def not_uploaded(self, name: str, part: str, sizes: dict[str, int]) -> Optional[str]:
        staged = self.staging(name) / part
        return next((relative for relative, size in sizes.items()
                     if not (staged / relative).is_file() or (staged / relative).stat().st_size != size), None)

    def discard(self, name: str, *, last: bool) -> None:
        self._release(name)
        if last:
            self.abandon(name)

    def abandon(self, name: str) -> None:
        for path in [self.staging(name), *self._ranks_staging(name)]:
            shutil.rmtree(path, ignore_errors=True)

    def never_committed(self) -> list[Path]:
        return sorted(self._staging_dirs(), key=lambda p: p.name)

    def remove_stale_local(self) -> list[Path]:
        return []  # nothing of a checkpoint is staged outside the run directory

    def committed(self, manifest_position: Callable[[Path], Any]) -> list[Path]:
        found = [p for p in self.run_dir.glob(f"{layout.CHECKPOINT_PREFIX}*") if p.is_dir()]

        def key(path: Path) -> tuple:
            try:
                mtime = path.stat().st_mtime
            except OSError:
                mtime = 0.0
            return manifest_position(path), mtime

        return sorted(found, key=key, reverse=True)


class ObjectStore(CheckpointStore):
    """A run directory in an object store: no rename (a checkpoint is staged on its node and uploaded, its manifest
    last), and every worker's node stages on its own."""

    def __init__(self, run_dir: Path):
        super().__init__(run_dir)
        self._scratch: dict[str, Path] = {}  # the local staging directory per checkpoint name

    def staging(self, name: str) -> Path:
        if name not in self._scratch:
            self._scratch[name] = storage.scratch_dir("checkpoint") / f"{layout.STAGING_PREFIX}{name}"
        return self._scratch[name]

    def reported_staging(self, name: str, rank: int) -> Path:
        return self.staging(name)  # this process's own already: the node's scratch

    def in_place(self, name: str, part: str) -> Path:
        return self.run_dir / name / part  # no rename would make them appear: they are written where they stay

    def shard_writer(self, shards: Path) -> Any:
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter  # private module of the pinned torch

        return FsspecWriter(str(shards), **storage.fsspec_options(str(shards)))

    def shard_reader(self, shards: Path) -> Any:
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

        return FsspecReader(str(shards), **storage.fsspec_options(str(shards)))

    def _publish(self, staging: Path, target: Path, fence: Fence) -> None:
        """Upload a local staging directory's files to `target`, the manifest last and only after `fence` passed; a
        failure removes what was uploaded (it would read as torn anyway)."""
        manifest = staging / layout.MANIFEST_FILE
        try:
            for path in sorted(p for p in staging.rglob("*") if p.is_file() and p != manifest):
                fence()
                storage.upload_file(path, target / path.relative_to(staging).as_posix())
            fence()
            storage.upload_file(manifest, target / layout.MANIFEST_FILE)
        except BaseException:
            storage.remove_tree(target)
            raise

    def _release(self, name: str) -> None:
        scratch = self._scratch.pop(name, None)
        if scratch is not None:
            shutil.rmtree(scratch.parent, ignore_errors=True)

    def staging_full(self, staging: Path, err: OSError) -> Optional[storage.StagingFull]:
        return storage.staging_full(staging, err) if storage.is_full(err) else None

    def upload_own(self, name: str, part: str, relatives: Iterable[str], fence: Fence) -> Optional[str]:
        """Each file uploaded after `fence` passed; then this worker's local staging copy goes, uploaded or not."""
        target = self.run_dir / name / part
        # staging(name) asked per file, as before: a worker with nothing to upload makes no scratch directory.
        return self._hand_over(name, relatives, fence,
                               lambda relative: storage.upload_file(self.staging(name) / part / relative,
                                                                    target / relative), "upload", target)

    def not_uploaded(self, name: str, part: str, sizes: dict[str, int]) -> Optional[str]:
        listed = storage.list_tree(self.run_dir / name / part)
        return next((relative for relative, size in sizes.items()
                     if (listed.get(relative) or {}).get("size") != size), None)

    def discard(self, name: str, *, last: bool) -> None:
        self._release(name)

    def abandon(self, name: str) -> None:
        self._release(name)
        storage.remove_tree(self.run_dir / name)

    def never_committed(self) -> list[Path]:
        torn = [self.run_dir / name for name, stamp in self._checkpoint_prefixes().items() if stamp is None]
        return sorted(self._staging_dirs() + torn, key=lambda p: p.name)

    def remove_stale_local(self) -> list[Path]:
        return storage.remove_stale_scratch()

    def committed(self, manifest_position: Callable[[Path], Any]) -> list[Path]:
        """From one listing of the run's prefix (a request per thousand keys, where asking each checkpoint for its
        manifest, size and time took a dozen requests per checkpoint at every commit's prune): the prefixes holding
        a manifest, ordered by the position their name records, then the manifest's time."""
        stamped = {name: stamp for name, stamp in self._checkpoint_prefixes().items() if stamp is not None}
        return [self.run_dir / name for name in sorted(
            stamped, key=lambda n: (layout.checkpoint_position(n), stamped[n]), reverse=True)]

    def _checkpoint_prefixes(self) -> dict[str, Optional[float]]:
        """From one listing of the run's prefix: {checkpoint_* prefix: its manifest's time, or None when it has none
        (a torn upload)}."""
        prefixes: dict[str, Optional[float]] = {}
        for key, info in storage.list_tree(self.run_dir).items():
            parts = key.split("/")
            if len(parts) >= 2 and parts[0].startswith(layout.CHECKPOINT_PREFIX):
                if len(parts) == 2 and parts[1] == layout.MANIFEST_FILE:
                    prefixes[parts[0]] = info.get("mtime", 0.0)
                else:
                    prefixes.setdefault(parts[0], None)
        return prefixes
