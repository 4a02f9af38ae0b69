"""Errors raised by the Relay runtime.

    RelayError
    ├── RunNotFound         no run has that id (or it has expired)
    ├── RunCorrupt          the run's stored record cannot be read
    ├── DecisionRefused     an approval or answer for something not pending (or decided already)
    ├── WaitTimeout         `wait` gave up before the run finished
    ├── StoreUnavailable    Redis cannot be reached or answered with an error
    └── ToolRegistrationError  a tool function that cannot be described to the model

`workers.settings.SettingsError` (a bad RELAY_* variable) stands apart: it is
raised before any Relay object exists. Errors of the pure core are
`agent_core.AgentError`.
"""

from __future__ import annotations

__all__ = [
    "DecisionRefused",
    "RelayError",
    "RunCorrupt",
    "RunNotFound",
    "StoreUnavailable",
    "ToolRegistrationError",
    "WaitTimeout",
]


class RelayError(Exception):
    """Raised for every error of the Relay runtime; the root of the tree."""


class RunNotFound(RelayError, KeyError):
    """Raised when no run has the given id (it never existed, or it expired)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "run not found"


class RunCorrupt(RelayError):
    """Raised when a run's stored record cannot be read; the run fails when it next wakes."""


class DecisionRefused(RelayError):
    """Raised when a decision names something that is not pending, or was decided already."""


class WaitTimeout(RelayError, TimeoutError):
    """Raised when `Relay.wait` gives up before the run finished."""


class StoreUnavailable(RelayError, ConnectionError):
    """Raised when Redis cannot be reached or fails; the message names it without a password."""


class ToolRegistrationError(RelayError, TypeError):
    """Raised when a tool function's signature cannot be described to the model."""
