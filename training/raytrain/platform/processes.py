"""This machine's processes, read from /proc (no psutil needed): process trees, who mentions a path, memory, and
killing exactly the processes we were given (PID and start time, so a reused PID is never hit)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path


def _stats() -> Iterator[tuple[int, list[str]]]:
    """(pid, the fields of /proc/PID/stat after the command name: state, ppid, pgrp, session, ...) of each process."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        yield int(entry), stat[stat.rindex(")") + 2:].split()


def proc_table() -> dict[int, tuple[int, float, list[str]]]:
    """pid -> (parent pid, start time in clock ticks, command line), read from /proc (no psutil needed)."""
    table = {}
    for pid, fields in _stats():
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        table[pid] = (int(fields[1]), float(fields[19]), [c.decode(errors="replace") for c in cmdline if c])
    return table


def process_start(pid: int) -> float | None:
    entry = proc_table().get(pid)
    return entry[1] if entry else None


def memory_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 8 * 2**30


def memory_total() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    return 8 * 2**30


def sh(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), capture_output=True, text=True, check=check)


def tree_pids(root_pid: int) -> list[int]:
    """root_pid and all its descendants."""
    table = proc_table()
    if root_pid not in table:
        return []
    found, frontier = [root_pid], [root_pid]
    while frontier:
        parent = frontier.pop()
        children = [pid for pid, (ppid, _, _) in table.items() if ppid == parent]
        found += children
        frontier += children
    return found


def pids_mentioning(text: str) -> list[int]:
    """Processes whose command line names `text` (our run dir): Ray daemons orphaned by a killed parent."""
    return [pid for pid, (_, _, cmd) in proc_table().items()
            if pid != os.getpid() and any(text in part for part in cmd)]


def session_pids(sid: int) -> list[int]:
    """Processes of session `sid` (a process started with start_new_session=True leads one): also those that left
    its process group, as Ray 2.60's workers do (each in a group of its own)."""
    return [pid for pid, fields in _stats() if int(fields[3]) == sid]


def netns_pids(netns: str) -> list[int]:
    result = sh("ip", "netns", "pids", netns, check=False)
    return [int(p) for p in result.stdout.split()] if result.returncode == 0 else []


def kill_pids(pids: list[int], grace: float = 3.0) -> None:
    """SIGTERM, then SIGKILL what is left: only ever the PIDs we were given."""
    pids = [p for p in dict.fromkeys(pids) if p != os.getpid()]
    starts = {pid: process_start(pid) for pid in pids}
    pids = [pid for pid in pids if starts[pid] is not None]
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, grace)):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + wait
        while pids and time.monotonic() < deadline:
            for pid in pids:  # reap our own children so they do not linger as zombies
                try:
                    os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    pass
            # same PID and start time: still the process we signalled (not a reused PID)
            pids = [pid for pid in pids if process_start(pid) == starts[pid] and not is_zombie(pid)]
            if pids:
                time.sleep(0.1)
        if not pids:
            return


def is_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat[stat.rindex(")") + 2] == "Z"
    except OSError:
        return True
