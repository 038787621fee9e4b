"""The checkpoint store (raytrain.rundir.checkpointstore) of each kind, as several workers of one checkpoint use it:
on a directory they share the staging directory and the commit is a rename; on an object store (the session's real
S3 server) each stages on its own, uploads what it owns, and the committer's manifest, uploaded last, commits."""

from __future__ import annotations

import hashlib
import json

import pytest

from raytrain.lifecycle.endings import AttemptEnded, Ending
from raytrain.rundir import checkpointstore, layout, storage
from raytrain.rundir.checkpointstore import DirectoryStore, ObjectStore

NAME = "checkpoint_epoch000002_0badcafe"


def entry(data: bytes) -> dict:
    return {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def unfenced() -> None:
    return None


def test_the_address_chooses_the_store(tmp_path, s3_prefix):
    assert type(checkpointstore.at(tmp_path / "run")) is DirectoryStore
    assert type(checkpointstore.at(f"{s3_prefix}/run")) is ObjectStore


def test_on_a_directory_the_workers_share_one_staging_directory_and_the_rename_commits(tmp_path):
    rank0, rank1 = DirectoryStore(tmp_path), DirectoryStore(tmp_path)
    assert rank0.staging(NAME) == rank1.staging(NAME) == tmp_path / f"{layout.STAGING_PREFIX}{NAME}"
    assert rank1.in_place(NAME, "shards") == rank0.staging(NAME) / "shards"
    (rank1.staging(NAME) / "data").mkdir(parents=True)
    (rank1.staging(NAME) / "data" / "b.bin").write_bytes(b"rank 1's")
    assert rank1.upload_own(NAME, "data", ["b.bin"], unfenced) is None  # nothing to hand over
    assert rank0.not_uploaded(NAME, "data", {"b.bin": 999}) is None
    # Two workers reported different files under one name: the copy on disk is the one kept
    path = rank0.staging(NAME) / "data" / "b.bin"
    assert rank0.kept_copy(path, [entry(b"rank 0's"), entry(b"rank 1's")]) == entry(b"rank 1's")
    assert rank0.kept_copy(path, [entry(b"same"), entry(b"same")]) == entry(b"same")

    def write() -> None:
        (rank0.staging(NAME) / layout.MANIFEST_FILE).write_text("{}")

    assert rank0.commit(NAME, write, unfenced) == tmp_path / NAME
    assert sorted(p.name for p in (tmp_path / NAME).rglob("*")) == ["b.bin", "data", layout.MANIFEST_FILE]
    assert rank0.committed(lambda p: (0, 0)) == [tmp_path / NAME] and rank0.never_committed() == []


def test_on_a_directory_only_the_last_worker_discards_the_shared_staging_directory(tmp_path):
    store = DirectoryStore(tmp_path)
    store.staging(NAME).mkdir()
    store.discard(NAME, last=False)
    assert store.never_committed() == [store.staging(NAME)]
    store.discard(NAME, last=True)
    assert store.never_committed() == []


def test_a_full_local_disk_is_the_run_directorys_own_error_on_a_directory_and_the_nodes_on_an_object_store(
        tmp_path, s3_prefix):
    import errno

    full = OSError(errno.ENOSPC, "No space left on device")
    assert DirectoryStore(tmp_path).staging_full(tmp_path / "x", full) is None
    named = ObjectStore(storage.as_path(f"{s3_prefix}/run")).staging_full(tmp_path / "x", full)
    assert isinstance(named, storage.StagingFull) and "local staging directory" in str(named)
    assert ObjectStore(storage.as_path(f"{s3_prefix}/run")).staging_full(tmp_path / "x", OSError(errno.EIO, "")) is None


def test_on_an_object_store_each_worker_uploads_what_it_owns_and_the_manifest_commits(s3_server, s3_prefix):
    run_dir = storage.as_path(f"{s3_prefix}/run")
    rank0, rank1 = ObjectStore(run_dir), ObjectStore(run_dir)
    assert rank0.staging(NAME) != rank1.staging(NAME)  # each process stages on its own node
    assert rank0.in_place(NAME, "shards") == run_dir / NAME / "shards"
    for store, name in ((rank0, "a.bin"), (rank1, "b.bin")):
        (store.staging(NAME) / "data").mkdir(parents=True)
        (store.staging(NAME) / "data" / name).write_bytes(f"{name} of rank {store is rank1:d}".encode())
    scratch1 = rank1.staging(NAME).parent
    assert rank1.upload_own(NAME, "data", ["b.bin"], unfenced) is None
    assert not scratch1.exists()  # uploaded: its local copy goes
    # uploaded, not committed: a prefix without a manifest reads as torn
    assert rank0.committed(pytest.fail) == [] and rank0.never_committed() == [run_dir / NAME]
    assert rank0.not_uploaded(NAME, "data", {"b.bin": len(b"b.bin of rank 1")}) is None
    assert rank0.not_uploaded(NAME, "data", {"b.bin": 1, "gone.bin": 3}) == "b.bin"
    # the copy kept under a name several reported is the one uploaded: the lowest rank's
    assert rank0.kept_copy(rank0.staging(NAME) / "data" / "a.bin",
                           [entry(b"rank 0's"), entry(b"rank 1's")]) == entry(b"rank 0's")

    def write() -> None:
        (rank0.staging(NAME) / layout.MANIFEST_FILE).write_text(json.dumps({"epoch": 2}))

    scratch0 = rank0.staging(NAME).parent
    assert rank0.commit(NAME, write, unfenced) == run_dir / NAME
    assert not scratch0.exists()
    assert rank0.committed(pytest.fail) == [run_dir / NAME] and rank0.never_committed() == []
    assert storage.read_bytes(run_dir / NAME / "data" / "a.bin") == b"a.bin of rank 0"  # with the commit
    assert storage.read_bytes(run_dir / NAME / "data" / "b.bin") == b"b.bin of rank 1"
    assert json.loads(storage.read_bytes(run_dir / NAME / layout.MANIFEST_FILE)) == {"epoch": 2}


def test_on_an_object_store_a_fenced_upload_says_what_it_could_not_upload_and_abandon_removes_the_prefix(
        s3_server, s3_prefix):
    run_dir = storage.as_path(f"{s3_prefix}/run")
    worker, committer = ObjectStore(run_dir), ObjectStore(run_dir)
    (worker.staging(NAME) / "data").mkdir(parents=True)
    for name in ("a.bin", "b.bin"):
        (worker.staging(NAME) / "data" / name).write_bytes(b"x")
    scratch = worker.staging(NAME).parent
    passes = iter([None])

    def fence() -> None:
        if next(passes, "lost"):
            raise AttemptEnded(Ending.LEASE_LOST, "attempt 2 took the run over")

    why = worker.upload_own(NAME, "data", ["a.bin", "b.bin"], fence)
    assert why == f"could not upload b.bin to {run_dir / NAME / 'data'}: AttemptEnded: attempt 2 took the run over"
    assert not scratch.exists()
    assert committer.never_committed() == [run_dir / NAME]  # a.bin reached the bucket
    committer.abandon(NAME)
    assert committer.never_committed() == [] and storage.list_tree(run_dir) == {}
