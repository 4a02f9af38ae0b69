"""What `Relay.start` and `Relay(...)` are handed, checked before anything is written.

Each refusal is one `RelayError` line naming what is wrong.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from pydantic import ValidationError

from agent_core import Agent, Attachment, Config
from agent_core.errors import AgentError
from workers.agent_kit import AgentKit
from workers.errors import RelayError
from workers.pricing import Budget, Price

__all__ = [
    "MAX_ATTACHMENT_BYTES",
    "MAX_TASK_CHARS",
    "check_start",
    "checked_concurrency",
    "checked_key",
    "checked_prices",
    "start_budget",
    "started_agent",
]

MAX_TASK_CHARS = 100_000
MAX_ATTACHMENT_BYTES = 20 * 1024 * 1024


def check_start(
    task: object,
    attachments: Iterable[Attachment] | None,
    tools: Sequence[str] | None,
    run_id: str | None,
    *,
    known: set[str],
) -> tuple[Attachment, ...]:
    """Refuse what `start` cannot take (`known`: the tools that exist), in one line each;
    return the attachments."""
    if not isinstance(task, str) or not task.strip():
        raise RelayError("the task must be non-empty text")
    if len(task) > MAX_TASK_CHARS:
        raise RelayError(f"the task is longer than {MAX_TASK_CHARS} characters")
    files = tuple(attachments or ())
    if sum(len(a.data) for a in files) > MAX_ATTACHMENT_BYTES:
        raise RelayError(f"attachments are larger than {MAX_ATTACHMENT_BYTES} bytes in all")
    unknown = sorted(set(tools or ()) - known)
    if unknown:
        raise RelayError(f"unknown tools: {', '.join(unknown)}")
    if run_id is not None and not (run_id.isascii() and run_id.isalnum() and len(run_id) <= 64):
        raise RelayError(f"a run id is 1 to 64 letters and digits, got {run_id!r}")
    return files


def start_budget(given: object) -> Budget | None:
    """A start's budget: a Budget, a number of tokens, a schedule's budget (the fields of
    a Budget, as plain data), or None; anything else refused."""
    if isinstance(given, Mapping):
        try:
            given = Budget.model_validate(given)
        except ValidationError as error:
            raise RelayError(f"budget: {error.errors()[0]['msg']}") from None
    if given is None or isinstance(given, Budget):
        return None if isinstance(given, Budget) and given.empty else given
    if isinstance(given, int) and not isinstance(given, bool) and given > 0:
        return Budget(tokens=given)
    raise RelayError("budget must be a positive number of tokens, or a Budget")


def checked_prices(given: Mapping[str, Price] | None) -> dict[str, Price]:
    if given is None:
        return {}
    if not isinstance(given, Mapping) or not all(
        isinstance(k, str) and isinstance(v, Price) for k, v in given.items()
    ):
        raise RelayError("prices maps model names to Price values")
    return dict(given)


def checked_key(given: object) -> str | None:
    """A run's key: 1 to 128 printable characters, or None (the app's name)."""
    if given is None:
        return None
    if not isinstance(given, str) or not 0 < len(given) <= 128 or not given.isprintable():
        raise RelayError(f"a key is 1 to 128 printable characters, got {given!r:.80}")
    return given


def checked_concurrency(given: object) -> int | None:
    if given is None:
        return None
    if not isinstance(given, int) or isinstance(given, bool) or given < 1:
        raise RelayError("key_concurrency is a whole number of calls, 1 or more")
    return given


def started_agent(
    kit: AgentKit,
    config: Config,
    opening: tuple[str, str, Sequence[Attachment]],
    tools: Sequence[str] | None,
    notes: Sequence[str] | None,
) -> Agent:
    """A new agent holding its task (`opening`: task, context, attachments), ready to
    take its first step; what the agent refuses is a `RelayError`."""
    task, context, files = opening
    try:
        agent = kit.new_agent(config, tools, notes)
        agent.start_with(task, context, files)
    except AgentError as error:
        raise RelayError(str(error)) from error
    return agent
