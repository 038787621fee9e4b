"""The checkpoint store (raytrain.rundir.checkpointstore) of each kind, as several workers of one checkpoint use it:
on a directory rank 0 stages in the shared staging directory, another rank in its own and moves in what it owns, and
the commit is a rename; on an object store (the session's real S3 server) each stages on its own, uploads what it
owns, and the committer's manifest, uploaded last, commits."""

from __future__ import annotations

import json

import pytest

from raytrain.lifecycle.endings import AttemptEnded, Ending
from raytrain.rundir import checkpointstore, layout, storage
from raytrain.rundir.checkpointstore import DirectoryStore, ObjectStore

NAME = "checkpoint_epoch000002_0badcafe"


def unfenced() -> None:
    return None


def test_the_address_chooses_the_store(tmp_path, s3_prefix):
    assert type(checkpointstore.at(tmp_path / "run")) is DirectoryStore
    assert type(checkpointstore.at(f"{s3_prefix}/run")) is ObjectStore


def test_on_a_directory_rank_0_stages_in_the_shared_directory_and_another_rank_moves_in_only_what_it_owns(tmp_path):
    """Both ranks report trainer_state.json (rank 1's an empty copy of the file rank 0 was still writing, staged
    last) and rank 1 alone b.bin: the checkpoint holds rank 0's trainer_state.json and rank 1's b.bin, whatever
    order they were staged in (the store's old rule, the last copy to land, committed rank 1's empty one)."""
    rank0, rank1 = DirectoryStore(tmp_path), DirectoryStore(tmp_path)
    assert rank0.staging(NAME) == rank1.staging(NAME) == tmp_path / f"{layout.STAGING_PREFIX}{NAME}"
    assert rank1.in_place(NAME, "shards") == rank0.staging(NAME) / "shards"
    assert rank0.reported_staging(NAME, 0) == rank0.staging(NAME)
    own = rank1.reported_staging(NAME, 1)
    assert own.parent == tmp_path and own != rank0.staging(NAME)  # the run's filesystem: a move is a rename
    (rank0.staging(NAME) / "data").mkdir(parents=True)
    (rank0.staging(NAME) / "data" / "trainer_state.json").write_bytes(b'{"global_step": 4}')
    (own / "data" / "sub").mkdir(parents=True)
    (own / "data" / "trainer_state.json").write_bytes(b"")
    (own / "data" / "sub" / "b.bin").write_bytes(b"rank 1's")
    assert rank1.upload_own(NAME, "data", ["sub/b.bin"], unfenced) is None  # rank 0 owns trainer_state.json
    assert not own.exists()  # handed over: its own copy goes, the one of a name rank 0 owns with it
    assert rank0.not_uploaded(NAME, "data", {"sub/b.bin": len(b"rank 1's")}) is None
    assert rank0.not_uploaded(NAME, "data", {"sub/b.bin": 999}) == "sub/b.bin"
    assert rank0.not_uploaded(NAME, "data", {"gone.bin": 3}) == "gone.bin"

    def write() -> None:
        (rank0.staging(NAME) / layout.MANIFEST_FILE).write_text("{}")

    assert rank0.commit(NAME, write, unfenced) == tmp_path / NAME
    assert (tmp_path / NAME / "data" / "trainer_state.json").read_bytes() == b'{"global_step": 4}'
    assert (tmp_path / NAME / "data" / "sub" / "b.bin").read_bytes() == b"rank 1's"
    assert sorted(p.relative_to(tmp_path / NAME).as_posix() for p in (tmp_path / NAME).rglob("*")) == [
        "data", "data/sub", "data/sub/b.bin", "data/trainer_state.json", layout.MANIFEST_FILE]
    assert rank0.committed(lambda p: (0, 0)) == [tmp_path / NAME] and rank0.never_committed() == []


def test_on_a_directory_a_fenced_move_says_what_it_could_not_move_and_abandon_removes_it_all(tmp_path):
    worker, committer = DirectoryStore(tmp_path), DirectoryStore(tmp_path)
    own = worker.reported_staging(NAME, 1)
    (own / "data").mkdir(parents=True)
    for name in ("a.bin", "b.bin"):
        (own / "data" / name).write_bytes(b"x")
    passes = iter([None])

    def fence() -> None:
        if next(passes, "lost"):
            raise AttemptEnded(Ending.LEASE_LOST, "attempt 2 took the run over")

    why = worker.upload_own(NAME, "data", ["a.bin", "b.bin"], fence)
    assert why == (f"could not move b.bin to {committer.staging(NAME) / 'data'}: AttemptEnded: attempt 2 took the "
                   f"run over")
    assert not own.exists()
    assert committer.never_committed() == [committer.staging(NAME)]  # a.bin was moved in
    committer.abandon(NAME)
    assert committer.never_committed() == [] and list(tmp_path.iterdir()) == []


def test_on_a_directory_a_killed_ranks_own_staging_is_never_committed_and_the_last_discard_removes_it(tmp_path):
    """A rank killed between its copy and its move leaves its own staging directory: listed as never committed (the
    next lease holder removes it), and removed with the shared one by rank 0's discard of a refused checkpoint."""
    committer, killed, refused = DirectoryStore(tmp_path), DirectoryStore(tmp_path), DirectoryStore(tmp_path)
    committer.staging(NAME).mkdir()
    own = killed.reported_staging(NAME, 2)
    own.mkdir()
    (own / "at.txt").write_text("1")
    assert committer.never_committed() == [committer.staging(NAME), own]
    (refused.reported_staging(NAME, 1) / "data").mkdir(parents=True)
    refused.discard(NAME, last=False)  # a rank's discard: its own copy only
    assert committer.never_committed() == [committer.staging(NAME), own]
    committer.discard(NAME, last=True)
    assert committer.never_committed() == [] and list(tmp_path.iterdir()) == []


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
    assert rank1.reported_staging(NAME, 1) == rank1.staging(NAME)
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
