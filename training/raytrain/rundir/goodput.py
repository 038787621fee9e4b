"""Goodput: where a run's wall time went, from its records alone (no Ray, no torch): productive training, and the
rest ("badput") by cause, per attempt and for the whole run, after Google's ml-goodput-measurement. The parts add
up to the wall time: what no record explains is `other`, never a silent gap.

The wall time runs from the first attempt's start (its lease claim, .lease/<N>.json) to the newest one's end (its
row in results.jsonl; for one still running, now; for one killed without a result, its last record or lease
renewal). Each attempt is walked along its marks, oldest first:
- start-up: the attempt's start to its first worker group's restore, in phases (STARTUP_PHASES): `launch`, to the
  driver's `launch` event just before it hands the group to Ray Train (Ray started or joined, the cluster sized,
  an autoscaler's nodes waited for); `workers`, to rank 0's session (`began` in the group's `start` event: Ray
  Train's worker processes and their process group); `setup`, to the restore (the loop's data and model). A phase
  whose mark is missing (a run written before these marks; a local run, which has no Ray to launch) counts in the
  next one. restore: the `restored` event's `restore_s`, just before the group's `start` event. A Ray Train
  function's group start is written at its first report: its start-up ends at its first batch instead (the start
  event's `first_batch`, raytrain.worker.loadertiming);
- each metrics row's segment (since the row before, or the group's start) split by the row's `timing`, which the
  session measures on rank 0 (raytrain.worker.session; a Ray Train function's loaders: raytrain.worker.loadertiming):
  checkpoint blocking (`checkpoint_s`: the saves the loop waited for since the last row, the previous epoch's
  included), data wait (`data_s`: the training loader's next()), evaluation (`val_s`: the validation batches'
  iteration, the forward passes included), and training, the rest;
- a `progress_saved` event (a stop, a drain or a resize that ended a group at a step, after its checkpoint): the time
  since the last row was trained and is kept, split by its `timing` as a row's;
- the `trained` event: the last checkpoint after the last row (its `checkpoint_s`, just before the event);
- recovery: a later worker group's gap, from the last record of the one before to its restore (a lost worker:
  Ray Train restarts the group); resize instead when a `resize` event marks that start (an elastic run);
- progress lost: rows dropped to be trained again (the `rows_dropped` event's `until`, from the newest record
  kept), and the end of an attempt killed without a result (its last record to its lease's last renewal). What
  a group trained after its last record before it failed is not recorded anywhere: it counts as recovery, so
  progress lost is precise to a metrics row (an epoch, or a Ray Train function's report);
- stopping: the last mark to the attempt's result (the shutdown of Ray, a stop's checkpoint, a failure's end);
- between attempts: waiting to start after an attempt that wrote its result (a rerun, a queue, a suspension),
  recovery after one killed without a result (a RayJob's retry).
A run whose rows have no `timing` (written before raytrain kept it) leaves the time after a group's start
unattributed (other).

Damaged lines are skipped and named (`notes`); a field of the wrong type is ignored as if absent.
"""

from __future__ import annotations

import bisect
import math
import time
from dataclasses import dataclass, field
from typing import Any, Optional

from raytrain.rundir import atomicfile, layout, runrecords, storage

# The causes in the order a table shows them; `training` is the goodput.
CAUSES = ("training", "waiting", "startup", "restore", "data", "evaluation", "checkpoint", "lost", "recovery",
          "resize", "stopping", "other")
LABELS = {
    "training": "productive training",
    "waiting": "waiting to start",
    "startup": "start-up (Ray, workers, data)",
    "restore": "checkpoint restore",
    "data": "data wait",
    "evaluation": "evaluation",
    "checkpoint": "checkpoint blocking",
    "lost": "progress lost (trained again)",
    "recovery": "recovery (failure to restart)",
    "resize": "resizes",
    "stopping": "stopping",
    "other": "other (unattributed)",
}
# An attempt's start-up, in order (what each phase ends at: see the module's doc)
STARTUP_PHASES = ("launch", "workers", "setup")
PHASE_LABELS = {"launch": "launch (Ray, sizing)", "workers": "worker group", "setup": "data and model"}
# Where intervals overlap, the higher wins: a row's own split, then progress lost, then the gaps; other is none.
_PRIORITY = {"training": 3, "data": 3, "evaluation": 3, "checkpoint": 3, "lost": 2}


def _number(value: Any) -> bool:
    """A finite number (JSON's Infinity and NaN, and booleans, are damage)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _seconds(value: Any) -> float:
    return max(float(value), 0.0) if _number(value) else 0.0


@dataclass
class Attempt:
    attempt: int
    start: float
    end: float
    status: str  # succeeded, failed, stopped; running; nothing to train; no result (killed, or released)
    seconds: dict[str, float] = field(default_factory=dict)
    startup: dict[str, float] = field(default_factory=dict)  # seconds["startup"] by STARTUP_PHASES

    @property
    def wall_s(self) -> float:
        return self.end - self.start

    def to_dict(self) -> dict:
        return {"attempt": self.attempt, "status": self.status, "start": self.start, "end": self.end,
                "wall_s": round(self.wall_s, 3), "seconds": _rounded(self.seconds),
                "startup": {phase: round(self.startup.get(phase, 0.0), 3) for phase in STARTUP_PHASES}}


@dataclass
class Goodput:
    wall_s: float
    seconds: dict[str, float]  # every cause, summing to wall_s
    attempts: list[Attempt]
    progress: dict  # epochs_done, epochs, percent, time_left_s (None where unknown)
    notes: list[str] = field(default_factory=list)  # damaged records, skipped

    @property
    def startup(self) -> dict[str, float]:
        """The run's start-up seconds by phase (its attempts' together)."""
        return {phase: sum(a.startup.get(phase, 0.0) for a in self.attempts) for phase in STARTUP_PHASES}

    @property
    def goodput(self) -> Optional[float]:
        """Productive training over the wall time; None for a run with no time yet."""
        return self.seconds["training"] / self.wall_s if self.wall_s > 0 else None

    def to_dict(self) -> dict:
        fraction = self.goodput
        return {"wall_s": round(self.wall_s, 3), "goodput": None if fraction is None else round(fraction, 4),
                "seconds": _rounded(self.seconds),
                "startup": {phase: round(seconds, 3) for phase, seconds in self.startup.items()},
                "attempts": [a.to_dict() for a in self.attempts],
                "progress": self.progress, "notes": self.notes}


def _rounded(seconds: dict[str, float]) -> dict[str, float]:
    return {cause: round(seconds.get(cause, 0.0), 3) for cause in CAUSES}


# ----------------------------------------------------------------------------------------------------------
# reading


def read(run_dir: Any, epochs: Optional[int] = None, now: Optional[float] = None) -> Goodput:
    """The goodput of the run at `run_dir` (a directory or an object store prefix); `epochs`: train.epochs, for the
    progress. Never raises for what the records hold: damaged lines are named in `notes`."""
    run_dir = storage.as_path(run_dir)
    notes: list[str] = []
    results = runrecords.read_jsonl(run_dir / layout.RESULTS_HISTORY_FILE, warn=notes.append)
    latest = atomicfile.read_record(run_dir / layout.RESULT_FILE)
    if latest is not None and not any(r.get("attempt") == latest.get("attempt") for r in results):
        results.append(latest)  # a run older than results.jsonl
    claims: dict[int, float] = {}
    try:
        names = storage.listdir(run_dir / layout.CLAIMS_DIR)
    except (OSError, NotADirectoryError):
        names = []
    for name in names:
        if name.endswith(".json") and name[:-5].isdigit():
            since = (atomicfile.read_record(run_dir / layout.CLAIMS_DIR / name) or {}).get("since")
            if _number(since):
                claims[int(name[:-5])] = float(since)
    return compute(claims=claims, results=results,
                   events=runrecords.read_jsonl(run_dir / layout.EVENTS_FILE, warn=notes.append),
                   rows=runrecords.read_jsonl(run_dir / layout.METRICS_FILE, warn=notes.append),
                   lease=atomicfile.read_record(run_dir / layout.LEASE_FILE) or {}, epochs=epochs, now=now,
                   notes=notes)


# ----------------------------------------------------------------------------------------------------------
# computing


def _attempt_of(record: dict) -> Optional[int]:
    value = record.get("attempt")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _row_time(row: dict) -> Optional[float]:
    timing = row.get("timing")
    return float(timing["time"]) if isinstance(timing, dict) and _number(timing.get("time")) else None


def _started_at(start: dict) -> float:
    """Where a worker group's start-up ended: its start event, or the first batch a Ray Train function asked for
    before its first report recorded the start (`first_batch`)."""
    first = start.get("first_batch")
    return min(float(first), start["time"]) if _number(first) else start["time"]


def compute(*, claims: dict[int, float], results: list[dict], events: list[dict], rows: list[dict],
            lease: dict, epochs: Optional[int] = None, now: Optional[float] = None,
            notes: Optional[list[str]] = None) -> Goodput:
    """The goodput of the records given (what `read` found in a run directory): claims {attempt: its start},
    results.jsonl's rows, events.jsonl's, metrics.jsonl's, lease.json's record."""
    now = time.time() if now is None else now
    events = [e for e in events if _number(e.get("time"))]
    timed_rows = sorted(((t, r) for r in rows if (t := _row_time(r)) is not None and isinstance(r.get("epoch"), int)),
                        key=lambda pair: pair[0])
    results = [r for r in results if _number(r.get("time"))]
    attempts = _attempts(claims, results, events, timed_rows, lease, now)
    if not attempts:
        return Goodput(0.0, {c: 0.0 for c in CAUSES}, [], _progress(rows, [], None, epochs), notes or [])
    starts = [a.start for a in attempts]

    def owner(record: dict, at: float) -> int:
        """The attempt a record belongs to: the one it names, else the one that held the run when it was written."""
        named = _attempt_of(record)
        if named is not None and any(a.attempt == named for a in attempts):
            return named
        return attempts[max(bisect.bisect_right(starts, at) - 1, 0)].attempt

    intervals: list[tuple[float, float, str]] = []
    marks: list[float] = []  # the records a dropped row's lost progress starts from
    segments: list[float] = []  # each row's segment length, for the time left
    phases: dict[int, dict[str, float]] = {}  # each attempt's start-up by phase (of its interval, before painting)
    for index, attempt in enumerate(attempts):
        mine = [e for e in events if owner(e, e["time"]) == attempt.attempt]
        # At one instant a group's start comes first and its `trained` last (the order they are written in).
        # Each mark's kind is its source's: a row may hold a metric named `event`.
        walk = sorted([(_started_at(e), 0, "start", e) for e in mine if e.get("event") == "start"] +
                      [(e["time"], 1, "saved", e) for e in mine if e.get("event") == "progress_saved"] +
                      [(e["time"], 2, "trained", e) for e in mine if e.get("event") == "trained"] +
                      [(t, 1, "row", r) for t, r in timed_rows if owner(r, t) == attempt.attempt], key=lambda m: m[:2])
        cursor, groups = attempt.start, 0
        launched = next((e["time"] for e in mine if e.get("event") == "launch"), None)
        for at, _, kind, record in walk:
            at = min(max(at, cursor), attempt.end)
            if kind == "start":
                # The group's restore and resize are recorded just before its start (raytrain.worker.session).
                written = max(record["time"], at)
                restored = [e for e in mine if e.get("event") == "restored" and cursor <= e["time"] <= written]
                restore = min(_seconds(restored[-1].get("restore_s")) if restored else 0.0, at - cursor)
                resized = any(e.get("event") == "resize" and cursor <= e["time"] <= written for e in mine)
                gap = "startup" if groups == 0 else "resize" if resized else "recovery"
                intervals += [(cursor, at - restore, gap), (at - restore, at, "restore")]
                if groups == 0:
                    phases[attempt.attempt] = _phases(cursor, at - restore, [
                        launched, float(record["began"]) if _number(record.get("began")) else None])
                groups += 1
            elif kind == "trained":
                # The last checkpoint ends just before `trained`: at the tail, so that when a rerun dropped the rows
                # before it (progress lost) the checkpoint still sits where it ran, after them
                intervals += _split(cursor, at, [], "stopping", tail=("checkpoint", _seconds(record.get("checkpoint_s"))))
            else:  # a row, or a group's end at a step whose checkpoint the next one resumes from
                timing = record.get("timing") if isinstance(record.get("timing"), dict) else {}
                intervals += _split(cursor, at, [("checkpoint", _seconds(timing.get("checkpoint_s"))),
                                                 ("data", _seconds(timing.get("data_s")))], "training",
                                    tail=("evaluation", _seconds(timing.get("val_s"))))
                if kind == "row":  # a whole epoch's (a part of one would skew the pace)
                    segments.append(at - cursor)
            marks.append(at)
            cursor = at
        if rows and not timed_rows:
            tail = "other"  # rows without timing: what they held is not known
        elif not groups:
            tail = "startup"  # no worker group started (yet): a start that failed, or found nothing to train
            # launched: the worker group never came (no resources, a failed worker); else Ray or the launch did not
            phases[attempt.attempt] = _phases(cursor, attempt.end, [launched or attempt.end, attempt.end])
        elif attempt.status == "running":
            tail = "training"  # the epoch in progress, split when its row is written
        elif attempt.status == "no result":
            tail = "lost"  # trained after its last record, up to its lease's last renewal: trained again
        else:
            tail = "stopping"
        intervals.append((cursor, attempt.end, tail))
        if index + 1 < len(attempts):
            gap = "recovery" if attempt.status == "no result" else "waiting"
            intervals.append((attempt.end, attempts[index + 1].start, gap))
    marks += [a.start for a in attempts]
    marks.sort()
    for event in events:
        until = event.get("until")
        if event.get("event") == "rows_dropped" and _number(until):
            kept = marks[bisect.bisect_left(marks, until) - 1] if bisect.bisect_left(marks, until) else attempts[0].start
            intervals.append((kept, min(float(until), event["time"]), "lost"))
    first, last = attempts[0].start, attempts[-1].end
    total, per = _paint(intervals, first, last, starts, attempts)
    for attempt in attempts:
        attempt.seconds = per.get(attempt.attempt, {c: 0.0 for c in CAUSES})
        # The phases split the start-up interval; painted, another cause may have taken part of it (a dropped
        # row's lost progress): in proportion, so that the phases always sum to the attempt's start-up.
        split = phases.get(attempt.attempt, {})
        spent = sum(split.values())
        painted = attempt.seconds["startup"]
        attempt.startup = {phase: split.get(phase, 0.0) * painted / spent if spent > 0 else 0.0
                           for phase in STARTUP_PHASES}
    return Goodput(last - first, total, attempts, _progress(rows, segments, attempts[-1], epochs), notes or [])


def _phases(start: float, end: float, marks: list[Optional[float]]) -> dict[str, float]:
    """[start, end] cut at the marks (one per phase but the last, None where missing: that phase counts in the
    next), each clamped into order."""
    out, cursor = {}, start
    for phase, mark in zip(STARTUP_PHASES, marks + [end]):
        until = cursor if mark is None else min(max(float(mark), cursor), end)
        out[phase] = until - cursor
        cursor = until
    return out


def _split(start: float, end: float, heads: list[tuple[str, float]], rest: str,
           tail: Optional[tuple[str, float]] = None) -> list[tuple[float, float, str]]:
    """[start, end] cut into the `heads` in order, then `rest`, then `tail` at the end, each clamped to what is
    left (a row's timing that exceeds its segment, from a clock step, never makes time)."""
    out, cursor = [], start
    for cause, seconds in heads:
        took = min(seconds, end - cursor)
        out.append((cursor, cursor + took, cause))
        cursor += took
    tail_start = end - min(tail[1], end - cursor) if tail else end
    out.append((cursor, tail_start, rest))
    if tail:
        out.append((tail_start, end, tail[0]))
    return out


def _attempts(claims: dict[int, float], results: list[dict], events: list[dict],
              timed_rows: list[tuple[float, dict]], lease: dict, now: float) -> list[Attempt]:
    """Each attempt's window and how it ended, oldest first; a window ends no later than the next one starts."""
    numbers = set(claims) | {n for r in results if (n := _attempt_of(r)) is not None}
    numbers |= {n for e in events if e.get("event") == "start" and (n := _attempt_of(e)) is not None}
    numbers |= {n for _, r in timed_rows if (n := _attempt_of(r)) is not None}
    # A dropped row's time counts too: the attempt that wrote it was alive then (its end, if it left no result).
    record_times = [e["time"] for e in events] + [t for t, _ in timed_rows] + \
        [float(e["until"]) for e in events if e.get("event") == "rows_dropped" and _number(e.get("until"))]
    if not numbers and (record_times or results):
        numbers = {0}  # written without a lease: one attempt
    found = []
    for number in sorted(numbers):
        result = next((r for r in reversed(results) if (_attempt_of(r) or 0) == number), None)
        mine = [e["time"] for e in events if _attempt_of(e) == number] + \
               [t for t, r in timed_rows if _attempt_of(r) == number]
        start = claims.get(number)
        if start is None and result is not None and _number(result.get("duration_s")):
            start = float(result["time"]) - _seconds(result["duration_s"])
        if start is None:
            start = min(mine, default=None)
        if start is None and number == 0:
            start = min(record_times, default=None)
        if start is None:
            continue
        found.append([number, float(start), result, mine])
    found.sort(key=lambda f: f[1])
    attempts = []
    for index, (number, start, result, mine) in enumerate(found):
        later = found[index + 1][1] if index + 1 < len(found) else None
        if result is not None:
            end, status = float(result["time"]), str(result.get("status") or "unknown")
        else:
            window = [t for t in record_times if t >= start and (later is None or t < later)]
            end = max(mine + window, default=start)
            renewed = lease.get("renewed")
            if lease.get("token") == number and _number(renewed):
                end = max(end, float(renewed))
                live = not lease.get("released") and _number(lease.get("ttl_s")) and now < renewed + lease["ttl_s"]
                if live and later is None:
                    end = max(end, now)
            status = "running" if later is None and end >= now else "no result"
            if any(e.get("event") == "nothing_to_train" and _attempt_of(e) == number for e in events):
                status = "nothing to train"  # a finished run started again: it keeps the result that trained it
        if later is not None:
            end = min(end, later)
        attempts.append(Attempt(number, start, max(end, start), status))
    return attempts


def _paint(intervals: list[tuple[float, float, str]], first: float, last: float, starts: list[float],
           attempts: list[Attempt]) -> tuple[dict[str, float], dict[int, dict[str, float]]]:
    """Every instant of [first, last] given the highest-priority cause covering it (other where none does): the
    seconds per cause for the run and per attempt (time between attempts is the run's only)."""
    edges: list[tuple[float, int, str]] = []
    for start, end, cause in intervals:
        start, end = max(start, first), min(end, last)
        if end > start:
            edges += [(start, 1, cause), (end, -1, cause)]
    edges.sort(key=lambda e: e[0])
    total = {c: 0.0 for c in CAUSES}
    per: dict[int, dict[str, float]] = {a.attempt: {c: 0.0 for c in CAUSES} for a in attempts}
    active = {c: 0 for c in CAUSES}
    cursor, i = first, 0
    points = sorted({first, last, *(e[0] for e in edges), *(a.end for a in attempts)})
    for point in points:
        if point > cursor:
            live = [c for c in CAUSES if active[c] > 0]
            cause = max(live, key=lambda c: (_PRIORITY.get(c, 1), -CAUSES.index(c))) if live else "other"
            total[cause] += point - cursor
            owner = attempts[max(bisect.bisect_right(starts, cursor) - 1, 0)]
            if cursor < owner.end:  # else between attempts
                per[owner.attempt][cause] += point - cursor
            cursor = point
        while i < len(edges) and edges[i][0] <= point:
            active[edges[i][2]] += edges[i][1]
            i += 1
    return total, per


def _progress(rows: list[dict], segments: list[float], newest: Optional[Attempt], epochs: Optional[int]) -> dict:
    """Epochs done (the newest row's), of train.epochs; the time left at the mean row segment's pace."""
    done = max((r["epoch"] for r in rows if isinstance(r.get("epoch"), int) and not isinstance(r["epoch"], bool)),
               default=0)
    total = epochs if isinstance(epochs, int) and not isinstance(epochs, bool) and epochs > 0 else None
    finished = newest is not None and newest.status == "succeeded"
    percent = 100.0 if finished else (round(min(done / total, 1.0) * 100, 1) if total else None)
    if finished or (total and done >= total):
        left: Optional[float] = 0.0
    elif total and segments:
        left = round((total - done) * sum(segments) / len(segments), 1)
    else:
        left = None
    return {"epochs_done": done, "epochs": total, "percent": percent, "time_left_s": left}


# ----------------------------------------------------------------------------------------------------------
# showing


def duration_text(seconds: float) -> str:
    """12.3s, 4m05s, 1h02m03s: how the report and its goodput table write a duration."""
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s" if minutes else f"{seconds:.1f}s"


MAX_ATTEMPT_COLUMNS = 6  # more attempts: the newest ones, the run's column still sums them all


def table(result: Goodput) -> list[str]:
    """The goodput table's lines: each cause that took time (training always), its seconds and share of the run,
    and each attempt's seconds; then the progress."""
    if not result.attempts:
        return ["goodput: no records with times yet (the run has not started an attempt)"]
    fraction = result.goodput
    shown = result.attempts[-MAX_ATTEMPT_COLUMNS:]
    lines = [f"goodput {fraction * 100:.1f}% of {duration_text(result.wall_s)}" if fraction is not None else
             "goodput: no time yet",
             f"  {'':32}{'run':>10}{'share':>8}" + "".join(f"{f'attempt {a.attempt}':>12}" for a in shown)]
    for cause in CAUSES:
        seconds = result.seconds.get(cause, 0.0)
        if cause != "training" and seconds < 0.05 and not any(a.seconds.get(cause, 0.0) >= 0.05 for a in shown):
            continue
        lines.append(_table_line(LABELS[cause], seconds, result.wall_s, [a.seconds.get(cause, 0.0) for a in shown]))
        if cause == "startup":  # its phases, indented
            lines += [_table_line(f"  {PHASE_LABELS[phase]}", result.startup[phase], result.wall_s,
                                  [a.startup.get(phase, 0.0) for a in shown]) for phase in STARTUP_PHASES]
    lines.append(f"  {'wall time':32}{duration_text(result.wall_s):>10}{'100%':>8}" +
                 "".join(f"{duration_text(a.wall_s):>12}" for a in shown))
    lines.append("  " + "  ".join(f"attempt {a.attempt}: {a.status}" for a in shown))
    if result.progress["epochs"]:
        lines.append(f"  progress: epoch {result.progress['epochs_done']}/{result.progress['epochs']} "
                     f"{progress_text(result.progress)}")
    return lines


def _table_line(label: str, seconds: float, wall_s: float, per_attempt: list[float]) -> str:
    share = f"{seconds / wall_s * 100:.1f}%" if wall_s > 0 else "-"
    return f"  {label:32}{duration_text(seconds):>10}{share:>8}" + "".join(f"{duration_text(s):>12}" for s in per_attempt)


def progress_text(progress: dict) -> str:
    """'(40%), about 1m05s left', '(100%), done' or '(40%)' (no pace yet); '' without train.epochs: how the report
    and the console's epoch lines write a run's progress."""
    if not progress.get("epochs") or progress.get("percent") is None:
        return ""
    left = progress.get("time_left_s")
    return f"({progress['percent']:.0f}%)" + ("" if left is None else ", done" if left == 0 else
                                              f", about {duration_text(left)} left")
