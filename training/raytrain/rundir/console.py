"""raytrain's own console lines, in one of two formats:

- human (the default): `raytrain: <message>` lines, epoch rows as `epoch 3/12  train_loss ...`;
- json: one JSON object per line, for log collectors (KubeRay documents Fluent Bit), with the keys
  time (ISO 8601, UTC), level, run, rank (the worker rank the line speaks for, null for the driver), event,
  message (the human line) and fields (the event's data, e.g. an epoch's metrics row).

The CLI picks the format (--log-format, or RAYTRAIN_LOG_FORMAT read in cli.py) and the run name, and for a
training command keeps a copy of every line in the run directory (`keep_copy`): a RayJob attempt's pods, and
their logs, are deleted when it fails, its run directory on the shared volume is not. The rest of the package
only says what happened.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Optional, TextIO

from raytrain.rundir import layout, storage

FORMATS = ("human", "json")
_settings: dict[str, Any] = {"format": "human", "run": None, "copy": None}


def configure(log_format: Optional[str] = None, run: Optional[str] = None) -> None:
    if log_format is not None:
        if log_format not in FORMATS:
            raise ValueError(f"log format {log_format!r} is not one of {', '.join(FORMATS)}")
        _settings["format"] = log_format
    if run is not None:
        _settings["run"] = run


def keep_copy(run_dir: Path) -> Path:
    """From now on, also append every line to RUN_DIR/driver-logs/<UTC time>-<host>-<pid>.log (one per attempt).
    On an object store (no append) the copy is written locally and uploaded when it stops (stop_copy): a driver
    killed by SIGKILL leaves its lines in the pod's log only."""

    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
    name = f"{stamp}-{socket.gethostname()}-{os.getpid()}.log"
    stop_copy()
    if storage.is_remote(run_dir):
        _settings["upload"] = storage.as_path(run_dir) / layout.DRIVER_LOGS_DIR / name
        path = storage.scratch_dir("driver-log") / name
    else:
        path = Path(run_dir) / layout.DRIVER_LOGS_DIR / name
        path.parent.mkdir(parents=True, exist_ok=True)
    _settings["copy"] = open(path, "a", encoding="utf-8", buffering=1)  # line-buffered: a killed pod loses little
    return path


def copy_destination() -> Optional[str]:
    """Where the driver log ends up, for messages: the file, or the object it is uploaded to when it stops."""
    if _settings["copy"] is None:
        return None
    upload = _settings.get("upload")
    return f"{upload} (uploaded when the attempt ends)" if upload is not None else _settings["copy"].name


def copy_path() -> Optional[Path]:
    """Where keep_copy() is writing now, if anywhere."""
    return Path(_settings["copy"].name) if _settings["copy"] is not None else None


def stop_copy(error: Optional[BaseException] = None) -> None:
    """Close the copy (and upload it, on an object store). `error`: what the command ended with, already said in
    its paragraph: one failure, one paragraph. A storage error (the bucket missing or unreachable) is not tried
    again by the upload; after any other error an upload that fails is not a second paragraph either."""
    copy, upload = _settings["copy"], _settings.pop("upload", None)
    if copy is None:
        return
    copy.close()
    _settings["copy"] = None
    if upload is not None:
        local = Path(copy.name)
        try:
            if not isinstance(error, storage.StorageError):
                storage.upload_file(local, upload)
        except Exception as err:  # the store unreachable at the end: the lines stay in the pod's log
            if error is None:
                print(f"raytrain: could not upload the driver log to {upload}: {err}", file=sys.stderr)
        finally:
            storage.remove_tree(local.parent)


def is_json() -> bool:
    return _settings["format"] == "json"


def record(level: str, event: str, message: str, /, rank: Optional[int] = None, **fields: Any) -> dict:
    return {"time": datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": level, "run": _settings["run"], "rank": rank, "event": event, "message": message,
            "fields": fields}


def _emit(level: str, event: str, message: str, human: str, out: Optional[TextIO], rank: Optional[int],
          fields: dict, bar: Optional[float] = None) -> None:
    out = out or (sys.stderr if level == "error" else sys.stdout)
    if is_json():
        text = json.dumps(record(level, event, message, rank, **fields), default=str)
    else:
        text = human
    if _settings["copy"] is not None:
        _settings["copy"].write(text + "\n")
    if bar is not None and not is_json():  # a terminal: one line redrawn, a newline once complete
        done = int(30 * min(bar, 1.0))
        out.write(f"\r\033[K[{'#' * done}{'.' * (30 - done)}] {text}" + ("\n" if bar >= 1.0 else ""))
    else:
        out.write(text + "\n")
    out.flush()


# Positional-only names, so that a field may be called `event` or `message` too.
def info(event: str, message: str, /, *, out: Optional[TextIO] = None, rank: Optional[int] = None,
         **fields: Any) -> None:
    _emit("info", event, message, f"raytrain: {message}", out, rank, fields)


def warning(message: str, /, *, out: Optional[TextIO] = None, rank: Optional[int] = None, **fields: Any) -> None:
    _emit("warning", "warning", message, f"raytrain: warning: {message}", out, rank, fields)


def error(message: str, /, *, out: Optional[TextIO] = None, **fields: Any) -> None:
    _emit("error", "error", message, f"raytrain: error: {message}", out, None, fields)


def output(line: str, /, *, out: Optional[TextIO] = None, rank: int = 0) -> None:
    """A line a worker printed (raytrain.rundir.workerlogs), as it printed it."""
    _emit("info", "output", line, line, out, rank, {})


def epoch(line: str, row: dict, /, *, out: Optional[TextIO] = None, bar: Optional[float] = None) -> None:
    """An epoch's row as rank 0 wrote it to metrics.jsonl; `line` is its human form; `bar`: the share of the run
    done, to draw a progress bar on an interactive terminal."""
    _emit("info", "epoch", line, line, out, 0, row, bar)
