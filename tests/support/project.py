"""A user's own module in a project directory, imported as `raytrain run` imports it (the working directory on the
path). tests/conftest.py's autouse fixture puts sys.path and the working directory back after each test."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

from raytrain.spec import workdir


def user_module(directory: Path, name: str, source: str) -> Iterator[Path]:
    """Write DIRECTORY/NAME.py and make DIRECTORY the working directory; yield it; forget the module afterwards."""
    (directory / f"{name}.py").write_text(textwrap.dedent(source))
    workdir.use(str(directory))
    try:
        yield directory
    finally:
        sys.modules.pop(name, None)
