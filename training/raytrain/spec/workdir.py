"""The user's project directory: where `_component_` modules resolve from, in the driver and on every worker.

`raytrain run job.yaml` started in a project directory (or with --working-dir DIR) puts that directory first on
the import path, as `python train.py` would. The package is imported as `raytrain` (its folder is training/), so a
project's own `training.py` or `training/` never shadows it; a project file named `raytrain.py` would, and is
refused.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

from raytrain.errors import ConfigError

_current: Optional[Path] = None


class WorkingDirError(ConfigError):
    """The working directory cannot be used; str() says why and how to fix it."""


def use(directory: str) -> Path:
    """Put `directory` first on this process's import path; returns it, resolved."""
    global _current
    path = Path(directory).expanduser().resolve()
    if not path.is_dir():
        raise WorkingDirError(f"--working-dir {directory}: not a directory. Fix: give your project's directory "
                              f"(where your model and data modules are).")
    ours = Path(__file__).resolve().parents[1]  # the raytrain package
    for shadow in (path / "raytrain.py", path / "raytrain"):
        if shadow.exists() and shadow.resolve() != ours:
            raise WorkingDirError(f"{shadow} would shadow the raytrain package for your project's imports. Fix: "
                                  f"rename it (your own `training` module is fine).")
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))
    _current = path
    return path


def current() -> Optional[Path]:
    return _current
