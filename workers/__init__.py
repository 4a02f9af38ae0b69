"""workers: the distributed runtime — the Relay object, its Celery app, tasks and client API."""

from workers.aio import AsyncRelay
from workers.client.replays import Diff, ReplayReport
from workers.client.start import Recorded
from workers.engine.budget import Budget, Price
from workers.engine.records import Pending, RunStatus, StreamEvent, TraceEntry, Usage
from workers.errors import (
    AppNotFound,
    CallCancelled,
    CallTimedOut,
    DecisionRefused,
    EmbeddedError,
    MCPServerError,
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
from workers.kit.tools import ToolContext
from workers.mcp.config import MCPServer
from workers.model.endpoints import ModelRoute
from workers.model.limits import RouteState
from workers.model.wire import ModelReply
from workers.relay import Relay
from workers.settings import Settings

__all__ = [
    "AppNotFound",
    "AsyncRelay",
    "Budget",
    "CallCancelled",
    "CallTimedOut",
    "DecisionRefused",
    "Diff",
    "EmbeddedError",
    "MCPServer",
    "MCPServerError",
    "ModelCallError",
    "ModelReply",
    "ModelRoute",
    "Pending",
    "Price",
    "Recorded",
    "Relay",
    "RelayError",
    "ReplayReport",
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
