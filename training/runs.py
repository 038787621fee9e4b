"""The layout of one run, STORAGE/NAME/: config.yaml (resolved config), metrics.jsonl (one row per epoch),
events.jsonl (starts and resumes), result.json (the outcome), checkpoint_* (written through Ray Train).

Rows and results are written so that a reader never sees half a file: result.json by rename, metrics rows as
whole lines, and on resume the rows past the restored epoch are dropped (they will be trained again)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Optional

CONFIG_FILE = "config.yaml"
METRICS_FILE = "metrics.jsonl"
EVENTS_FILE = "events.jsonl"
RESULT_FILE = "result.json"


def run_dir_of(storage_path: str, name: str) -> Path:
    return Path(storage_path).expanduser().absolute() / name


def write_atomic(path: Path, text: str) -> None:
    """Write by rename, so that a reader (or a crash) never sees half a file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def write_config(run_dir: Path, config_yaml: str) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(run_dir / CONFIG_FILE, config_yaml)


def _append_line(path: Path, row: dict) -> None:
    with open(path, "a") as handle:
        handle.write(json.dumps(row) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def read_jsonl(path: Path) -> list[dict]:
    """The rows of a JSON-lines file; a line cut short by a crash is skipped."""
    rows = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except ValueError:
                continue  # a line cut short by a crash
    return rows


def append_metrics(run_dir: Path, row: dict) -> None:
    _append_line(run_dir / METRICS_FILE, row)


def read_metrics(run_dir: Path) -> list[dict]:
    return read_jsonl(run_dir / METRICS_FILE)


def truncate_metrics(run_dir: Path, last_epoch: int) -> None:
    """Keep the rows of epochs <= last_epoch: later ones are about to be trained again."""
    path = run_dir / METRICS_FILE
    if path.exists():
        kept = [row for row in read_metrics(run_dir) if row.get("epoch", 0) <= last_epoch]
        write_atomic(path, "".join(json.dumps(row) + "\n" for row in kept))


def append_event(run_dir: Path, event: str, **fields: Any) -> None:
    _append_line(run_dir / EVENTS_FILE, {"event": event, "time": time.time(), **fields})


def read_events(run_dir: Path) -> list[dict]:
    return read_jsonl(run_dir / EVENTS_FILE)


def write_result(run_dir: Path, result: dict) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(run_dir / RESULT_FILE, json.dumps(result, indent=2) + "\n")


def read_result(run_dir: Path) -> Optional[dict]:
    path = run_dir / RESULT_FILE
    return json.loads(path.read_text()) if path.exists() else None
