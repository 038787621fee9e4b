"""bench/ckptread.py: strace lines parsed into reads, the reads of one file tallied, and the part's figures."""

from __future__ import annotations

import subprocess
import sys


from bench import ckptread
from tests.support.tools import require_tool

STATE = "/runs/r/checkpoint_epoch000002_ab12cd34/state.pt"

TRACE = f"""\
100 1700000000.000001 execve("/usr/bin/python3", ["python3", "-m", "raytrain.cli", "run"], 0x7ffd /* 40 vars */) = 0
100 1700000000.000002 clone3({{flags=CLONE_VM|CLONE_FS|CLONE_FILES|CLONE_SIGHAND|CLONE_THREAD|CLONE_SYSVSEM, \
stack=0x7f00, stack_size=0x7fff00}}, 88) = 101
100 1700000000.000003 clone(child_stack=NULL, flags=CLONE_CHILD_CLEARTID|CLONE_CHILD_SETTID|SIGCHLD, \
child_tidptr=0x7f00) = 300
101 1700000000.050000 read(7<{STATE}>, ""..., 10) = 10
100 1700000000.100000 read(7<{STATE}>, "PK\\3\\4"..., 1048577) = 1048576
100 1700000000.200000 read(7<{STATE}>, "", 1) = 0
200 1700000000.300000 pread64(9<{STATE}>,  <unfinished ...>
100 1700000000.300100 read(3<socket:[12345]>, "x"..., 4096) = 4096
200 1700000000.400000 <... pread64 resumed>"\\0\\0"..., 524288, 0) = 524288
200 1700000000.500000 read(9<{STATE}>, 0x7f00, 4096) = -1 EAGAIN (Resource temporarily unavailable)
300 1700000000.600000 read(4<{STATE}>, ") = 99 ) = 7"..., 100) = 100
300 1700000000.700000 mmap(NULL, 3145728, PROT_READ, MAP_PRIVATE, 4<{STATE}>, 0) = 0x7f1234560000
300 1700000000.800000 read(4<{STATE} (deleted)>, ""..., 10) = 10
400 1700000000.900000 read(5<{STATE}>,  <unfinished ...>
400 1700000001.000000 +++ killed by SIGKILL +++
"""


def test_reads_of_a_path_are_summed_across_unfinished_calls_and_errors():
    accesses, procs = ckptread.parse_strace(TRACE.splitlines())
    got = ckptread.tally(accesses, STATE, procs)
    # 1 MiB + 10 by the driver (10 by its thread 101), 512 KiB resumed after another process's line, 100 + 10 by its
    # fork 300 (the data string's ") = 99" is not the result; a deleted file is still that file); the EAGAIN, the
    # EOF and the socket don't count.
    assert got["bytes"] == 1048576 + 10 + 524288 + 110
    assert got["reads"] == 5 and got["mmaps"] == 1
    assert [(p["pid"], p["bytes"]) for p in got["by_process"]] == [(100, 1048586), (200, 524288), (300, 110)]
    assert got["by_process"][0]["command"].startswith('"python3", "-m", "raytrain.cli"')
    assert got["by_process"][1]["command"] == "(no execve traced)"
    assert got["by_process"][2]["command"] == got["by_process"][0]["command"]  # forked, no execve of its own


def test_a_time_limit_keeps_only_the_calls_that_returned_before_it():
    accesses, _ = ckptread.parse_strace(TRACE.splitlines())
    assert ckptread.tally(accesses, STATE, before=1700000000.35)["bytes"] == 1048586  # the pread64 returned later
    assert ckptread.tally(accesses, "/elsewhere/state.pt")["bytes"] == 0


def _measured(after: int, resume: int, mmaps: int = 0) -> dict:
    def t(n: int, m: int = 0) -> dict:
        return {"bytes": n, "reads": 1 if n else 0, "mmaps": m, "by_process": []}

    return {"checkpoint": "checkpoint_epoch000002_x", "state_bytes": 1000, "after_commit": t(after, mmaps),
            "staging_before_commit": t(0), "resume_to_first_step": t(resume), "resume_whole_run": t(resume),
            "workload": "linear"}


def test_figures_give_the_bytes_read_against_the_checkpoints_size():
    rows = {r["figure"]: r for r in ckptread.ckptread_figures("run", _measured(0, 2000))}
    assert rows["ckptread_run_state_bytes"]["median"] == 1000
    assert rows["ckptread_run_bytes_read"]["median"] == 2000
    assert rows["ckptread_run_ratio"]["median"] == 2.0 and rows["ckptread_run_ratio"]["met"] is True
    over = {r["figure"]: r for r in ckptread.ckptread_figures("local", _measured(1000, 2000, mmaps=1))}
    assert over["ckptread_local_ratio"]["median"] == 3.0 and over["ckptread_local_ratio"]["met"] is False
    assert "memory-mapped" in over["ckptread_local_bytes_read"]["warning"]


def test_a_real_trace_of_a_process_that_reads_a_file_twice(tmp_path):
    strace = require_tool("strace")
    data = tmp_path / "state.pt"
    data.write_bytes(b"x" * 300_000)
    trace = tmp_path / "trace"
    code = f"import pathlib, threading; p = pathlib.Path({str(data)!r}); t = threading.Thread(target=p.read_bytes); " \
           f"t.start(); p.read_bytes(); t.join()"
    subprocess.run([strace, "-f", "-qq", "-ttt", "-y", "-s", "40", "-e", f"trace={ckptread.TRACED}", "-o",
                    str(trace), "--", sys.executable, "-c", code], check=True)
    accesses, procs = ckptread.read_trace(trace)
    got = ckptread.tally(accesses, data.resolve(), procs)
    assert got["bytes"] == 600_000 and got["reads"] == 2  # the empty read at the end returns no bytes
    assert len({a.pid for a in accesses if a.path == str(data.resolve())}) == 2  # a thread has an id of its own,
    assert [p["bytes"] for p in got["by_process"]] == [600_000]  # and is counted with its process
