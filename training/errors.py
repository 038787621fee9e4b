"""The errors raytrain shows a user as one paragraph (file, key, fix) instead of a traceback. cli.main catches
UserError; each layer raises its own subclass without importing the layers that print them."""


class UserError(Exception):
    """Something the user must fix or know; str() is the whole message, ready to print."""

    exit_code = 1


class ConfigError(UserError, ValueError):
    """A run config (or its components, or a command-line value) the user must fix."""

    exit_code = 2


class LaunchError(UserError, RuntimeError):
    """The run cannot start or did not finish; the message is one paragraph for the user."""

    exit_code = 1
