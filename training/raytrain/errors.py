"""The one base class of raytrain's expected errors: a message for the user (one paragraph naming what and the fix)
and the exit status the CLI gives it. The CLI catches this class alone, so it needs none of the modules that
raise them (the launcher, and with it torch, stays unimported for commands that never train).

May import: nothing
"""

from __future__ import annotations

EXIT_FAILED, EXIT_USAGE = 1, 2


class RaytrainError(Exception):
    """An expected failure; str() is the whole message."""

    exit_code = EXIT_FAILED


class UsageError(RaytrainError):
    """Bad input (a config, a flag, a missing file or tool): nothing ran."""

    exit_code = EXIT_USAGE


class ConfigError(UsageError, ValueError):
    """A run config (or its components, or a command-line value) the user must fix."""


class LaunchError(RaytrainError, RuntimeError):
    """The run cannot start or did not finish; the message is one paragraph for the user."""


def shorten(text: str, limit: int = 80) -> str:
    """A user's value as a message repeats it: cut when long (a 5000-digit --set is named, not printed)."""
    return text if len(text) <= limit else f"{text[:limit - 20]}...({len(text)} characters)"


def shown(value: object, limit: int = 80) -> str:
    """repr() of a user's value for a message: control characters escaped, cut when long."""
    return shorten(repr(value), limit)
