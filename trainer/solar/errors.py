"""User-facing errors.

Every error a user can cause by their input is a ``SolarError``: the CLI prints its message as one
line (``solar: error: <message>``) and exits with code 2, without a traceback unless
``SOLAR_DEBUG=1``. Anything else escaping the CLI is a bug and is reported as such.
"""

from __future__ import annotations


class SolarError(Exception):
    """An error in the user's input or environment; the message says what and where."""

    exit_code = 2

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:  # one line, always
        return " ".join(self.message.split())


class ConfigError(SolarError):
    """A run configuration (or a ``--set`` edit of it) is invalid. ``reason`` classifies it the way
    a SolarRun's ``Validated`` condition reports it: UnsupportedRoute, UnresolvedPlaceholder,
    TopologyMismatch or InvalidSpec."""

    def __init__(self, message: str, reason: str = "InvalidSpec") -> None:
        super().__init__(message)
        self.reason = reason


class DataError(SolarError):
    """An index, shard or sample violates the data contract."""
