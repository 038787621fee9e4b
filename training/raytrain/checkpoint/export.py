"""`raytrain export RUN_DIR`: the newest complete checkpoint's model as one file for serving.

The file is a torch.save of {"model": state dict (full tensors, the model's own parameter names), "config": the
run's resolved config, "epoch", "step", "checkpoint": the directory it came from}; load it with
`model.load_state_dict(torch.load(path, weights_only=True)["model"])`. Sharded checkpoints are consolidated in this
one process (torch.distributed.checkpoint reads every shard), single-file ones are read from their state.pt. The
file appears complete or not at all: it is written beside its destination and renamed into place.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Optional

from raytrain.checkpoint import checkpoints
from raytrain.errors import UsageError
from raytrain.rundir import storage


class ExportError(UsageError):
    """Nothing to export, or the file cannot be written; str() names the path and the fix."""


def export(run_dir: Path, out: Optional[Path] = None) -> tuple[Path, Path]:
    """(the checkpoint exported, the file written)."""
    import torch

    run_dir = storage.run_path(run_dir)
    if not run_dir.is_dir():
        raise ExportError(f"{run_dir} is not a run directory. Fix: pass STORAGE/NAME of a run, e.g. runs/linear.")
    source, model, meta = _newest_model(run_dir)
    epoch, step = int(meta.get("epoch", -1)), int(meta.get("step") or 0)
    if out is None:
        # beside the run; for a run on an object store, in the current directory
        name = f"model_epoch{epoch:06d}{f'_step{step:08d}' if step else ''}.pt"
        out = storage.output_dir(run_dir) / "exported" / name
    out = Path(out).expanduser().absolute()
    partial = out.with_name(f".{out.name}.partial")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        with open(partial, "wb") as handle:
            writer = checkpoints._HashingWriter(handle)  # keeps the OSError that torch turns into a RuntimeError
            try:
                torch.save({"model": model, "config": meta.get("config"), "epoch": epoch, "step": step,
                            "checkpoint": source.name}, writer)
            except RuntimeError:
                if writer.error is not None:
                    raise writer.error from None
                raise
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(partial, out)
    except (OSError, RuntimeError) as err:
        partial.unlink(missing_ok=True)
        cause = err.strerror if isinstance(err, OSError) and err.strerror else str(err).splitlines()[0]
        full = isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT)
        raise ExportError(f"exporting {source.name} to {out} failed: {cause}. Nothing was written. Fix: "
                          f"{'free space on' if full else 'choose a writable place for'} --out "
                          f"({out.parent}).") from None
    return source, out


def _newest_model(run_dir: Path) -> tuple[Path, dict, dict]:
    skipped = []
    for path in checkpoints.committed(run_dir):
        try:
            meta = checkpoints.read_meta(path)
            if checkpoints.is_directory_manifest(meta):
                raise checkpoints.CheckpointUnreadable(
                    f"a Ray Train function's checkpoint: its files under {checkpoints.DATA_DIR}/ are the model, "
                    f"as the function saved them")
            if checkpoints.is_sharded_manifest(meta):
                from raytrain.checkpoint.sharded import export_model

                checkpoints.verify_hash(path)  # the shards' sizes and extra.pt's hash
                try:
                    return path, export_model(path), meta
                except Exception as err:  # torch.distributed.checkpoint raises several types for unreadable shards
                    raise checkpoints.CheckpointUnreadable(f"its shards do not load ({err.__class__.__name__})") \
                        from None
            loaded = checkpoints.load(path)  # state.pt read once, its hash checked on the bytes read
            return path, loaded.state["model"], {**meta, "epoch": loaded.state["epoch"],
                                                 "step": loaded.state.get("step")}
        except checkpoints.CheckpointUnreadable as why:
            skipped.append(f"{path.name} ({why})")
    detail = f": {'; '.join(skipped)}" if skipped else ""
    raise ExportError(f"run directory {run_dir} has no checkpoint to export{detail}. Fix: train it first (raytrain "
                      f"run), or pass the directory of a run that checkpointed.")
