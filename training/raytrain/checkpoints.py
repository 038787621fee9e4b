"""Checkpoint files: written so that a crash mid-write never yields a loadable-looking but broken checkpoint.

A checkpoint directory holds `state.pt` (model, optimizer, epoch, resolved config) and `meta.json` (epoch and
the sha256 of state.pt), each written to a temporary name and renamed into place, meta last. A directory whose
meta is missing or whose state does not match its hash is not a checkpoint: resume skips it with a warning and
falls back to the one before.
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from pathlib import Path
import shutil
from typing import Any, Callable, Iterable, Optional

from raytrain import files

STATE_FILE = "state.pt"
META_FILE = "meta.json"
DIR_PREFIX = "checkpoint_"
FORMAT = 1


class CheckpointUnreadable(Exception):
    pass


def checkpoint_dir_name(epoch: int, step: int = 0) -> str:
    # Unique per report: a retrained epoch never overwrites (or is pruned together with) an older copy.
    at = f"_step{step:08d}" if step else ""
    return f"{DIR_PREFIX}epoch{epoch:06d}{at}_{uuid.uuid4().hex[:8]}"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_checkpoint(directory: Path, *, model_state: dict, optimizer_state: Optional[dict], epoch: int, config: dict,
                     extra: Optional[dict[str, Any]] = None, step: int = 0, attempt: Optional[int] = None) -> None:
    """epoch: the last completed epoch; step > 0: a mid-epoch checkpoint after that many batches of the next one
    (its statistics so far travel in `extra`, with the loop's other stateful objects)."""
    import torch

    directory.mkdir(parents=True, exist_ok=True)
    state = {"model": model_state, "optimizer": optimizer_state, "epoch": epoch, "config": config,
             "extra": extra or {}, "step": step}
    files.write_atomic(directory / STATE_FILE, lambda tmp: torch.save(state, tmp), durable=True)
    # The config also goes in meta.json, so that the driver compares a resume's settings without loading state;
    # the size tells an upload cut short (torn, cleaned away) from a corrupted file (refused, named).
    meta = {"format": FORMAT, "epoch": epoch, "step": step, "sha256": _sha256(directory / STATE_FILE),
            "size": (directory / STATE_FILE).stat().st_size, "config": config, "attempt": attempt}
    files.write_atomic(directory / META_FILE, json.dumps(meta), durable=True)


def read_meta(directory: Path) -> dict:
    try:
        meta = json.loads((directory / META_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise CheckpointUnreadable(f"{META_FILE} missing or invalid ({err.__class__.__name__})") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("sha256"), str):
        raise CheckpointUnreadable(f"{META_FILE} is not a checkpoint's metadata")
    return meta


def torn_reason(directory: Path) -> Optional[str]:
    """Why a checkpoint directory was never completely written (a crash, a full disk, an upload cut short), or
    None if it was. A complete directory can still be corrupted: verify() says."""
    try:
        meta = read_meta(directory)
    except CheckpointUnreadable as why:
        return str(why)
    state_path = directory / STATE_FILE
    size = state_path.stat().st_size if state_path.is_file() else None
    if not size:
        return f"{STATE_FILE} is {'missing' if size is None else 'empty'}"
    if isinstance(meta.get("size"), int) and size < meta["size"]:
        return f"{STATE_FILE} holds {size} of its {meta['size']} bytes"
    return None


def verify(directory: Path) -> dict:
    """The checkpoint's meta if its state is complete and matches its hash, else CheckpointUnreadable."""
    meta = read_meta(directory)
    state_path = directory / STATE_FILE
    if not state_path.is_file():
        raise CheckpointUnreadable(f"{STATE_FILE} is missing")
    if _sha256(state_path) != meta.get("sha256"):
        raise CheckpointUnreadable(f"{STATE_FILE} does not match the hash in {META_FILE} (truncated or corrupted)")
    return meta


def read_checkpoint(directory: Path) -> dict:
    """The checkpoint's state, or CheckpointUnreadable saying why not."""
    verify(directory)
    import torch

    try:
        return torch.load(directory / STATE_FILE, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises several types for a bad pickle
        raise CheckpointUnreadable(f"{STATE_FILE} cannot be loaded ({err.__class__.__name__})") from None


def _position(directory: Path) -> tuple[int, int]:
    """(last completed epoch, steps into the next one) of a checkpoint directory."""
    try:
        meta = json.loads((directory / META_FILE).read_text())
        return int(meta["epoch"]), int(meta.get("step") or 0)
    except (OSError, ValueError, KeyError, TypeError):
        match = re.match(rf"{DIR_PREFIX}epoch(\d+)(?:_step(\d+))?", directory.name)
        return (int(match.group(1)), int(match.group(2) or 0)) if match else (-1, 0)


def candidates(run_dir: Path, ray_latest: Iterable[Path] = ()) -> list[Path]:
    """Checkpoint directories to try, newest epoch first.

    Ray Train's own latest checkpoint only breaks ties: a checkpoint that was fully uploaded but whose report the
    controller had not yet consumed when a worker died is newer than Ray's latest, and losing it would throw away a
    checkpoint interval of work. Completeness is checked when loading (read_checkpoint), not assumed here."""
    preferred = {p.resolve() for p in ray_latest}
    found = {p.resolve(): p for p in [*ray_latest, *run_dir.glob(f"{DIR_PREFIX}*")] if p.is_dir()}
    return sorted(
        found.values(),
        key=lambda p: (_position(p), p.resolve() in preferred, p.stat().st_mtime),
        reverse=True,
    )


def newest_verified(run_dir: Path) -> Optional[Path]:
    """The newest checkpoint whose state matches its hash: what a result may point at."""
    for path in candidates(run_dir):
        try:
            verify(path)
            return path
        except CheckpointUnreadable:
            continue
    return None


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
