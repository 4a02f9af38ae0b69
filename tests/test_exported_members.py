"""The public names of `workers` and `scheduler`: exported once, sorted, and each one real.

(agent_core's list is guarded in tests/test_core_purity.py.) A name added or
dropped must be added here too, on purpose.
"""

from __future__ import annotations

import inspect
from types import ModuleType

import pytest

import scheduler
import workers
from scheduler.errors import SchedulerError
from workers.errors import RelayError

WORKERS = [
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

SCHEDULER = [
    "Notification",
    "Schedule",
    "ScheduleKeys",
    "ScheduleShards",
    "ScheduleStore",
    "SchedulerError",
    "StoreUnreachable",
    "TickHost",
    "tick",
]


@pytest.mark.parametrize(("package", "names"), [(workers, WORKERS), (scheduler, SCHEDULER)])
def test_the_exported_names_are_exactly_these(package: ModuleType, names: list[str]) -> None:
    assert package.__all__ == names
    assert sorted(package.__all__) == package.__all__
    for name in names:
        assert getattr(package, name) is not None, name


@pytest.mark.parametrize(("package", "root"), [(workers, RelayError), (scheduler, SchedulerError)])
def test_every_exported_error_is_in_its_packages_tree(
    package: ModuleType, root: type[Exception]
) -> None:
    errors = [
        value
        for value in (getattr(package, name) for name in package.__all__)
        if inspect.isclass(value) and issubclass(value, BaseException)
    ]
    assert errors, "no errors exported"
    assert all(issubclass(error, root) for error in errors), errors


def test_every_error_class_of_workers_is_in_the_drawn_tree() -> None:
    import workers.errors as tree  # noqa: PLC0415 - the module whose docstring is checked

    drawn = tree.__doc__ or ""
    classes = [
        name
        for name, value in vars(tree).items()
        if inspect.isclass(value) and issubclass(value, RelayError)
    ]
    assert sorted(classes) == sorted(tree.__all__)
    for name in classes:
        assert name in drawn, f"{name} is missing from the tree drawn in workers/errors.py"


def test_the_store_being_away_is_the_schedulers_store_unreachable() -> None:
    # The tick keeps a slot firing (its run is started later) on exactly this error.
    assert issubclass(workers.StoreUnavailable, scheduler.StoreUnreachable)
