"""Imports started before they are needed: a driver's `import ray.train.torch` (torch, Ray Train, Ray Data: about
2.5 s of one core here) runs on a daemon thread while the main thread loads the config, takes the run's lease and
connects to Ray (mostly waiting on files and the GCS), instead of after them (issue 42: P3's driver phase).

Safe with Python's per-module import locks: the main thread's later import of the same module waits for this one to
finish. The thread imports only third-party packages, which never import raytrain, so no two threads wait on each
other's modules. A failed import here is left for the main thread's own import to raise where it is handled."""

from __future__ import annotations

import atexit
import importlib
import threading

JOIN_AT_EXIT_S = 10.0  # an early exit (a refused run) waits this long at most for an import under way


def in_background(*modules: str) -> threading.Thread:
    """Start importing `modules` on a daemon thread; the process's exit waits for it (a C extension half
    initialised while the interpreter shuts down can crash the exit)."""
    def run() -> None:
        for name in modules:
            try:
                importlib.import_module(name)
            except BaseException:  # noqa: BLE001 - the main thread imports it again and reports what is wrong
                return

    thread = threading.Thread(target=run, name="raytrain-preload", daemon=True)
    thread.start()
    atexit.register(thread.join, JOIN_AT_EXIT_S)
    return thread
