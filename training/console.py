"""raytrain's own console lines, in one of two formats:

- human (the default): `raytrain: <message>` lines, epoch rows as `epoch 3/12  train_loss ...`;
- json: one JSON object per line, for log collectors (KubeRay documents Fluent Bit), with the keys
  time (ISO 8601, UTC), level, run, rank (the worker rank the line speaks for, null for the driver), event,
  message (the human line) and fields (the event's data, e.g. an epoch's metrics row).

The CLI picks the format (--log-format, or RAYTRAIN_LOG_FORMAT read in cli.py) and the run name; the rest of the
package only says what happened.
"""

from __future__ import annotations

import json
import sys
from datetime import datetime, timezone
from typing import Any, Optional, TextIO

FORMATS = ("human", "json")
_settings: dict[str, Any] = {"format": "human", "run": None}


def configure(log_format: Optional[str] = None, run: Optional[str] = None) -> None:
    if log_format is not None:
        if log_format not in FORMATS:
            raise ValueError(f"log format {log_format!r} is not one of {', '.join(FORMATS)}")
        _settings["format"] = log_format
    if run is not None:
        _settings["run"] = run


def is_json() -> bool:
    return _settings["format"] == "json"


def record(level: str, event: str, message: str, rank: Optional[int] = None, **fields: Any) -> dict:
    return {"time": datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": level, "run": _settings["run"], "rank": rank, "event": event, "message": message,
            "fields": fields}


def _emit(level: str, event: str, message: str, human: str, out: Optional[TextIO], rank: Optional[int],
          fields: dict) -> None:
    out = out or (sys.stderr if level == "error" else sys.stdout)
    if is_json():
        text = json.dumps(record(level, event, message, rank, **fields), default=str)
    else:
        text = human
    out.write(text + "\n")
    out.flush()


def info(event: str, message: str, *, out: Optional[TextIO] = None, rank: Optional[int] = None, **fields: Any) -> None:
    _emit("info", event, message, f"raytrain: {message}", out, rank, fields)


def warning(message: str, *, out: Optional[TextIO] = None, rank: Optional[int] = None, **fields: Any) -> None:
    _emit("warning", "warning", message, f"raytrain: warning: {message}", out, rank, fields)


def error(message: str, *, out: Optional[TextIO] = None, **fields: Any) -> None:
    _emit("error", "error", message, f"raytrain: error: {message}", out, None, fields)


def epoch(line: str, row: dict, *, out: Optional[TextIO] = None) -> None:
    """An epoch's row as rank 0 wrote it to metrics.jsonl; `line` is its human form."""
    _emit("info", "epoch", line, line, out, 0, row)
