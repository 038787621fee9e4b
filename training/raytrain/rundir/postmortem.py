"""Why each attempt of a run ended (`raytrain why RUN_DIR`), from the records the run keeps in its directory or
bucket alone, so that it answers after the pods, the Ray cluster and the driver are gone (a SIGKILL included).

It joins, per attempt (the lease's fencing token, raytrain.rundir.lease):
- its start: the claim .lease/<N>.json (the driver's host, pid and start time);
- its end: its row in results.jsonl (succeeded, failed, stopped, with the error), or none: still running (lease.json
  names it and it renews), released without one, or the driver killed before it could write one; a
  `nothing_to_train` event;
- its worker groups: the `start`, `drain` and `diverged` events of events.jsonl;
- its ranks' failures: worker-logs/attempt-<N>-rank<R>.error.json (raytrain.rundir.workerlogs.record_failure), the
  earliest first (the rank that failed first, its node, exception and traceback), then the ranks that failed after
  it; and the last lines that rank printed (its record's, else the end of worker-logs/attempt-<N>-rank<R>.log). A
  rank whose process died is recorded by the driver when Ray Train's health check finds it (`died`,
  raytrain.driver.workerdeaths): it counts as having failed DEATH_FOUND_WITHIN_S before that, so that the other
  ranks' errors that followed from it (a collective whose peer is gone) come after it.

Damaged records are named and skipped, bytes that are not UTF-8 replaced; nothing read here raises past `why`
but NoRecords, for a path that holds no run.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any, Optional

from raytrain.errors import UsageError
from raytrain.lifecycle.endings import Ending
from raytrain.rundir import atomicfile, layout, runrecords, storage, workerlogs

WORKER_FILE = re.compile(r"^attempt-(\d+)-rank(\d+)(\.log|" + re.escape(workerlogs.FAILURE_SUFFIX) + r")$")
LOG_TAIL_BYTES = 64 * 2**10  # read from the end of a rank's log for its last lines
LOG_LINES = workerlogs.TAIL_LINES
TRACEBACK_LINES = 12
RECORDS = (layout.CLAIMS_DIR, layout.RESULTS_HISTORY_FILE, layout.RESULT_FILE, layout.EVENTS_FILE,
           layout.WORKER_LOGS_DIR)
# A rank whose process died is found by Ray Train's health check (every 2 s by default) and recorded by the driver
# (raytrain.driver.workerdeaths): it died up to this long before its record's time, and the other ranks' errors
# within that window (a collective whose peer is gone) followed from it
DEATH_FOUND_WITHIN_S = 5.0
SIGNALS = {"SIGTERM": "the pod was deleted or preempted, the job stopped, or the process was asked to end",
           "SIGINT": "Ctrl-C"}


class NoRecords(UsageError):
    """The path holds no run; str() names it and the fix."""


def _utc(t: Any) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t)) if _number(t) else "an unknown time"


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _text(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def _read_failure(path: Path, attempt: int, rank: int, damaged: list[str]) -> Optional[dict]:
    """A rank's failure record, its fields checked (the file's name is the authority on attempt and rank)."""
    try:
        record = json.loads(_text(storage.read_bytes(path)))
        if not isinstance(record, dict):
            raise TypeError(f"a JSON {type(record).__name__}, not an object")
    except (OSError, ValueError, TypeError) as err:
        damaged.append(f"{path} is damaged ({str(err).split(':')[0] or err.__class__.__name__}) and is skipped")
        return None
    lines = record.get("last_lines")
    return {"attempt": attempt, "rank": rank,
            "world_size": record["world_size"] if _number(record.get("world_size")) else None,
            "node_ip": str(record["node_ip"]) if record.get("node_ip") else None,
            "hostname": str(record["hostname"]) if record.get("hostname") else None,
            "pid": record["pid"] if _number(record.get("pid")) else None,
            "time": record["time"] if _number(record.get("time")) else None,
            "type": str(record.get("type") or "an unknown exception"), "message": str(record.get("message") or ""),
            "traceback": str(record.get("traceback") or ""),
            "last_lines": [str(line) for line in lines] if isinstance(lines, list) else [],
            "died": record.get("died") is True, "record": str(path)}


def log_tail(path: Path, lines: int = LOG_LINES) -> list[str]:
    """The last `lines` lines of a rank's log ([] when there is none), non-UTF-8 bytes replaced."""
    try:
        size = storage.size_of(path)
        start = max(size - LOG_TAIL_BYTES, 0)
        data = storage.read_bytes_from(path, start)
    except OSError:
        return []
    if start > 0:  # begun mid-line: drop the part
        data = data.split(b"\n", 1)[-1]
    return _text(data).splitlines()[-lines:]


def _claim(run_dir: Path, token: int) -> dict:
    record = atomicfile.read_record(run_dir / layout.CLAIMS_DIR / f"{token}.json") or {}
    return {key: record.get(key) for key in ("host", "pid", "since", "ttl_s")}


def _tokens(names: list[str]) -> list[int]:
    return [int(n[:-5]) for n in names if n.endswith(".json") and n[:-5].isdigit()]


def why(run_dir: Any) -> dict:
    """The post-mortem of a run: {"run", "run_dir", "attempts": [one per attempt, oldest first], "damaged"}."""
    run_dir = storage.as_path(run_dir)
    try:
        names = set(storage.listdir(run_dir))
    except NotADirectoryError:
        raise NoRecords(f"{run_dir} is a file, not a run directory. Fix: give STORAGE/NAME of a run, e.g. "
                        f"runs/linear (or s3://BUCKET/PREFIX/NAME)") from None
    if layout.TUNE_FILE in names and not names & set(RECORDS):
        raise NoRecords(f"{run_dir} is a `raytrain tune` sweep, whose trials are runs of their own beside it. Fix: "
                        f"give one trial's directory, {run_dir}-trial-<trial id>")
    if not names & set(RECORDS):
        what = "does not exist" if not names and not run_dir.exists() else \
            f"holds no raytrain records (none of {', '.join(RECORDS)})"
        raise NoRecords(f"{run_dir} {what}. Fix: give the run directory STORAGE/NAME of a run started with "
                        f"`raytrain run` or `local` (e.g. runs/linear, or s3://BUCKET/PREFIX/NAME): run.storage_path "
                        f"joined with run.name")
    damaged: list[str] = []
    results = runrecords.read_jsonl(run_dir / layout.RESULTS_HISTORY_FILE, warn=damaged.append)
    latest = runrecords.read_result(run_dir)
    if latest is not None and not any(r.get("attempt") == latest.get("attempt") for r in results):
        results.append(latest)  # a run older than results.jsonl
    events = runrecords.read_jsonl(run_dir / layout.EVENTS_FILE, warn=damaged.append)
    claims = {token: _claim(run_dir, token) for token in _tokens(storage.listdir(run_dir / layout.CLAIMS_DIR))}
    worker_files: dict[int, dict[int, dict[str, Path]]] = {}
    logs_dir = run_dir / layout.WORKER_LOGS_DIR
    for name in storage.listdir(logs_dir):
        match = WORKER_FILE.match(name)
        if match:
            kind = "log" if match.group(3) == ".log" else "failure"
            worker_files.setdefault(int(match.group(1)), {}).setdefault(int(match.group(2)), {})[kind] = logs_dir / name

    def attempt_of(row: dict) -> Optional[int]:
        value = row.get("attempt") or 0  # none: a run written without a lease, attempt 0
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    named = [attempt_of(r) for r in results] + [attempt_of(e) for e in events if "attempt" in e]
    numbers = set(claims) | set(worker_files) | {n for n in named if n is not None}
    starts = sorted((c["since"], token) for token, c in claims.items() if _number(c["since"]))

    def by_time(event: dict) -> Optional[int]:
        """An event that names no attempt (a drain) belongs to the attempt that held the run when it was written."""
        held = [token for since, token in starts if _number(event.get("time")) and since <= event["time"]]
        return held[-1] if held else None

    lease = atomicfile.read_record(run_dir / layout.LEASE_FILE) or {}
    attempts = []
    for number in sorted(numbers):
        mine = [e for e in events if (attempt_of(e) if "attempt" in e else by_time(e)) == number]
        rows = [r for r in results if attempt_of(r) == number]
        attempts.append(_attempt(number, claims.get(number, {}), rows[-1] if rows else None, mine,
                                 worker_files.get(number, {}), lease, later=number < max(numbers), damaged=damaged))
    return {"run": run_dir.name, "run_dir": str(run_dir), "attempts": attempts, "damaged": damaged}


def _attempt(number: int, claim: dict, result: Optional[dict], events: list[dict],
             files: dict[int, dict[str, Path]], lease: dict, later: bool, damaged: list[str]) -> dict:
    failures = []
    for rank, kinds in sorted(files.items()):
        if "failure" in kinds:
            found = _read_failure(kinds["failure"], number, rank, damaged)
            if found is not None:
                failures.append(found)
    failures.sort(key=lambda f: (f["time"] is None, (f["time"] or 0.0) - (DEATH_FOUND_WITHIN_S if f["died"] else 0),
                                 f["rank"]))
    ending, explanation = _ending(number, result, events, lease, later)
    first = failures[0] if failures else None
    if first is not None:
        log = files.get(first["rank"], {}).get("log")
        first["log"] = str(log) if log is not None else None
        if first["last_lines"]:
            first["last_lines_from"] = "its failure record (what it printed before it failed)"
        elif log is not None:
            first["last_lines"], first["last_lines_from"] = log_tail(log), str(log)
    return {
        "attempt": number, "ending": ending, "explanation": explanation,
        "started": claim.get("since") if _number(claim.get("since")) else
        min((e["time"] for e in events if _number(e.get("time"))), default=None),
        "driver": {"host": claim.get("host"), "pid": claim.get("pid")} if claim.get("host") else None,
        "duration_s": result.get("duration_s") if result else None,
        "epochs_completed": result.get("epochs_completed") if result else None,
        "worker_group_starts": sum(1 for e in events if e.get("event") == "start"),
        "drains": [str(e.get("message")) for e in events if e.get("event") == "drain"],
        "first_failure": first, "later_failures": failures[1:],
        "logs": {str(rank): str(kinds["log"]) for rank, kinds in sorted(files.items()) if "log" in kinds},
    }


def _ending(number: int, result: Optional[dict], events: list[dict], lease: dict, later: bool) -> tuple[str, str]:
    """(how attempt `number` ended, one line on why)."""
    if result is not None:
        status = str(result.get("status") or "unknown")
        if status == Ending.SUCCEEDED.value:
            done = result.get("epochs_completed")
            return status, result.get("nothing_to_train") or (f"trained to epoch {done}" if done is not None else
                                                               "the loop returned")
        why = str(result.get("error") or "")
        if status == Ending.STOPPED.value and result.get("signal") in SIGNALS:
            why = f"{result['signal']} ({SIGNALS[result['signal']]}): {why}"
        return status, why or "no reason was recorded"
    if any(e.get("event") == "nothing_to_train" for e in events):
        return "nothing to train", next(str(e.get("message")) for e in events if e.get("event") == "nothing_to_train")
    if lease.get("token") == number:
        renewed, ttl = lease.get("renewed"), lease.get("ttl_s")
        if lease.get("released"):
            return "no result", "it released the run without writing a result (a start that handed over to the next)"
        if _number(renewed) and _number(ttl) and time.time() < renewed + ttl:
            return "running", (f"its driver on {lease.get('host')}, pid {lease.get('pid')}, renewed its lease "
                               f"{max(time.time() - renewed, 0):.0f} s ago")
    taken = "a newer attempt took the run over once its lease expired" if later else \
        "its lease has expired: the next start takes the run over at once"
    return "no result", (f"the driver was killed (SIGKILL, its pod or node lost) before it wrote one; {taken}")


# ------------------------------------------------------------------------------------------------ text


def _failure_line(failure: dict) -> str:
    where = ", ".join(part for part in (
        f"node {failure['node_ip']}" if failure.get("node_ip") else None,
        f"host {failure['hostname']}" if failure.get("hostname") else None,
        f"pid {failure['pid']}" if failure.get("pid") is not None else None) if part)
    of = f" of {failure['world_size']}" if failure.get("world_size") else ""
    return f"rank {failure['rank']}{of}" + (f" ({where})" if where else "")


def _death_cause(message: str) -> Optional[str]:
    """The line of Ray's ActorDiedError that says why the process is gone (its exit type and detail: the OOM
    killer, a signal, the node's loss), under its generic first line."""
    lines = [line.strip() for line in message.splitlines()[1:]]
    return next((_first_line(line, 500) for line in lines if "dead because" in line or "exit detail" in line), None)


def _first_line(text: str, limit: int = 300) -> str:
    line = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return line if len(line) <= limit else line[:limit] + "..."


def render(report: dict) -> str:
    """The post-mortem as plain text, one block per attempt."""
    attempts = report["attempts"]
    out = [f"run {report['run']} ({report['run_dir']}): {len(attempts)} attempt(s)" +
           (f"; the last: {attempts[-1]['ending']}" if attempts else "")]
    for attempt in attempts:
        head = f"attempt {attempt['attempt']}: {attempt['ending']}"
        if attempt["started"] is not None:
            head += f", started {_utc(attempt['started'])}"
        if attempt["driver"]:
            head += f" (driver on {attempt['driver']['host']}, pid {attempt['driver']['pid']})"
        if _number(attempt["duration_s"]):
            head += f", {attempt['duration_s']:.1f} s"
        out += ["", head, f"  {attempt['explanation']}"]
        if attempt["worker_group_starts"] > 1:
            out.append(f"  {attempt['worker_group_starts']} worker groups started: Ray Train started a new one "
                       f"{attempt['worker_group_starts'] - 1} time(s) (after a failure, a drain or a resize)")
        for message in attempt["drains"]:
            out.append(f"  drained: {message}")
        first = attempt["first_failure"]
        if first is not None:
            if first["died"]:
                out.append(f"  first failure: {_failure_line(first)}: its process died or stopped answering (found "
                           f"by Ray Train's health check at {_utc(first['time'])})")
            else:
                out.append(f"  first failure: {_failure_line(first)} at {_utc(first['time'])}")
            out.append(f"    {first['type']}: {_first_line(first['message'])}")
            cause = _death_cause(first["message"]) if first["died"] else None
            if cause:
                out.append(f"    {cause}")
            trace = [] if first["died"] else [  # a died rank's record is the driver's: no traceback of its own
                line for line in first["traceback"].splitlines()
                if line.strip(" ^~")][-TRACEBACK_LINES:]  # no blank lines, no carets under the code
            if trace:
                out.append("    traceback (its end):")
                out += [f"      {line}" for line in trace]
            if first.get("last_lines"):
                out.append(f"    its last {len(first['last_lines'])} line(s) of output, from "
                           f"{first['last_lines_from']}:")
                out += [f"      | {line}" for line in first["last_lines"]]
            if first.get("log"):
                out.append(f"    its whole log: {first['log']}")
            for later in attempt["later_failures"]:
                after = f"+{later['time'] - first['time']:.1f} s" if _number(later["time"]) and \
                    _number(first["time"]) and later["time"] >= first["time"] else \
                    "as it died" if first["died"] else "later"
                out.append(f"  then {_failure_line(later)} {after}: {later['type']}: "
                           f"{_first_line(later['message'], 160)}")
        elif attempt["ending"] in (Ending.FAILED.value, "no result") and attempt["logs"]:
            out.append("  no rank recorded a failure (a worker killed by a signal or the OOM killer records none); "
                       "its ranks' logs:")
            out += [f"    rank {rank}: {path}" for rank, path in attempt["logs"].items()]
    for message in report["damaged"]:
        out.append(f"warning: {message}")
    # A record's text may hold lone surrogates (a message of bytes that were not UTF-8): printable, replaced
    return "\n".join(out).encode("utf-8", errors="replace").decode("utf-8")
