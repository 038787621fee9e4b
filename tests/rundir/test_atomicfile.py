"""files.write_atomic, the one rule every run record, checkpoint and staged file is written by: a reader or a crash
sees the old file or the new one, never part of one, and nothing is left beside it when writing fails."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from raytrain.rundir import atomicfile


def leftovers(directory: Path, keep: str) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name != keep)


@pytest.mark.parametrize("content, expected", [
    ("text, ünïcode\n", "text, ünïcode\n".encode("utf-8")),
    (b"\x00\x01bytes", b"\x00\x01bytes"),
    (lambda tmp: tmp.write_bytes(b"written by a function"), b"written by a function"),
], ids=["str", "bytes", "function"])
def test_each_kind_of_content_lands_whole_with_nothing_beside_it(tmp_path, content, expected):
    target = tmp_path / "result.json"
    target.write_text("old")
    atomicfile.write_atomic(target, content)
    assert target.read_bytes() == expected
    assert leftovers(tmp_path, "result.json") == []


def test_the_file_is_written_beside_its_name_then_renamed_over_it(tmp_path):
    target = tmp_path / "meta.json"
    target.write_text("old")
    seen = {}

    def last_check():  # runs once the new bytes are complete, before the rename
        [tmp] = leftovers(tmp_path, "meta.json")
        seen.update(tmp=tmp, tmp_text=(tmp_path / tmp).read_text(), target_text=target.read_text())

    with open(target) as reader_before:
        atomicfile.write_atomic(target, "new", before_replace=last_check)
        assert reader_before.read() == "old"  # an open reader keeps the file it opened
    # hidden, in the same directory (a rename within one filesystem), named by pid and a random part
    assert seen["tmp"].startswith(".meta.json.") and f".{os.getpid()}-" in seen["tmp"] and seen["tmp"].endswith(".tmp")
    assert (seen["tmp_text"], seen["target_text"]) == ("new", "old")
    assert target.read_text() == "new"


class Fenced(Exception):
    pass


@pytest.mark.parametrize("failure", ["content", "before_replace", "interrupt"])
def test_a_failure_leaves_the_old_file_and_no_temporary(tmp_path, failure):
    target = tmp_path / "result.json"
    target.write_text("old")

    def half_written(tmp: Path):
        tmp.write_text("half")
        raise KeyboardInterrupt if failure == "interrupt" else Fenced("disk full")

    def fence():
        raise Fenced("another attempt holds the run")

    content = "new" if failure == "before_replace" else half_written
    with pytest.raises(KeyboardInterrupt if failure == "interrupt" else Fenced):
        atomicfile.write_atomic(target, content, before_replace=fence if failure == "before_replace" else None)
    assert target.read_text() == "old"
    assert leftovers(tmp_path, "result.json") == []


def test_a_new_file_that_fails_is_never_created(tmp_path):
    with pytest.raises(Fenced):
        atomicfile.write_atomic(tmp_path / "new.json", "x", before_replace=lambda: (_ for _ in ()).throw(Fenced()))
    assert list(tmp_path.iterdir()) == []


def test_durable_syncs_the_new_bytes_before_the_name_points_at_them(tmp_path, monkeypatch):
    target = tmp_path / "state.pt"
    target.write_bytes(b"old")
    synced = []
    real_fsync = os.fsync

    def fsync(fd):  # a spy that calls through: what was synced, and what the name held at that moment
        synced.append((Path(os.readlink(f"/proc/self/fd/{fd}")).name, target.read_bytes()))
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    atomicfile.write_atomic(target, b"new", durable=True)
    [(name, target_then)] = synced
    assert name.startswith(".state.pt.") and target_then == b"old"
    assert target.read_bytes() == b"new"
    synced.clear()
    atomicfile.write_atomic(target, b"newer")  # not durable: no sync
    assert synced == []


def test_concurrent_writers_and_a_reader_only_ever_see_whole_files(tmp_path):
    """Writers sharing a pid and a directory (pods on NFS, threads here) never collide on the temporary name, and a
    reader in between sees one writer's complete file every time."""
    target = tmp_path / "result.json"
    contents = [bytes([65 + i]) * 100_000 for i in range(6)]  # large enough that a torn write would show
    atomicfile.write_atomic(target, contents[0])
    stop = threading.Event()
    torn: list[int] = []
    errors: list[BaseException] = []

    def write(content: bytes):
        try:
            for _ in range(10):
                atomicfile.write_atomic(target, content)
        except BaseException as err:  # a collision on a temporary name would surface here
            errors.append(err)

    def read():
        while not stop.is_set():
            data = target.read_bytes()
            if data not in contents:
                torn.append(len(data))

    reader = threading.Thread(target=read)
    reader.start()
    writers = [threading.Thread(target=write, args=(content,)) for content in contents]
    for thread in writers:
        thread.start()
    for thread in writers:
        thread.join()
    stop.set()
    reader.join()
    assert errors == [] and torn == []
    assert target.read_bytes() in contents
    assert leftovers(tmp_path, "result.json") == []
