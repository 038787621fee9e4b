"""The layout of one run, STORAGE/NAME/: config.yaml (resolved config), metrics.jsonl (one row per epoch),
events.jsonl (starts and resumes), result.json (the outcome), checkpoint_* (written through Ray Train).

Rows and results are written so that a reader never sees half a file: result.json by rename, metrics rows as
whole lines, and on resume the rows past the restored epoch are dropped (they will be trained again).

One attempt writes a run at a time (raytrain.lease): a process that holds or works for an attempt registers its
fence with fence_writes(), and every commit below checks it first, so an attempt whose lease was taken over
commits nothing. results.jsonl keeps every attempt's result; result.json is the latest one's. (Each attempt's
driver console lines are kept beside the run by raytrain.console.)"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional, Protocol

from raytrain import console, files

CONFIG_FILE = "config.yaml"
METRICS_FILE = "metrics.jsonl"
EVENTS_FILE = "events.jsonl"
RESULT_FILE = "result.json"
RESULTS_HISTORY_FILE = "results.jsonl"


class Fence(Protocol):
    token: int

    def check(self) -> None:
        """Raise (raytrain.lease.LeaseLost) if this process's attempt no longer holds the run."""


_fences: dict[Path, Fence] = {}


def fence_writes(run_dir: Path, fence: Optional[Fence]) -> None:
    """From now on, commits to run_dir by this process first pass fence.check() (None: stop checking)."""
    key = Path(run_dir).absolute()
    if fence is None:
        _fences.pop(key, None)
    else:
        _fences[key] = fence


def check_fence(run_dir: Path) -> Optional[int]:
    """Just before a commit: raise if this process's attempt lost the run; its token (None when unfenced)."""
    fence = _fences.get(Path(run_dir).absolute())
    if fence is None:
        return None
    fence.check()
    return fence.token


def run_dir_of(storage_path: str, name: str) -> Path:
    return Path(storage_path).expanduser().absolute() / name


def write_atomic(path: Path, text: str) -> None:
    """A run record written whole (files.write_atomic), the run's fence checked at the last moment before the rename
    (raytrain.lease says what race remains)."""
    files.write_atomic(path, text, before_replace=lambda: check_fence(path.parent))


def write_config(run_dir: Path, config_yaml: str) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(run_dir / CONFIG_FILE, config_yaml)


def _append_line(path: Path, row: dict) -> None:
    check_fence(path.parent)
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(row) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def _warn_stderr(message: str) -> None:
    console.warning(message, out=sys.stderr)


_warned: set[tuple[str, int, str]] = set()


def read_jsonl(path: Path, warn: Optional[Callable[[str], None]] = None) -> list[dict]:
    """The JSON objects of a JSON-lines file. A damaged line (cut short by a crash or a full disk, not UTF-8,
    not an object) is skipped with a warning naming the file and line, once per process; a last line cut short
    is skipped silently, as a writer may be appending it right now."""
    rows: list[dict] = []
    try:
        raw = path.read_bytes()
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


def append_metrics(run_dir: Path, row: dict) -> None:
    token = check_fence(run_dir)
    _append_line(run_dir / METRICS_FILE, row if token is None else {**row, "attempt": token})


def read_metrics(run_dir: Path) -> list[dict]:
    """The per-epoch rows; one without an integer epoch is skipped with a warning, like a damaged line."""
    rows = []
    for row in read_jsonl(run_dir / METRICS_FILE):
        if isinstance(row.get("epoch"), int) and not isinstance(row.get("epoch"), bool):
            rows.append(row)
        else:
            key = (str(run_dir / METRICS_FILE), -1, json.dumps(row, sort_keys=True)[:200])
            if key not in _warned:
                _warned.add(key)
                _warn_stderr(f"{run_dir / METRICS_FILE} has a row without an integer epoch ({key[2]}); skipped")
    return rows


def truncate_metrics(run_dir: Path, last_epoch: int) -> None:
    """Keep the rows of epochs <= last_epoch: later ones are about to be trained again."""
    path = run_dir / METRICS_FILE
    if path.exists():
        kept = [row for row in read_metrics(run_dir) if row["epoch"] <= last_epoch]
        write_atomic(path, "".join(json.dumps(row) + "\n" for row in kept))




def append_event(run_dir: Path, event: str, **fields: Any) -> None:
    _append_line(run_dir / EVENTS_FILE, {"event": event, "time": time.time(), **fields})


def read_events(run_dir: Path) -> list[dict]:
    return read_jsonl(run_dir / EVENTS_FILE)


def write_result(run_dir: Path, result: dict) -> None:
    """result.json is this attempt's outcome; results.jsonl keeps every attempt's, so a failed attempt never
    erases the record of one that trained."""
    run_dir.mkdir(parents=True, exist_ok=True)
    token = check_fence(run_dir)
    if token is not None:
        result = {**result, "attempt": token}
    write_atomic(run_dir / RESULT_FILE, json.dumps(result, indent=2) + "\n")
    _append_line(run_dir / RESULTS_HISTORY_FILE, {"time": time.time(), **result})


def read_result(run_dir: Path) -> Optional[dict]:
    path = run_dir / RESULT_FILE
    try:
        result = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (UnicodeDecodeError, ValueError) as err:
        _warn_stderr(f"{path} is damaged ({err.__class__.__name__}) and is ignored")
        return None
    return result if isinstance(result, dict) else None
