"""Checkpoint files: written so that a crash mid-write never yields a loadable-looking but broken checkpoint.

A checkpoint directory holds `state.pt` (model, optimizer, epoch, resolved config) and `meta.json` (epoch and
the sha256 of state.pt), each written to a temporary name and renamed into place, meta last. A directory whose
meta is missing or whose state does not match its hash is not a checkpoint: resume skips it with a warning and
falls back to the one before.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import uuid
from pathlib import Path
import shutil
from typing import Any, Callable, Iterable, Optional

STATE_FILE = "state.pt"
META_FILE = "meta.json"
DIR_PREFIX = "checkpoint_"
FORMAT = 1


class CheckpointUnreadable(Exception):
    pass


def checkpoint_dir_name(epoch: int) -> str:
    # Unique per report: a retrained epoch never overwrites (or is pruned together with) an older copy.
    return f"{DIR_PREFIX}epoch{epoch:06d}_{uuid.uuid4().hex[:8]}"


def _atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    write(tmp)
    with open(tmp, "rb") as handle:
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_checkpoint(directory: Path, *, model_state: dict, optimizer_state: Optional[dict], epoch: int, config: dict,
                     extra: Optional[dict[str, Any]] = None) -> None:
    import torch

    directory.mkdir(parents=True, exist_ok=True)
    state = {"model": model_state, "optimizer": optimizer_state, "epoch": epoch, "config": config,
             "extra": extra or {}}
    _atomic_write(directory / STATE_FILE, lambda tmp: torch.save(state, tmp))
    meta = {"format": FORMAT, "epoch": epoch, "sha256": _sha256(directory / STATE_FILE)}
    _atomic_write(directory / META_FILE, lambda tmp: tmp.write_text(json.dumps(meta)))


def read_checkpoint(directory: Path) -> dict:
    """The checkpoint's state, or CheckpointUnreadable saying why not."""
    try:
        meta = json.loads((directory / META_FILE).read_text())
    except (OSError, ValueError) as err:
        raise CheckpointUnreadable(f"{META_FILE} missing or invalid ({err.__class__.__name__})") from None
    state_path = directory / STATE_FILE
    if not state_path.is_file():
        raise CheckpointUnreadable(f"{STATE_FILE} is missing")
    if _sha256(state_path) != meta.get("sha256"):
        raise CheckpointUnreadable(f"{STATE_FILE} does not match the hash in {META_FILE} (truncated or corrupted)")
    import torch

    try:
        return torch.load(state_path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises several types for a bad pickle
        raise CheckpointUnreadable(f"{STATE_FILE} cannot be loaded ({err.__class__.__name__})") from None


def _epoch_of(directory: Path) -> int:
    try:
        return int(json.loads((directory / META_FILE).read_text())["epoch"])
    except (OSError, ValueError, KeyError, TypeError):
        match = re.match(rf"{DIR_PREFIX}epoch(\d+)", directory.name)
        return int(match.group(1)) if match else -1


def candidates(run_dir: Path, ray_latest: Iterable[Path] = ()) -> list[Path]:
    """Checkpoint directories to try, newest epoch first.

    Ray Train's own latest checkpoint only breaks ties: a checkpoint that was fully uploaded but whose report the
    controller had not yet consumed when a worker died is newer than Ray's latest, and losing it would throw away a
    checkpoint interval of work. Completeness is checked when loading (read_checkpoint), not assumed here."""
    preferred = {p.resolve() for p in ray_latest}
    found = {p.resolve(): p for p in [*ray_latest, *run_dir.glob(f"{DIR_PREFIX}*")] if p.is_dir()}
    return sorted(
        found.values(),
        key=lambda p: (_epoch_of(p), p.resolve() in preferred, p.stat().st_mtime),
        reverse=True,
    )


def load_newest(paths: Iterable[Path], warn: Callable[[str], None]) -> Optional[tuple[Path, dict]]:
    """The newest checkpoint that loads; each one skipped is reported through `warn`."""
    for path in paths:
        try:
            return path, read_checkpoint(path)
        except CheckpointUnreadable as why:
            warn(f"checkpoint {path} is unreadable: {why}; falling back to the one before")
    return None


def remove(directory: Path) -> None:
    """Delete a checkpoint directory: its meta first, so that a crash midway leaves one that reads as damaged."""
    (directory / META_FILE).unlink(missing_ok=True)
    shutil.rmtree(directory, ignore_errors=True)
