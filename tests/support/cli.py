"""The `raytrain` command run inside the test process: `main([...])` as the console script calls it.

A fresh `python -m raytrain.cli` spends seconds importing (Ray, torch, pydantic) before it parses one flag; a unit
test that checks a message or an exit status calls main() here instead (milliseconds). Where another process is
the point (a changed uid), `in_forked_child` forks this already-imported process instead of starting a new one.
Tests that must see a fresh interpreter (what a command imports: tests/test_imports.py) still start one.
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import time
import traceback
import warnings
from dataclasses import dataclass
from typing import Callable, Optional

from raytrain.cli import main


@dataclass
class Done:
    """What a command left: its exit status and what it printed (subprocess.CompletedProcess's names)."""

    returncode: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def exit_status(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as stop:  # argparse's own usage errors and --version
        return stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)


def in_forked_child(argv: list[str], before: Optional[Callable[[], None]] = None, timeout: float = 120) -> Done:
    """main(argv) in a fork of this process, after before() (e.g. dropping root) ran there; what it printed."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        with warnings.catch_warnings():  # Python 3.12 warns about forking with threads; the child only runs main()
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:  # the child: never returns into pytest
            code = 70
            try:
                os.dup2(out.fileno(), 1)
                os.dup2(err.fileno(), 2)
                # pytest's capture replaced sys.stdout/err with its own objects: write to the files instead
                sys.stdout = open(1, "w", closefd=False)
                sys.stderr = open(2, "w", closefd=False)
                if before is not None:
                    before()
                code = exit_status(argv)
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        deadline = time.monotonic() + timeout
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                raise AssertionError(f"raytrain {' '.join(argv)} did not end within {timeout}s")
            time.sleep(0.01)
        out.seek(0)
        err.seek(0)
        return Done(os.waitstatus_to_exitcode(status), out.read(), err.read())
