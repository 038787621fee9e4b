"""The system tools some tests run (shellcheck, prometheus, ip, strace): found, or the test skips naming the tool and the
command that installs it. One place, so a missing tool reads the same in every test and never surfaces as a
FileNotFoundError from deep inside one.

CI sets RAYTRAIN_TEST_REQUIRE_TOOLS=1 (.ci/run): there scripts/setup-system has installed them all, and a missing
one fails the test instead of hiding behind a skip.
"""

from __future__ import annotations

import os
import shutil
from typing import Optional

import pytest

# Tool -> the Debian package scripts/setup-system installs it from (its PACKAGES list).
PACKAGES = {"shellcheck": "shellcheck", "prometheus": "prometheus", "ip": "iproute2", "strace": "strace"}
# `ip` lives in /usr/sbin, which a non-root user's PATH often lacks.
EXTRA_DIRS = ("/usr/sbin", "/sbin")
REQUIRE_ENV = "RAYTRAIN_TEST_REQUIRE_TOOLS"


def find_tool(name: str) -> Optional[str]:
    """The tool's path, or None."""
    path = os.pathsep.join([os.environ.get("PATH", ""), *EXTRA_DIRS])
    return shutil.which(name, path=path)


def how_to_install(name: str) -> str:
    package = PACKAGES[name]
    return (f"{name} is not installed: scripts/setup-system installs it (Debian package {package}; "
            f"`scripts/setup --dev` runs it where it may use root or sudo)")


def require_tool(name: str) -> str:
    """The tool's path; else skip the calling test (fail under RAYTRAIN_TEST_REQUIRE_TOOLS=1) saying how to get it."""
    if name not in PACKAGES:
        raise KeyError(f"{name}: add it to tests/support/tools.py PACKAGES and to scripts/setup-system")
    found = find_tool(name)
    if found:
        return found
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{how_to_install(name)} ({REQUIRE_ENV}=1: every tool is expected here)")
    pytest.skip(how_to_install(name))
