"""Errors raised by the Relay runtime.

    RelayError
    ├── SettingsError         a RELAY_* variable Relay cannot use (also ValueError)
    ├── AppNotFound           --app or RELAY_APP names no Relay that can be imported
    ├── ToolRegistrationError a tool function that cannot be described to the model
    ├── RunNotFound           no run has that id, or it has expired (also KeyError)
    ├── RunCorrupt            the run's stored record cannot be read
    ├── DecisionRefused       a decision for something not pending, decided, or too late
    ├── WaitTimeout           `wait` gave up before the run finished (also TimeoutError)
    ├── StoreUnavailable      Redis cannot be reached or answered with an error (also
    │   │                     ConnectionError and scheduler.StoreUnreachable)
    │   └── StoreMisconfigured  Redis refused the URL in a way waiting cannot mend
    │                         (authentication failed, no such database, no such host)
    ├── ModelCallError        a model call failed; `retryable` says it was transient
    ├── CallTimedOut          a call ran past its time limit (it may still be running)
    ├── CallCancelled         an async call was cancelled (its run was, or its lease lost)
    ├── MCPServerError        an MCP server could not be started, listed or reached
    ├── StepFailed            a task's step ended its run in failure, or its call failed
    │                         (raised after the step is saved, so Flower shows FAILURE)
    └── EmbeddedError         the private Redis or worker of `relay run`/`demo` failed

Errors of the pure core are `agent_core.AgentError`; where the runtime reports
one as its own (`Relay.start` given a task the core refuses), the core's error
is the cause.
"""

from __future__ import annotations

from scheduler.errors import StoreUnreachable

__all__ = [
    "AppNotFound",
    "CallCancelled",
    "CallTimedOut",
    "DecisionRefused",
    "EmbeddedError",
    "MCPServerError",
    "ModelCallError",
    "RelayError",
    "RunCorrupt",
    "RunNotFound",
    "SettingsError",
    "StepFailed",
    "StoreMisconfigured",
    "StoreUnavailable",
    "ToolRegistrationError",
    "WaitTimeout",
]


class RelayError(Exception):
    """Raised for every error of the Relay runtime; the root of the tree."""


class SettingsError(RelayError, ValueError):
    """Raised when an environment variable has a value Relay cannot use; one line, no secrets."""


class AppNotFound(RelayError):
    """Raised when `--app` does not name a Relay object that can be imported."""


class ToolRegistrationError(RelayError, TypeError):
    """Raised when a tool function's signature cannot be described to the model."""


class RunNotFound(RelayError, KeyError):
    """Raised when no run has the given id (it never existed, or it expired)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "run not found"


class RunCorrupt(RelayError):
    """Raised when a run's stored record cannot be read; the run fails when it next wakes."""


class DecisionRefused(RelayError):
    """Raised when a decision names something that is not pending, was decided already,
    or came after its time ran out (then it is declined)."""


class WaitTimeout(RelayError, TimeoutError):
    """Raised when `Relay.wait` gives up before the run finished."""


class StoreUnavailable(RelayError, ConnectionError, StoreUnreachable):
    """Raised when Redis cannot be reached or fails; the message names it without a password."""


class StoreMisconfigured(StoreUnavailable):
    """Raised when Redis refuses the URL itself: a missing or wrong password (AUTH failed,
    NOAUTH, WRONGPASS), a database index it does not have, a host name that does not
    resolve. Retrying cannot mend it: a worker refuses to start on it, in one line; a
    running one treats it as Redis being away, like its parent."""


class ModelCallError(RelayError):
    """Raised when a model call fails; `retryable` says the failure was transient.

    `status` is the HTTP status when the server answered, else None. A transient
    failure has already been retried as often as the settings allow.
    """

    def __init__(
        self,
        message: str,
        *,
        retryable: bool,
        status: int | None = None,
        retry_after: float | None = None,
        route: str = "",
    ) -> None:
        super().__init__(message)
        self.message = message
        self.retryable = retryable
        self.status = status
        self.retry_after = retry_after
        """Seconds the server asked us to wait (Retry-After), if it said."""
        self.route = route
        """The model route that failed last ("" where no route was asked)."""


class CallTimedOut(RelayError):
    """Raised when a call did not finish within its time limit (it may still be running)."""


class CallCancelled(RelayError):
    """Raised when an async call was cancelled because its run was, or its lease was lost."""


class MCPServerError(RelayError):
    """Raised when an MCP server cannot be started, listed or reached, or lists other
    tools than the app was built with. The message names the server, never its headers."""


class StepFailed(RelayError):
    """Raised by a Relay task after its step is saved, when the step ended its run in
    failure or the call it made failed: Flower shows the task as FAILURE, with this
    line as the reason. The message is acked like any other (nothing is retried)."""


class EmbeddedError(RelayError):
    """Raised when the private Redis or worker cannot start, or stops before the command ends."""
