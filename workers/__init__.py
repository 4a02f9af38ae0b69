"""workers: the distributed runtime — the Relay object, its Celery app, tasks and client API."""

from workers.chat import ModelReply
from workers.errors import (
    AppNotFound,
    CallTimedOut,
    DecisionRefused,
    EmbeddedError,
    ModelCallError,
    RelayError,
    RunCorrupt,
    RunNotFound,
    SettingsError,
    StepFailed,
    StoreUnavailable,
    ToolRegistrationError,
    WaitTimeout,
)
from workers.limits import RouteState
from workers.pricing import Budget, Price
from workers.records import Pending, RunStatus, StreamEvent, TraceEntry, Usage
from workers.registry import ToolContext
from workers.relay import Relay
from workers.routes import ModelRoute
from workers.settings import Settings

__all__ = [
    "AppNotFound",
    "Budget",
    "CallTimedOut",
    "DecisionRefused",
    "EmbeddedError",
    "ModelCallError",
    "ModelReply",
    "ModelRoute",
    "Pending",
    "Price",
    "Relay",
    "RelayError",
    "RouteState",
    "RunCorrupt",
    "RunNotFound",
    "RunStatus",
    "Settings",
    "SettingsError",
    "StepFailed",
    "StoreUnavailable",
    "StreamEvent",
    "ToolContext",
    "ToolRegistrationError",
    "TraceEntry",
    "Usage",
    "WaitTimeout",
]
