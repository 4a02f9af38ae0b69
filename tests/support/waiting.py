"""Small helpers for runtime tests: a fleet shared by a module, waiting on what a run
waits for, and reading what the model server was sent for one run's task."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support.fleet import Fleet, fleet
from tests.support.model_server import ChatCall
from workers.engine.records import Pending

__all__ = ["calls_for", "pending_for", "prompts_for", "shared_fleet", "wait_state"]


@contextmanager
def shared_fleet(
    directory: Path, *worker_args: str, extra_env: dict[str, str] | None = None
) -> Iterator[Fleet]:
    """Yield a fleet with one worker already started (for a module-scoped fixture).

    Tests that share it must use task markers no other test uses.
    """
    with fleet(directory, extra_env=extra_env) as running:
        running.worker(*worker_args)
        yield running


def pending_for(f: Fleet, run_id: str, kind: str = "call", timeout: float = 60) -> Pending:
    """Return the first entry of `relay.pending()` of that kind for the run, once there is one."""
    found: list[Pending] = []

    def check() -> bool:
        found[:] = [p for p in f.relay.pending() if p.run_id == run_id and p.kind == kind]
        return bool(found)

    f.until(check, timeout, what=f"run {run_id} to wait for a {kind}")
    return found[0]


def wait_state(f: Fleet, run_id: str, state: str, timeout: float = 60) -> None:
    """Wait until the run's status shows `state` (running, waiting, finished)."""
    f.until(lambda: f.relay.status(run_id).state == state, timeout, what=f"{run_id} {state}")


def calls_for(f: Fleet, marker: str) -> list[ChatCall]:
    """Return the chat calls whose task (the prompt's first section) holds `marker`, in order."""
    return [c for c in f.model.calls if marker in c.prompt.split("\n\n", 1)[0]]


def prompts_for(f: Fleet, marker: str) -> list[str]:
    """Return the prompts sent for the task holding `marker`, in order."""
    return [c.prompt for c in calls_for(f, marker)]
