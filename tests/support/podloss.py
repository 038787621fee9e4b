"""A lost pod in a test: every process of a job started with start_new_session=True (the driver, the embedded Ray's
daemons and its workers) SIGKILLed at once. os.killpg is not enough on Ray 2.60: its workers run in process
groups of their own, and a worker that outlives its raylet for a moment finishes what it was writing (a checkpoint
the test meant to tear)."""

from __future__ import annotations

import os
import signal
import subprocess

from raytrain.platform import processes


def kill_session(proc: subprocess.Popen, wait_s: float = 60) -> None:
    """SIGKILL proc's whole session (proc itself first) and reap proc."""
    alive = [proc.pid] if proc.poll() is None else []  # a reaped pid may be another process's by now
    for pid in [*alive, *(p for p in processes.session_pids(proc.pid) if p != proc.pid)]:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    proc.wait(wait_s)
