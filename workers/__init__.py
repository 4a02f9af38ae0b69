"""workers: the distributed runtime — the Relay object, its Celery app, tasks and client API."""

from workers.errors import (
    DecisionRefused,
    RelayError,
    RunCorrupt,
    RunNotFound,
    StoreUnavailable,
    ToolRegistrationError,
    WaitTimeout,
)
from workers.model_client import ModelCallError, ModelReply
from workers.records import Pending, RunStatus, TraceEntry, Usage
from workers.registry import ToolContext
from workers.relay import Relay
from workers.settings import Settings, SettingsError

__all__ = [
    "DecisionRefused",
    "ModelCallError",
    "ModelReply",
    "Pending",
    "Relay",
    "RelayError",
    "RunCorrupt",
    "RunNotFound",
    "RunStatus",
    "Settings",
    "SettingsError",
    "StoreUnavailable",
    "ToolContext",
    "ToolRegistrationError",
    "TraceEntry",
    "Usage",
    "WaitTimeout",
]
