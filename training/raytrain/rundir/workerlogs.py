"""Every rank's own output (what a Ray Train function or a Session loop prints, its warnings) kept in the run
directory as it is written, rank 0's shown on the driver's console; and each rank's first failure recorded beside it,
so that a post-mortem (raytrain.rundir.postmortem, `raytrain why`) outlives the pods, the cluster and the driver.

The driver joins Ray with log_to_driver=False (raytrain.driver.raytrainer): its console carries raytrain's lines,
not every worker's output and Ray's retry tracebacks. So what a rank writes to sys.stdout and sys.stderr (Ray
Train sends a worker's print() through its root logger to sys.stderr) would reach only Ray's session logs on its
node, gone with the pod. `RankOutput` copies it, still writing it where it went, to
RUN_DIR/worker-logs/attempt-<N>-rank<R>.log (whole lines, about once a second: appended to a file, or an object
rewritten longer on an object store); the driver's progress thread follows rank 0's file (`Follower`) and prints
each new line through raytrain.rundir.console, which keeps a copy in driver-logs/ too.

A rank whose loop raises records it first (`record_failure`), before the exception reaches Ray Train:
RUN_DIR/worker-logs/attempt-<N>-rank<R>.error.json, written once per rank and attempt (the first failure; a
restarted group's later one leaves it), small and bounded: the rank, the world size, its node (IP, hostname), pid,
time, the exception's type and message, the traceback's text (its end) and the last lines the rank printed.

Only text written through Python's sys.stdout and sys.stderr is copied (print, warnings, logging to the console);
a C library writing to the file descriptors directly (NCCL) stays in Ray's logs. Nothing here ever raises into the
code that prints or fails: a copy or a record that cannot be written is given up with one line on the worker's own
stderr.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import socket
import sys
import threading
import time
import traceback
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Optional, TextIO

from raytrain.rundir import atomicfile, layout, storage

FLUSH_INTERVAL_S = 1.0
# The most of a rank's output kept per attempt (what its earlier worker groups wrote counts too): on an object
# store each flush rewrites the object whole, so a run that prints without end would rewrite ever more each second.
# Past it, the output stays in Ray's logs only (and its last lines in the rank's failure record).
MAX_COPY_BYTES = 16 * 2**20
FAILURE_SUFFIX = ".error.json"
# A failure record's bounds: the traceback's end, the message's start, the last lines printed (each cut)
MAX_TRACEBACK_CHARS = 16000
MAX_MESSAGE_CHARS = 4000
TAIL_LINES = 20
MAX_LINE_CHARS = 500
_active: list["RankOutput"] = []  # the copy this process makes now, if any


def flush_pending() -> None:
    """Write what this process printed so far, before one of its records (a metrics row, an event) that the driver
    shows after it: a line printed before a report comes before the report's row on the console too."""
    for copy in _active[:]:  # a copy, as stop() removes from the list
        copy.flush()


def log_path(run_dir: Path, attempt: Optional[int], rank: int = 0) -> Path:
    """RUN_DIR/worker-logs/attempt-<N>-rank<R>.log (attempt 0: a run written without a lease)."""
    return storage.as_path(run_dir) / layout.WORKER_LOGS_DIR / f"attempt-{attempt or 0}-rank{rank}.log"


def failure_path(run_dir: Path, attempt: Optional[int], rank: int = 0) -> Path:
    """RUN_DIR/worker-logs/attempt-<N>-rank<R>.error.json: rank R's first failure in attempt N."""
    return storage.as_path(run_dir) / layout.WORKER_LOGS_DIR / f"attempt-{attempt or 0}-rank{rank}{FAILURE_SUFFIX}"


class _RayRecords(logging.Filter):
    """On Ray's console handlers: notes each record that is not to be copied as it is emitted, so that its line
    stays in Ray's logs only:
    - Ray's own loggers' (`ray`, `ray.*`: Ray Train's "Moving model to device"), and the INFO and DEBUG records of
      libraries, which Ray Train's root logger at INFO lets through (botocore's "Found credentials" as rank 0
      writes to S3);
    - the root logger's record of a print() already copied from sys.stdout: Ray Train's print patch (2.60,
      ray/train/v2/_internal/logging/patch_print.py) writes a print to sys.stdout itself when sys.stdout is not
      sys.__stdout__ (as while this copy runs) and then logs the same message to the root logger, whose handler
      writes it to sys.stderr: copied twice without this.
    print() and any logger's warnings and errors are copied once. Ray's console handler writes a record in one write
    (message and newline), in this thread, right after its filters pass."""

    def __init__(self) -> None:
        super().__init__()
        self.local = threading.local()

    def note_stdout(self, text: str) -> None:
        """Keeps the end of what this thread last wrote to sys.stdout (print writes its text and its end apart)."""
        self.local.stdout = (getattr(self.local, "stdout", "") + text)[-(2 * MAX_LINE_CHARS):]

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(self.local, "record", None) is not record:  # once per record, whatever its handlers
            ray_record = record.name == "ray" or record.name.startswith("ray.")
            chatter = record.name != "root" and record.levelno < logging.WARNING
            message = record.getMessage()
            printed = getattr(self.local, "stdout", "")
            self.local.stdout = ""
            echo = record.name == "root" and record.levelno == logging.INFO and bool(printed) \
                and printed.rstrip("\n").endswith(message)
            self.local.record = record
            self.local.skipped = message if ray_record or chatter or echo else None
        self.local.message = self.local.skipped
        return True

    def is_ray_line(self, text: str) -> bool:
        """Whether `text` is the write of the record just noted (each note answers one write)."""
        message = getattr(self.local, "message", None)
        self.local.message = None
        return message is not None and message in text


class _Tee:
    """A text stream that writes to `original` and hands the same text to `sink`."""

    def __init__(self, original: TextIO, sink: "RankOutput", stdout: bool = False):
        self._original, self._sink, self._stdout = original, sink, stdout

    def write(self, text: str) -> int:
        if self._stdout:
            self._sink.ray_records.note_stdout(text)
        if not self._sink.ray_records.is_ray_line(text):
            self._sink.take(text)
        return self._original.write(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        self._original.flush()

    def __getattr__(self, name: str) -> Any:  # fileno, isatty, encoding, buffer...: the original's
        return getattr(self._original, name)


class RankOutput:
    """Copies this process's sys.stdout and sys.stderr text into log_path(run_dir, attempt, rank) while started."""

    def __init__(self, run_dir: Path, attempt: Optional[int], rank: int = 0,
                 interval_s: float = FLUSH_INTERVAL_S, max_bytes: int = MAX_COPY_BYTES):
        self.path = log_path(run_dir, attempt, rank)
        self.rank = rank
        self.interval_s = interval_s
        self.max_bytes = max_bytes
        self.written = 0
        self._pending: list[str] = []
        self._lock = threading.Lock()  # the pending text
        self._writing = threading.Lock()  # one write to the file at a time
        self._stopping = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._saved: Optional[tuple[TextIO, TextIO]] = None
        self.failed = False
        self.ray_records = _RayRecords()
        self._filtered: list[logging.Handler] = []
        self._tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)  # the last lines flushed

    def take(self, text: str) -> None:
        if text:  # also once the copy gave up: its last lines still go to a failure record (last_lines)
            with self._lock:
                self._pending.append(text)
                if "\r" in text:  # a progress bar (tqdm) redraws its line: keep what a terminal would show
                    self._pending = [_redrawn("".join(self._pending))]

    def start(self) -> "RankOutput":
        try:  # the cap is per attempt: an earlier worker group of this attempt wrote to the same file
            self.written = storage.size_of(self.path)
        except Exception:  # noqa: BLE001 - the first write says what is wrong with the storage, if anything
            self.written = 0
        self._saved = (sys.stdout, sys.stderr)
        for name in ("", "ray", "ray.train"):  # the loggers Ray gives a console handler (root: print, in Ray Train)
            for handler in logging.getLogger(name).handlers:
                if isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler) \
                        and handler not in self._filtered:
                    handler.addFilter(self.ray_records)
                    self._filtered.append(handler)
        sys.stdout = _Tee(sys.stdout, self, stdout=True)  # type: ignore[assignment]
        sys.stderr = _Tee(sys.stderr, self)  # type: ignore[assignment]
        self._thread = threading.Thread(target=self._run, name="raytrain-rank-output", daemon=True)
        self._thread.start()
        _active.append(self)
        return self

    def _run(self) -> None:
        while not self._stopping.wait(self.interval_s):
            self.flush()

    def flush(self, final: bool = False) -> None:
        """Write the whole lines taken so far (and, when `final`, a last line without its newline)."""
        with self._writing:
            with self._lock:
                text = "".join(self._pending)
                cut = len(text) if final else text.rfind("\n") + 1
                self._pending = [text[cut:]] if text[cut:] else []
            if text[:cut]:
                self._tail.extend(text[:cut].splitlines()[-TAIL_LINES:])
            if not text[:cut] or self.failed:
                return
            data = text[:cut].encode("utf-8", errors="replace")
            if self.written + len(data) > self.max_bytes:  # the last write: a line that says where the rest is
                self.failed = True
                data = (f"raytrain: rank {self.rank}'s output past {self.max_bytes // 2**20} MiB is in Ray's logs "
                        f"on its node only\n").encode()
            try:
                self._append(data)
                self.written += len(data)
            except Exception as err:  # noqa: BLE001 - printing must go on whatever the run's storage does
                self.failed = True
                original = self._saved[1] if self._saved else sys.__stderr__
                if original is not None:
                    original.write(f"raytrain: warning: rank output is no longer copied to {self.path} "
                                   f"({err.__class__.__name__}: {err}); it stays in Ray's logs\n")

    def last_lines(self) -> list[str]:
        """The last lines this process printed (TAIL_LINES at most), the ones not yet written too."""
        with self._lock:
            pending = "".join(self._pending).splitlines()
        return (list(self._tail) + pending)[-TAIL_LINES:]

    def _append(self, data: bytes) -> None:
        if storage.is_remote(self.path):  # no append in an object store: a conditional rewrite
            storage.append_bytes(self.path, data)
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)  # with the first line: no empty directory in a run
        with open(self.path, "ab") as handle:
            handle.write(data)

    def stop(self) -> None:
        """Put the streams back and write what is left."""
        if self in _active:
            _active.remove(self)
        for handler in self._filtered:
            handler.removeFilter(self.ray_records)
        self._filtered = []
        if self._saved is not None:
            if isinstance(sys.stdout, _Tee) and sys.stdout._sink is self:
                sys.stdout = self._saved[0]
            if isinstance(sys.stderr, _Tee) and sys.stderr._sink is self:
                sys.stderr = self._saved[1]
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        self.flush(final=True)


def _redrawn(text: str) -> str:
    """`text` with each line as a terminal leaves it: what a carriage return overwrote is dropped ("\\r\\n" is a
    line end). So a progress bar's redraws cost one line, not one per update."""
    lines = text.split("\n")
    return "\n".join(line.rstrip("\r").rsplit("\r", 1)[-1] if "\r" in line.rstrip("\r") else line
                     for line in lines)


class Follower:
    """The driver's side: the new whole lines of one rank's log since the last call, from where the file ended
    when the follower was made (what an earlier driver of the same attempt printed is not printed again)."""

    def __init__(self, run_dir: Path, attempt: Optional[int], rank: int = 0):
        self.path = log_path(run_dir, attempt, rank)
        self.offset = len(self._read(0))
        self._partial = b""

    def _read(self, offset: int) -> bytes:
        return storage.read_bytes_from(self.path, offset)  # only what is new: a ranged read on an object store

    def new_lines(self, final: bool = False) -> list[str]:
        """The lines written since the last call; `final`: a last line without its newline too."""
        data = self._read(self.offset)
        self.offset += len(data)
        data = self._partial + data
        cut = len(data) if final else data.rfind(b"\n") + 1
        self._partial = data[cut:]
        return data[:cut].decode("utf-8", errors="replace").splitlines()


def _cut(text: str, limit: int, keep_end: bool = False) -> str:
    if len(text) <= limit:
        return text
    return "..." + text[-limit:] if keep_end else text[:limit] + "..."


def type_name(error: BaseException) -> str:
    """An exception's class as a user looks it up: `RuntimeError`, `torch.OutOfMemoryError`."""
    cls = type(error)
    return cls.__qualname__ if cls.__module__ in ("builtins", "__main__") else f"{cls.__module__}.{cls.__qualname__}"


def failure_record(attempt: Optional[int], rank: int, world_size: int, error: BaseException, *,
                   node_ip: Optional[str] = None, last_lines: Iterable[str] = (),
                   died: Optional[dict] = None) -> dict:
    """What record_failure writes (every field bounded). `died`: a rank whose process died or stopped answering,
    recorded by the driver: {"hostname", "pid"} of that process (not this one's), and the record says `died`."""
    try:
        trace = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    except Exception:  # noqa: BLE001 - an exception whose str() itself raises
        trace = f"{type_name(error)} (its traceback could not be formatted)\n"
    try:
        message = str(error)
    except Exception:  # noqa: BLE001
        message = "(its message could not be formatted)"
    who = {"hostname": socket.gethostname(), "pid": os.getpid()} if died is None else \
        {"hostname": died.get("hostname"), "pid": died.get("pid"), "died": True}
    return {"attempt": attempt or 0, "rank": rank, "world_size": world_size, "node_ip": node_ip, **who,
            "time": time.time(), "type": type_name(error),
            "message": _cut(message, MAX_MESSAGE_CHARS), "traceback": _cut(trace, MAX_TRACEBACK_CHARS, keep_end=True),
            "last_lines": [_cut(line, MAX_LINE_CHARS) for line in list(last_lines)[-TAIL_LINES:]]}


def record_failure(run_dir: Path, attempt: Optional[int], rank: int, world_size: int, error: BaseException, *,
                   node_ip: Optional[str] = None, last_lines: Iterable[str] = (),
                   died: Optional[dict] = None) -> Optional[Path]:
    """Record rank `rank`'s failure in attempt `attempt` (failure_path), unless the rank recorded one in this attempt
    already (its first stays). Returns the path written, or None. Never raises: a record that cannot be written is
    one line on this process's stderr, and the failure goes on to Ray Train as it would have."""
    path = failure_path(run_dir, attempt, rank)
    try:
        if storage.size_of(path) > 0:
            return None
        record = failure_record(attempt, rank, world_size, error, node_ip=node_ip, last_lines=last_lines, died=died)
        storage.makedirs(path.parent)
        atomicfile.write_atomic(path, json.dumps(record, indent=1) + "\n")  # ASCII: surrogates escaped
        return path
    except Exception as err:  # noqa: BLE001 - the failure being raised is the one that matters
        stderr = sys.__stderr__
        if stderr is not None:
            stderr.write(f"raytrain: warning: rank {rank}'s failure could not be recorded in {path} "
                         f"({err.__class__.__name__}: {err})\n")
        return None
