"""A real small disk for tests of a full disk: a tmpfs of a given size mounted on a temporary directory (root
only; elsewhere the test is skipped, naming why)."""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path
from typing import Iterator

import pytest


@contextlib.contextmanager
def small_disk(where: Path, size: str) -> Iterator[Path]:
    """A directory `where` backed by a tmpfs of `size` (e.g. "64k"): writes past it fail with ENOSPC."""
    if os.geteuid() != 0:
        pytest.skip("a full-disk test mounts a small tmpfs, which needs root (CI runs as root)")
    where.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here for a full-disk test: {mounted.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)
