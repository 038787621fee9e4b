"""scripts/setup-system and the tools helper the tests share: the packages it installs are the tools the tests look
for, a missing tool skips its test naming the install command, and without root or sudo `--if-permitted` (what
`scripts/setup --dev` runs) names what is missing in one line instead of failing the setup."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support import tools
from tests.support.tools import require_tool

REPO = Path(__file__).resolve().parents[2]
SETUP_SYSTEM = REPO / "scripts" / "setup-system"
NOBODY = 65534


def test_the_packages_installed_are_the_ones_the_tests_look_for():
    default = re.search(r'^PACKAGES="\$\{PACKAGES:-([^}]*)\}"', SETUP_SYSTEM.read_text(), re.M).group(1)
    assert sorted(default.split()) == sorted(tools.PACKAGES.values())


def test_a_missing_tool_skips_naming_it_and_how_to_install_it(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(tools, "EXTRA_DIRS", ())
    monkeypatch.delenv(tools.REQUIRE_ENV, raising=False)
    with pytest.raises(pytest.skip.Exception, match=r"^ip is not installed: scripts/setup-system installs it "
                                                     r"\(Debian package iproute2;"):
        require_tool("ip")
    monkeypatch.setenv(tools.REQUIRE_ENV, "1")  # CI, where setup-system ran: a missing tool is a failure
    with pytest.raises(pytest.fail.Exception, match="prometheus is not installed"):
        require_tool("prometheus")


def test_a_present_tool_is_found_even_outside_a_users_path(monkeypatch, tmp_path):
    (tmp_path / "ip").write_text("#!/bin/sh\n")
    (tmp_path / "ip").chmod(0o755)
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr(tools, "EXTRA_DIRS", (str(tmp_path),))  # as /usr/sbin, off a non-root PATH
    assert require_tool("ip") == str(tmp_path / "ip")


def setup_system(*args: str, as_nobody: bool = False, **env: str) -> subprocess.CompletedProcess:
    def drop_root():
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)

    return subprocess.run([str(SETUP_SYSTEM), *args], capture_output=True, text=True, timeout=60, cwd="/",
                          env={**os.environ, **env}, preexec_fn=drop_root if as_nobody else None)


def test_usage_and_nothing_to_do_when_everything_is_there():
    usage = setup_system("--help")
    assert usage.returncode == 0 and usage.stdout.startswith("usage: scripts/setup-system [--if-permitted]")
    assert setup_system("--bogus").returncode == 2
    done = setup_system("--if-permitted", PACKAGES="bash")  # present on any machine that runs this script
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


def test_without_root_or_sudo_the_setup_names_what_is_missing_and_goes_on():
    if os.geteuid() != 0:
        pytest.skip("runs the script as uid 65534, which needs root here")
    if shutil.which("sudo"):
        probe = subprocess.run(["sudo", "-n", "true"], capture_output=True, preexec_fn=lambda: os.setuid(NOBODY))
        if probe.returncode == 0:
            pytest.skip("uid 65534 has passwordless sudo here: the script would install")
    done = setup_system("--if-permitted", as_nobody=True, PACKAGES="bash raytrain-no-such-package")
    assert done.returncode == 0, done.stderr
    expected = ("setup-system: not installed (needs root; the tests needing them skip): raytrain-no-such-package. "
                "Fix: sudo scripts/setup-system") if shutil.which("apt-get") else \
        "setup-system: no apt-get here; the tests needing these skip until you install them: raytrain-no-such-package"
    assert done.stdout.splitlines() == [expected]


@pytest.mark.parametrize("script", ["setup", "setup-system", "test"])
def test_shellcheck_passes(script):
    lint = subprocess.run([require_tool("shellcheck"), f"scripts/{script}"], cwd=REPO, capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout + lint.stderr
