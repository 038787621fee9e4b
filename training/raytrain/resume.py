"""Honest resume: decided by the driver before Ray starts, from the run directory's checkpoints.

A resumed run either applies what the user changed or refuses the change:
- the model section cannot change (the checkpoint's weights have its shape): refused, naming the keys;
- train.optimizer cannot change (the restored optimizer state belongs to one algorithm): refused;
- optimizer settings (train.lr, train.weight_decay, train.momentum) are applied to the restored optimizer by
  apply_optimizer_settings, which session.restore() calls after restoring (only the keys the user changed);
- everything else (epochs, batch size, workers, checkpoint interval, ...) takes effect as it is.
Checkpoint directories that were never completely written (torn) are removed; checkpoints that exist but none
of which loads are never silently ignored: the start is refused, naming them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

from raytrain import checkpoints
from raytrain.errors import UsageError

if TYPE_CHECKING:
    import torch

# Keys of the resolved config that a resume cannot change, besides the whole model section.
FIXED_ON_RESUME = ("train.optimizer",)
# Keys a resume applies to the restored optimizer.
OPTIMIZER_SETTINGS = ("train.lr", "train.weight_decay", "train.momentum")
RAY_SNAPSHOT = "checkpoint_manager_snapshot.json"  # Ray Train V2's record of the checkpoints it registered


class ResumeRefused(UsageError):
    """The run directory's checkpoints cannot be resumed with this config; str() is one paragraph."""


@dataclass
class ResumePlan:
    checkpoint: Optional[Path] = None  # the newest loadable checkpoint, None: train from scratch
    epoch: int = 0
    applied: dict[str, tuple[Any, Any]] = field(default_factory=dict)  # key -> (checkpoint's value, now)
    removed_torn: list[str] = field(default_factory=list)


def _flatten(value: Any, prefix: str) -> dict[str, Any]:
    if isinstance(value, dict):
        flat: dict[str, Any] = {}
        for key, inner in value.items():
            flat.update(_flatten(inner, f"{prefix}.{key}" if prefix else str(key)))
        return flat
    return {prefix: value}


def changed_keys(before: dict, after: dict, section: str) -> dict[str, tuple[Any, Any]]:
    """Dotted keys under `section` whose values differ (a key present on one side only counts as changed)."""
    old = _flatten(before.get(section, {}), section)
    new = _flatten(after.get(section, {}), section)
    return {k: (old.get(k), new.get(k)) for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)}


def _stored_config(path: Path, meta: dict) -> dict:
    if isinstance(meta.get("config"), dict):
        return meta["config"]
    # Checkpoints written before meta.json carried the config: read it from the state, tensors memory-mapped.
    import torch

    state = torch.load(path / checkpoints.STATE_FILE, map_location="cpu", weights_only=True, mmap=True)
    return state.get("config") or {}


def ray_registered(run_dir: Path) -> set[str]:
    """Checkpoint directories that Ray Train's controller recorded in its snapshot (its own file)."""
    import json

    try:
        snapshot = json.loads((run_dir / RAY_SNAPSHOT).read_text(encoding="utf-8"))
        return {r["checkpoint_dir_name"] for r in snapshot.get("checkpoint_results", [])
                if isinstance(r, dict) and isinstance(r.get("checkpoint_dir_name"), str)}
    except (OSError, ValueError, AttributeError):
        return set()


def remove_torn_checkpoints(run_dir: Path, warn: Callable[[str], None]) -> list[str]:
    """Delete checkpoint directories that were never completely written. Call only while holding the run's
    lease: a live writer's upload in progress also looks torn."""
    import shutil

    removed = []
    registered = ray_registered(run_dir)
    for path in sorted(run_dir.glob(f"{checkpoints.DIR_PREFIX}*")):
        if path.name in registered:
            continue  # Ray Train's checkpoint manager refuses to start without it; resume skips it, Ray prunes it
        if path.is_dir() and (why := checkpoints.torn_reason(path)) is not None:
            shutil.rmtree(path, ignore_errors=True)
            warn(f"checkpoint {path.name} is unreadable ({why}): a torn write, removed; falling back to the "
                 f"one before")
            removed.append(path.name)
    return removed


def plan(run_dir: Path, config: dict, warn: Callable[[str], None]) -> ResumePlan:
    """What this start resumes from, or ResumeRefused. `config` is the new resolved config (to_dict()). Torn
    checkpoint directories are removed first: call only while holding the run's lease."""
    result = ResumePlan(removed_torn=remove_torn_checkpoints(run_dir, warn))
    unreadable = []
    for path in checkpoints.candidates(run_dir):
        try:
            meta = checkpoints.verify(path)
            stored = _stored_config(path, meta)
        except (checkpoints.CheckpointUnreadable, OSError, RuntimeError, ValueError) as why:
            unreadable.append(f"{path.name} ({why})")
            continue
        if unreadable:
            warn(f"newer checkpoint(s) cannot be loaded and are skipped: {'; '.join(unreadable)}")
        result.checkpoint, result.epoch = path, int(meta["epoch"])
        _refuse_fixed_changes(run_dir, path, result.epoch, stored, config)
        result.applied = optimizer_changes(stored, config)
        return result
    if unreadable:
        raise ResumeRefused(
            f"run directory {run_dir} has checkpoints but none of them loads: {'; '.join(unreadable)}. Starting "
            f"over silently would retrain epochs already recorded. Fix: train under a new --name, or delete these "
            f"checkpoint directories to train {run_dir.name} from scratch.")
    return result


def _refuse_fixed_changes(run_dir: Path, path: Path, epoch: int, stored: dict, config: dict) -> None:
    changes = changed_keys(stored, config, "model")
    changes.update({k: v for k, v in changed_keys(stored, config, "train").items() if k in FIXED_ON_RESUME})
    if not changes:
        return
    listed = "; ".join(f"{k}: {old!r} in the checkpoint, {new!r} now" for k, (old, new) in changes.items())
    undo = " ".join(f"{k}={old}" for k, (old, _) in changes.items() if old is not None)
    raise ResumeRefused(
        f"run {run_dir.name} resumes from {path.name} (epoch {epoch}), but this config changes what a resume "
        f"cannot change: {listed}. The model section and train.optimizer are fixed for the life of a run (the "
        f"checkpoint's weights and optimizer state have their shape). Fix: start a new run with another --name "
        f"to train the changed model"
        + (f", or resume this one with its own settings (--set {undo.replace(' ', ' --set ')})." if undo else "."))


def optimizer_changes(stored: dict, config: dict) -> dict[str, tuple[Any, Any]]:
    """The optimizer settings (train.lr, weight_decay, momentum) that this config changes from the checkpoint's:
    key -> (checkpoint's value, now)."""
    return {k: v for k, v in changed_keys(stored, config, "train").items() if k in OPTIMIZER_SETTINGS}


def apply_optimizer_settings(optimizer: "torch.optim.Optimizer", changes: dict[str, tuple[Any, Any]]) -> None:
    """Set what the user changed (optimizer_changes) into a restored optimizer, whose load_state_dict brought back
    the checkpoint's values. Only changed keys: a value an LR scheduler moved since is the scheduler's business."""
    for key, (_, new) in changes.items():
        name = key.split(".", 1)[1]
        for group in optimizer.param_groups:
            if name in group:
                group[name] = new
                if name == "lr" and "initial_lr" in group:  # a scheduler's base value
                    group["initial_lr"] = new
