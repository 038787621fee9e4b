"""Honest resume: decided by the driver before Ray starts, from the run directory's checkpoints.

What a resume may change is what the loop declares, on the loop function itself (the built-in loop declares its
own; a loop of the user's declares what it wants, or nothing):

    def my_loop(session, ...): ...
    my_loop.fixed_on_resume = ("model", "train.optimizer")   # refused if changed: the checkpoint has their shape
    my_loop.applied_on_resume = ("train.lr",)                 # set into the restored optimizer when changed

Patterns: a section name covers every key under it ("model"); a dotted key matches itself only
("train.optimizer": the named built-in optimizer); a glob matches what it says ("train.optimizer.*"). A loop that declares nothing has nothing refused and nothing applied: its own optimizer keeps its
own hyperparameters on resume. Everything else (epochs, batch size, workers, checkpoint interval, ...) takes effect.

Before a resume: checkpoint directories that provably never committed (raytrain.checkpoint.checkpoints' staging directories)
are removed; a committed one is never deleted here. The newest committed checkpoint is checked from its manifest
and its state's hash (one read); one whose manifest is damaged is verified by loading its state; checkpoints that exist but
none of which loads refuse the start, naming them. Metrics rows the restored position says should exist but that
are gone (metrics.jsonl truncated or deleted) are named in a warning.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

from raytrain.checkpoint import checkpoints
from raytrain.errors import UsageError
from raytrain.rundir import runrecords
from raytrain.spec import loops

if TYPE_CHECKING:
    import torch


class ResumeRefused(UsageError):
    """The run directory's checkpoints cannot be resumed with this config; str() is one paragraph."""


@dataclass(frozen=True)
class ResumeRules:
    fixed: tuple[str, ...] = ()
    applied: tuple[str, ...] = ()


def rules_of(loop: Any) -> ResumeRules:
    """What the loop function declares (see the module's doc)."""
    return ResumeRules(tuple(getattr(loop, "fixed_on_resume", ()) or ()),
                       tuple(getattr(loop, "applied_on_resume", ()) or ()))


@dataclass
class ResumePlan:
    checkpoint: Optional[Path] = None  # the newest loadable checkpoint, None: train from scratch
    epoch: int = 0
    step: int = 0
    applied: dict[str, tuple[Any, Any]] = field(default_factory=dict)  # key -> (checkpoint's value, now)
    loader_change: Optional[tuple[Any, Any]] = None  # data.loader (the checkpoint's, now) where it differs
    removed_staging: list[str] = field(default_factory=list)


def _flatten(value: Any, prefix: str) -> dict[str, Any]:
    if isinstance(value, dict) and value:
        flat: dict[str, Any] = {}
        for key, inner in value.items():
            flat.update(_flatten(inner, f"{prefix}.{key}" if prefix else str(key)))
        return flat
    return {prefix: value}


def changed_keys(before: dict, after: dict) -> dict[str, tuple[Any, Any]]:
    """Dotted keys whose values differ (a key present on one side only counts as changed)."""
    old, new = _flatten(before, ""), _flatten(after, "")
    return {k: (old.get(k), new.get(k)) for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)}


def _matches(key: str, patterns: tuple[str, ...]) -> bool:
    return any(key == p or ("." not in p and key.startswith(p + ".")) or fnmatch.fnmatchcase(key, p)
               for p in patterns)


def fixed_changes(stored: dict, config: dict, rules: ResumeRules) -> dict[str, tuple[Any, Any]]:
    return {k: v for k, v in changed_keys(stored, config).items() if _matches(k, rules.fixed)}


def applied_changes(stored: dict, config: dict, rules: ResumeRules) -> dict[str, tuple[Any, Any]]:
    """The settings the loop hands to raytrain (rules.applied) that this config changes: key -> (old, new)."""
    return {k: v for k, v in changed_keys(stored, config).items()
            if _matches(k, rules.applied) and not _matches(k, rules.fixed)}


def plan(run_dir: Path, config: dict, warn: Callable[[str], None], rules: ResumeRules,
         checkpointer: checkpoints.FileCheckpointer) -> ResumePlan:
    """What this start resumes from, or ResumeRefused. `config` is the new resolved config (to_dict()). Staging
    directories are removed first: call only while holding the run's lease."""
    result = ResumePlan(removed_staging=checkpointer.remove_staging(warn))
    unreadable = []
    for path in checkpointer.latest():
        stored, position, why = _stored(path)
        if why is not None:
            unreadable.append(f"{path.name} ({why})")
            continue
        if unreadable:
            warn(f"newer checkpoint(s) cannot be loaded and are skipped: {'; '.join(unreadable)}")
        result.checkpoint, result.epoch, result.step = path, position.epoch, position.step
        _refuse_fixed_changes(run_dir, path, position.epoch, fixed_changes(stored, config, rules))
        result.applied = applied_changes(stored, config, rules)
        result.loader_change = changed_keys(stored, config).get("data.loader")
        return result
    if unreadable:
        raise ResumeRefused(
            f"run directory {run_dir} has checkpoints but none of them loads: {'; '.join(unreadable)}. Starting "
            f"over silently would retrain epochs already recorded, and these directories are kept as they are. "
            f"Fix: train under a new --name, or, if they are worthless, delete them to train {run_dir.name} from "
            f"scratch.")
    return result


def _stored(path: Path) -> tuple[dict, checkpoints.Position, Optional[str]]:
    """(the checkpoint's config, its position, why it cannot be used or None), from its manifest when that is
    sound (cheap), else by loading its state (a damaged manifest beside a state that loads is usable)."""
    why = checkpoints.incomplete_reason(path)
    if why is None:
        meta = checkpoints.read_meta(path)
        try:
            checkpoints.verify_hash(path)  # the one read the driver makes: never plan a resume from a bad one
        except checkpoints.CheckpointUnreadable as err:
            return {}, checkpoints.Position(-1), str(err)
        if isinstance(meta.get("config"), dict):
            return meta["config"], checkpoints.Position(int(meta["epoch"]), int(meta.get("step") or 0)), None
    if (path / checkpoints.SHARDS_DIR).is_dir():
        # A sharded checkpoint whose manifest is damaged or whose shards are not all there: its state is in shards
        # that only the workers load, so there is nothing the single-file loader could read (nor advise).
        return {}, checkpoints.Position(-1), why or "its manifest does not list its shards"
    try:
        loaded = checkpoints.load(path)
    except checkpoints.CheckpointUnreadable as err:
        return {}, checkpoints.Position(-1), str(err) if why is None else f"{why}; {err}"
    state = loaded.state
    return (state.get("config") or {}, checkpoints.Position(int(state["epoch"]), int(state.get("step") or 0)),
            None)


def _refuse_fixed_changes(run_dir: Path, path: Path, epoch: int, changes: dict[str, tuple[Any, Any]]) -> None:
    if not changes:
        return
    listed = "; ".join(f"{k}: {old!r} in the checkpoint, {new!r} now" for k, (old, new) in changes.items())
    undo = " ".join(f"{k}={old}" for k, (old, _) in changes.items() if old is not None and not isinstance(old, dict))
    raise ResumeRefused(
        f"run {run_dir.name} resumes from {path.name} (epoch {epoch}), but this config changes what a resume "
        f"cannot change: {listed}. The loop declares these fixed for the life of a run (the checkpoint's weights "
        f"and optimizer state have their shape). Fix: start a new run with another --name to train the changed "
        f"setup" + (f", or resume this one with its own settings (--set {undo.replace(' ', ' --set ')})." if undo
                    else "."))


def missing_rows(run_dir: Path, epoch: int) -> list[int]:
    """Epochs 1..epoch that a restored position says were trained but whose metrics rows are gone."""
    present = {row["epoch"] for row in runrecords.read_metrics(run_dir)}
    return [e for e in range(1, epoch + 1) if e not in present]


def apply_optimizer_settings(optimizer: "torch.optim.Optimizer", changes: dict[str, tuple[Any, Any]]) -> None:
    """Set what the user changed (applied_changes) into a restored optimizer, whose load_state_dict brought back
    the checkpoint's values: the last part of each key names the param-group setting (train.lr -> lr,
    train.optimizer.betas -> betas). Only changed keys: a value an LR scheduler moved since is its business."""
    for key, (_, new) in changes.items():
        name = key.rsplit(".", 1)[1]
        if isinstance(new, list):
            new = tuple(new)
        for group in optimizer.param_groups:
            if name in group:
                group[name] = new
                if name == "lr" and "initial_lr" in group:  # a scheduler's base value
                    group["initial_lr"] = new


def resume_rules(cfg: Any) -> Any:
    """What a resume of this run refuses: what the loop function declares, and for a Ray Train function also the
    loop section's own `fixed_on_resume` (an unchanged script cannot carry the attribute)."""
    rules = rules_of(cfg.loop.target)
    if not loops.is_ray_train_loop(cfg):
        return rules
    return ResumeRules(rules.fixed + tuple(cfg.loop.kwargs.get(loops.FIXED_ON_RESUME) or ()), rules.applied)
