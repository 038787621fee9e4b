"""ckptread: the bytes read from a checkpoint's state.pt between its write and the next start's first optimizer
step, measured with strace, against the checkpoint's size (target: at most 2x, the driver's resume check and the
one load by rank 0).

Per side (`raytrain run` with 2 workers on an embedded Ray, so that the hand-over to the second worker is part of
it, and `raytrain local`), each run under `strace -f` (every process it starts: Ray's daemons and workers too):
  (a) a run that trains 2 epochs and checkpoints at the end: reads of the committed checkpoint's state.pt from its
      commit on (the path exists only after the commit's rename), and reads of its staging copy before it;
  (b) the same run started again with one more epoch (train.max_steps_per_epoch=2): reads of that state.pt up to
      rank 0's first optimizer step (bench.probes.FirstStepProbe's line; strace's timestamps are the same clock),
      and over the whole run, which can only add to it.
The workload is the linear preset with a wider model (model.hidden=512, model.layers=2: a checkpoint of a few MB).
Reads are read/pread64/readv/preadv/preadv2 returning bytes on a descriptor whose path (strace -y) is that
state.pt; a memory mapping of it would hide its reads from strace, so mmaps of it are counted and reported.
Bytes are counted, not timed: one run per side, whatever --rounds says.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Optional

from bench.cluster import first_step_time, job_dir, probe_file, probed_config, resolved_preset
from bench.harness import TARGETS, BenchSettings, figure, skipped
from bench.workload import own_ray_env
from raytrain.rundir import layout

READ_CALLS = ("read", "pread64", "readv", "preadv", "preadv2")
SPAWN_CALLS = ("clone", "clone3", "fork", "vfork")
# execve and the spawning calls name the process behind each thread id (strace -f shows thread ids).
TRACED = ",".join((*READ_CALLS, "mmap", "execve", *SPAWN_CALLS))
SIDES = {"run": "raytrain run, 2 workers (embedded Ray)", "local": "raytrain local (one process)"}
MODEL = {"hidden": 512, "layers": 2}

# strace -f -ttt -y output: "PID SECONDS.MICROS rest"; rest is "call(args) = ret", "call(args <unfinished ...>" or
# "<... call resumed>args) = ret" (another process's line came in between).
_LINE = re.compile(r"^(?P<pid>\d+)\s+(?P<time>\d+\.\d+)\s+(?P<rest>.*)$")
_CALL = re.compile(r"^(?P<call>\w+)\(")
_RESUMED = re.compile(r"^<\.\.\. (?P<call>\w+) resumed>")
_FIRST_FD = re.compile(r"^\w+\(\d+<(?P<path>[^>]*)>")
_ANY_FD = re.compile(r"\b\d+<(?P<path>[^>]*)>")
# Anchored at the line's end, so that bytes shown inside a data string never pass for the result.
_RESULT = re.compile(r"\)\s+=\s+(?P<ret>-?\d+|0x[0-9a-f]+)(?:\s+[A-Z][A-Z0-9_]*(?:\s+\([^()]*\))?)?$")
_ARGV = re.compile(r'^execve\("[^"]*", \[(?P<argv>.*?)\]')


@dataclass(frozen=True)
class Access:
    pid: int
    time: float  # when the call returned (epoch seconds)
    call: str
    path: str
    bytes: int  # returned by a read; 0 for an mmap


@dataclass
class Processes:
    """Who is behind a thread id: its process (thread group leader) and that process's command (its execve's argv as
    strace shows it, or that of the process it was forked from)."""

    commands: dict[int, str] = field(default_factory=dict)  # pid -> argv of its execve
    leader: dict[int, int] = field(default_factory=dict)  # thread id -> its process's pid
    forked_from: dict[int, int] = field(default_factory=dict)  # pid -> parent's pid (no execve of its own yet)

    def process_of(self, tid: int) -> int:
        return self.leader.get(tid, tid)

    def command_of(self, pid: int) -> str:
        seen = set()
        while pid not in self.commands and pid in self.forked_from and pid not in seen:
            seen.add(pid)
            pid = self.forked_from[pid]
        return self.commands.get(pid, "(no execve traced)")


def parse_strace(lines: Iterable[str]) -> tuple[list[Access], Processes]:
    """The reads (that returned bytes) and mmaps on descriptors with a path, and the processes behind the thread ids
    (execve, clone) from `strace -f -ttt -y` lines."""
    accesses: list[Access] = []
    procs = Processes()
    pending: dict[int, tuple[str, str]] = {}  # pid -> (call, its start as shown) of an unfinished call
    for line in lines:
        m = _LINE.match(line.rstrip("\n"))
        if m is None:
            continue
        pid, at, rest = int(m["pid"]), float(m["time"]), m["rest"]
        resumed = _RESUMED.match(rest)
        if resumed is not None:
            call, start = pending.pop(pid, (resumed["call"], ""))
            text = start + rest[resumed.end():]
        else:
            call_match = _CALL.match(rest)
            if call_match is None:
                continue
            call, text = call_match["call"], rest
            if rest.endswith("<unfinished ...>"):
                pending[pid] = (call, rest[: -len("<unfinished ...>")].rstrip())
                continue
        result = _RESULT.search(text)
        if result is None:
            continue  # "= ?": the process ended inside the call
        if call == "execve":
            argv = _ARGV.match(text)
            if argv is not None and result["ret"] == "0":
                procs.commands[pid] = argv["argv"]
            continue
        if call in SPAWN_CALLS:
            if result["ret"].isdigit():
                if "CLONE_THREAD" in text:
                    procs.leader[int(result["ret"])] = procs.process_of(pid)
                else:
                    procs.forked_from[int(result["ret"])] = procs.process_of(pid)
            continue
        fd = (_FIRST_FD if call in READ_CALLS else _ANY_FD).search(text)
        if fd is None:
            continue
        path = fd["path"].removesuffix(" (deleted)")
        if call in READ_CALLS and not result["ret"].startswith("-") and int(result["ret"]) > 0:
            accesses.append(Access(pid, at, call, path, int(result["ret"])))
        elif call == "mmap" and result["ret"].startswith("0x"):
            accesses.append(Access(pid, at, call, path, 0))
    return accesses, procs


def tally(accesses: Iterable[Access], path: Path | str, procs: Optional[Processes] = None,
          before: Optional[float] = None) -> dict:
    """Bytes read from `path` (and reads, mmaps), in all and by process (its threads together), optionally only
    calls that returned before `before` (epoch seconds)."""
    path = str(path)
    total = reads = mmaps = 0
    by_pid: dict[int, int] = defaultdict(int)
    for a in accesses:
        if a.path != path or (before is not None and a.time >= before):
            continue
        if a.call == "mmap":
            mmaps += 1
            continue
        total += a.bytes
        reads += 1
        by_pid[procs.process_of(a.pid) if procs else a.pid] += a.bytes
    procs = procs or Processes()
    return {"bytes": total, "reads": reads, "mmaps": mmaps,
            "by_process": [{"pid": pid, "bytes": n, "command": procs.command_of(pid)[:160]}
                           for pid, n in sorted(by_pid.items())]}


def ckptread_figures(side: str, measured: dict) -> list[dict]:
    """A side's figures from its measurement: the checkpoint's size, the bytes read between its write and the
    next start's first step, and their ratio (judged against the target)."""
    size = measured["state_bytes"]
    read = measured["after_commit"]["bytes"] + measured["resume_to_first_step"]["bytes"]
    ratio = read / size if size else None
    target = TARGETS["ckptread_ratio"]
    common = {"side": SIDES[side], "checkpoint": measured["checkpoint"],
              "after_commit": measured["after_commit"], "staging_before_commit": measured["staging_before_commit"],
              "resume_to_first_step": measured["resume_to_first_step"],
              "resume_whole_run": measured["resume_whole_run"], "workload": measured["workload"]}
    mapped = measured["after_commit"]["mmaps"] + measured["resume_whole_run"]["mmaps"]
    if mapped:
        common["warning"] = f"state.pt was memory-mapped {mapped} time(s): reads through a mapping are not counted"
    return [figure(f"ckptread_{side}_state_bytes", "bytes", [float(size)], side=SIDES[side]),
            figure(f"ckptread_{side}_bytes_read", "bytes", [float(read)], **common),
            figure(f"ckptread_{side}_ratio", "x", [ratio], target=f"<= {target}",
                   met=ratio is not None and ratio <= target, side=SIDES[side])]


# ----------------------------------------------------------------------------------------------------------
# the runs


def checkpoint_config(probe_path: str, epochs: int = 2) -> dict:
    """The linear preset with a wider model, 2 workers, one checkpoint at the end of `epochs`; its model wrapped in
    the first-step probe (the same config both times: the model section may not change on a resume)."""
    config = resolved_preset("linear")
    config["model"] = {**config["model"], **MODEL}
    config["scaling"] = {**config["scaling"], "num_workers": 2}
    config["train"] = {**config["train"], "epochs": epochs}
    config["run"] = {**config["run"], "checkpoint_every": epochs}
    return probed_config(config, probe_path)


def traced(command: list[str], cwd: Path, trace: Path) -> subprocess.CompletedProcess:
    """`raytrain COMMAND` under strace -f (every process it starts), on an embedded Ray of its own."""
    args = ["strace", "-f", "-qq", "-ttt", "-y", "-s", "40", "-e", f"trace={TRACED}", "-e", "signal=none",
            "-o", str(trace), "--", sys.executable, "-m", "raytrain.cli", *command]
    with own_ray_env() as env:
        proc = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"raytrain {' '.join(command)} under strace ended with {proc.returncode}; its output "
                           f"ends:\n{(proc.stdout + proc.stderr)[-2000:]}")
    return proc


def read_trace(trace: Path) -> tuple[list[Access], Processes]:
    with open(trace, errors="replace") as lines:
        return parse_strace(lines)


def measure_side(side: str, work: Path, log: Callable[[str], None]) -> dict:
    from raytrain.checkpoint import checkpoints
    from raytrain.rundir import runrecords

    storage = work / "ckptread"
    storage.mkdir(parents=True, exist_ok=True)
    name = f"ckpt-{side}-{time.time_ns() % 10**8}"
    run_dir = Path(os.path.realpath(runrecords.run_dir_of(str(storage), name)))  # as strace -y shows it
    wd = job_dir(work, name, checkpoint_config(str(probe_file(run_dir))), ship_bench=True)
    command = [side, "job.yaml", "--name", name, "--storage", str(run_dir.parent)]
    trace_a, trace_b = work / f"{name}.write.strace", work / f"{name}.resume.strace"
    try:
        traced(command, wd, trace_a)
        newest = checkpoints.committed(run_dir)
        if not newest:
            raise RuntimeError(f"{side}: the first run committed no checkpoint in {run_dir}")
        state = newest[0] / checkpoints.STATE_FILE
        staging = newest[0].with_name(layout.STAGING_PREFIX + newest[0].name) / checkpoints.STATE_FILE
        resumed_at = time.time()
        traced([*command, "--set", "train.epochs=3", "--set", "train.max_steps_per_epoch=2"], wd, trace_b)
        step = first_step_time(run_dir, resumed_at, 5, lambda: False)  # the run has ended: read once
        if step is None:
            raise RuntimeError(f"{side}: the resumed run wrote no first-step line to {probe_file(run_dir)}")
        a, a_procs = read_trace(trace_a)
        b, b_procs = read_trace(trace_b)
    finally:
        for path in (trace_a, trace_b):
            path.unlink(missing_ok=True)
        shutil.rmtree(wd, ignore_errors=True)
    measured = {"checkpoint": newest[0].name, "state_bytes": state.stat().st_size,
                "after_commit": tally(a, state, a_procs), "staging_before_commit": tally(a, staging, a_procs),
                "resume_to_first_step": tally(b, state, b_procs, before=step),
                "resume_whole_run": tally(b, state, b_procs),
                "workload": f"linear preset, model.hidden={MODEL['hidden']} model.layers={MODEL['layers']}, "
                            f"2 epochs then a resume for 1 more (2 steps)"}
    log(f"ckptread {side}: state.pt {measured['state_bytes']} bytes; read {measured['after_commit']['bytes']} after "
        f"its commit, {measured['resume_to_first_step']['bytes']} by the resume up to its first step "
        f"({measured['resume_whole_run']['bytes']} over the whole resumed run)")
    return measured


def bench_ckptread(s: BenchSettings, work: Path, log: Callable[[str], None]) -> list[dict]:
    if shutil.which("strace") is None:
        return [skipped("ckptread", "strace is not installed (apt-get install strace)")]
    out: list[dict] = []
    for side in SIDES:
        out += ckptread_figures(side, measure_side(side, work, log))
    return out

