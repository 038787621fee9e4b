"""The records of one run, STORAGE/NAME/ (every name in it: raytrain.rundir.layout): config.yaml (resolved
config), metrics.jsonl (one row per epoch),
steps.jsonl (per-step rows, when run.log_every_steps asks), events.jsonl (starts, resumes, warnings), result.json
(the outcome) and results.jsonl (every attempt's), checkpoint_* (raytrain.checkpoint.checkpoints).

Rows and results are written so that a reader never sees half a file: result.json by rename, rows as whole
lines, and on resume the rows past the restored position are dropped (they will be trained again).

One attempt writes a run at a time (raytrain.rundir.lease). Writes go through `Records`, made with the process's run
control (raytrain.rundir.runcontrol): every commit first passes its fence, so an attempt whose lease was taken over, or
that is over, commits nothing. Reading needs no control: the module's read_* functions."""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

from raytrain.rundir import atomicfile, console, layout, storage, workerlogs
from raytrain.rundir.runcontrol import UNFENCED, Control


def run_dir_of(storage_path: str, name: str) -> Path:
    """STORAGE/NAME: a directory, or a prefix in an object store (raytrain.rundir.storage)."""
    if storage.is_remote(storage_path):
        return storage.as_path(storage_path) / name
    return Path(storage_path).expanduser().absolute() / name


class Records:
    """The writer of one run directory's records, every commit fenced by `control` (UNFENCED: no lease held)."""

    def __init__(self, run_dir: Path, control: Control = UNFENCED):
        self.run_dir, self.control = storage.as_path(run_dir), control

    @property
    def token(self) -> Optional[int]:
        return self.control.token

    def check(self) -> None:
        """Just before a commit: raise AttemptEnded if this process may no longer write the run."""
        self.control.check()

    def write_atomic(self, path: Path, text: str) -> None:
        """A run record written whole (files.write_atomic), the fence checked at the last moment before the rename
        (raytrain.rundir.lease says what race remains)."""
        atomicfile.write_atomic(path, text, before_replace=self.check)

    def write_config(self, config_yaml: str) -> None:
        storage.makedirs(self.run_dir)
        self.write_atomic(self.run_dir / layout.CONFIG_FILE, config_yaml)

    def _append_line(self, name: str, row: dict) -> None:
        self.check()
        workerlogs.flush_pending()  # what rank 0 printed before this row is shown before it
        if storage.is_remote(self.run_dir):  # no append in an object store: a conditional rewrite
            storage.append_bytes(self.run_dir / name, (json.dumps(row) + "\n").encode("utf-8"))
            return
        with open(self.run_dir / name, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(row) + "\n")
            handle.flush()
            os.fsync(handle.fileno())

    def _stamped(self, row: dict) -> dict:
        return row if self.token is None else {**row, "attempt": self.token}

    def append_metrics(self, row: dict) -> None:
        self._append_line(layout.METRICS_FILE, self._stamped(row))

    def append_step(self, row: dict) -> None:
        self._append_line(layout.STEPS_FILE, self._stamped(row))

    def append_event(self, event: str, **fields: Any) -> None:
        self._append_line(layout.EVENTS_FILE, {"event": event, "time": time.time(), **fields})

    def truncate_metrics(self, last_epoch: int, step: int = 0) -> None:
        """Keep the epoch rows of epochs <= last_epoch and the step rows up to (last_epoch + 1, step): later ones
        are about to be trained again."""
        path = self.run_dir / layout.METRICS_FILE
        if path.exists():
            rows = read_metrics(self.run_dir)
            kept = [row for row in rows if row["epoch"] <= last_epoch]
            self.write_atomic(path, "".join(json.dumps(row) + "\n" for row in kept))
            self._dropped([row for row in rows if row["epoch"] > last_epoch], last_epoch, step)
        steps = self.run_dir / layout.STEPS_FILE
        if steps.exists():
            kept = [row for row in read_jsonl(steps) if _before(row, last_epoch, step)]
            self.write_atomic(steps, "".join(json.dumps(row) + "\n" for row in kept))

    def drop_metrics_from(self, epoch: int, step: Optional[int] = None) -> None:
        """Drop the epoch rows at or past (epoch, step) (row_key's order): a function that reports a position again
        trains it again, so the rows it reported there before are replaced, not repeated."""
        path = self.run_dir / layout.METRICS_FILE
        rows = read_metrics(self.run_dir)
        kept = [row for row in rows if row_key(row) < (epoch, -1 if step is None else step)]
        self.write_atomic(path, "".join(json.dumps(row) + "\n" for row in kept))
        self._dropped([row for row in rows if row_key(row) >= (epoch, -1 if step is None else step)], epoch - 1,
                      step or 0)

    def _dropped(self, rows: list[dict], epoch: int, step: int) -> None:
        """Rows dropped to be trained again: the newest time they were written (their `timing`) kept as a
        `rows_dropped` event, the end of the progress lost (raytrain.rundir.goodput) that the file no longer shows."""
        times = [row["timing"]["time"] for row in rows if isinstance(row.get("timing"), dict)
                 and isinstance(row["timing"].get("time"), (int, float))]
        if times:
            self.append_event("rows_dropped", epoch=epoch, step=step, rows=len(rows), until=max(times))

    def write_result(self, result: dict) -> None:
        """result.json is this attempt's outcome; results.jsonl keeps every attempt's, so a failed attempt never
        erases the record of one that trained."""
        storage.makedirs(self.run_dir)
        result = self._stamped(result)
        self.write_atomic(self.run_dir / layout.RESULT_FILE, json.dumps(result, indent=2) + "\n")
        self._append_line(layout.RESULTS_HISTORY_FILE, {"time": time.time(), **result})


def plain_number(value: Any) -> Any:
    """Tensors and numpy scalars as plain numbers, so that metrics rows are JSON."""
    if hasattr(value, "item") and callable(value.item):
        try:
            value = value.item()
        except (TypeError, ValueError, RuntimeError):
            return value
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else value
    return value


def row_key(row: dict) -> tuple[int, int]:
    """A metrics row's position: (epoch, the integer `step` it reports, or -1 for none: before any step)."""
    step = row.get("step")
    return row["epoch"], step if isinstance(step, int) and not isinstance(step, bool) else -1


def diverged(metrics: Any) -> list[str]:
    """The losses among a report's metrics (keys that end in "loss") that are NaN or infinite: a diverged run."""
    found = []
    for key, value in metrics.items():
        if str(key).endswith("loss"):
            if hasattr(value, "item") and callable(value.item):
                try:
                    value = value.item()
                except (TypeError, ValueError, RuntimeError):
                    continue
            if isinstance(value, float) and not math.isfinite(value):
                found.append(str(key))
    return found


def _before(row: dict, last_epoch: int, step: int) -> bool:
    """A step row of (epoch, step) trained at or before the position (last completed epoch, steps into the next)."""
    epoch, at = row.get("epoch"), row.get("step")
    if not isinstance(epoch, int) or not isinstance(at, int):
        return False
    return epoch <= last_epoch or (epoch == last_epoch + 1 and at <= step)


def _warn_stderr(message: str) -> None:
    console.warning(message, out=sys.stderr)


_warned: set[tuple[str, int, str]] = set()


def read_jsonl(path: Path, warn: Optional[Callable[[str], None]] = None) -> list[dict]:
    """The JSON objects of a JSON-lines file. A damaged line (cut short by a crash or a full disk, not UTF-8,
    not an object) is skipped with a warning naming the file and line, once per process; a last line cut short
    is skipped silently, as a writer may be appending it right now."""
    rows: list[dict] = []
    try:
        raw = storage.read_bytes(path)
    except FileNotFoundError:
        return rows
    lines = raw.split(b"\n")
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line.decode("utf-8"))
            if not isinstance(row, dict):
                raise ValueError(f"a JSON {type(row).__name__}, not an object")
        except (UnicodeDecodeError, ValueError) as err:
            if number == len(lines):  # no newline after it yet: being written, or cut short by a crash
                continue
            why = "not UTF-8" if isinstance(err, UnicodeDecodeError) else str(err).split(":")[0]
            key = (str(path), number, why)
            if key not in _warned:
                _warned.add(key)
                (warn or _warn_stderr)(f"{path} line {number} is damaged ({why}) and is skipped")
            continue
        rows.append(row)
    return rows


def read_metrics(run_dir: Path) -> list[dict]:
    """The per-epoch rows; one without an integer epoch is skipped with a warning, like a damaged line."""
    rows = []
    for row in read_jsonl(run_dir / layout.METRICS_FILE):
        if isinstance(row.get("epoch"), int) and not isinstance(row.get("epoch"), bool):
            rows.append(row)
        else:
            key = (str(run_dir / layout.METRICS_FILE), -1, json.dumps(row, sort_keys=True)[:200])
            if key not in _warned:
                _warned.add(key)
                _warn_stderr(f"{run_dir / layout.METRICS_FILE} has a row without an integer epoch ({key[2]}); skipped")
    return rows


def read_steps(run_dir: Path) -> list[dict]:
    return read_jsonl(run_dir / layout.STEPS_FILE)


def read_events(run_dir: Path) -> list[dict]:
    return read_jsonl(run_dir / layout.EVENTS_FILE)


def read_result(run_dir: Path) -> Optional[dict]:
    path = run_dir / layout.RESULT_FILE
    try:
        result = json.loads(storage.read_bytes(path).decode("utf-8"))
    except FileNotFoundError:
        return None
    except (UnicodeDecodeError, ValueError) as err:
        _warn_stderr(f"{path} is damaged ({err.__class__.__name__}) and is ignored")
        return None
    return result if isinstance(result, dict) else None
