"""Files that appear whole or not at all: written beside their final name, then renamed over it. The one copy of
that rule for run records, checkpoints, staged data and the benchmark's figures; and the one reader of the small
JSON records so written that other nodes poll (the lease, an elastic run's resize request)."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Callable, Optional, Union

from raytrain.rundir import storage


def write_atomic(path: Path, content: Union[str, bytes, Callable[[Path], None]], *, durable: bool = False,
                 before_replace: Optional[Callable[[], None]] = None) -> None:
    """Write `content` (text, bytes, or a function that writes the file it is given) to `path` by rename, so that a
    reader, or a crash, never sees half a file. durable: fsync before the rename (checkpoints: the bytes are on disk
    before the name says so). before_replace: a last check (a run's fence); if it raises, nothing is replaced. On an
    object store the object is PUT whole, which replaces it as atomically as the rename (a callable content writes a
    local file first)."""
    path = storage.as_path(path)
    if storage.is_remote(path):
        _put_atomic(path, content, before_replace)
        return
    # A unique temporary name: pods on different nodes can share a pid (pid 1 in containers) and a directory (NFS).
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp")
    try:
        if isinstance(content, str):
            tmp.write_text(content, encoding="utf-8")
        elif isinstance(content, bytes):
            tmp.write_bytes(content)
        else:
            content(tmp)
        if durable:
            with open(tmp, "rb") as handle:
                os.fsync(handle.fileno())
        if before_replace is not None:
            before_replace()
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)


def _put_atomic(path: Path, content: Union[str, bytes, Callable[[Path], None]],
                before_replace: Optional[Callable[[], None]]) -> None:
    if isinstance(content, str):
        data = content.encode("utf-8")
    elif isinstance(content, bytes):
        data = content
    else:
        scratch = storage.scratch_dir("upload")
        try:
            content(scratch / path.name)
            data = (scratch / path.name).read_bytes()
        finally:
            storage.remove_tree(scratch)
    if before_replace is not None:
        before_replace()
    storage.put_bytes(path, data)


def read_record(path: Path) -> Optional[dict]:
    """The JSON object a writer replaced whole at `path`, or None where there is none: missing, unreadable, not
    JSON, or not an object. For records polled while another process may replace them."""
    try:
        data = json.loads(storage.as_path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
