"""What `Relay.start` and `Relay(...)` are handed, checked before anything is written,
and the new run's record and agent.

Each refusal is one `RelayError` line naming what is wrong.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, ValidationError

from agent_core import Agent, Attachment, Config, Policy, Tool, ToolArgsError, ToolOutput
from agent_core.args import check_args
from agent_core.errors import AgentError
from workers.engine.budget import Budget, Price
from workers.engine.effects import Message, Outgoing
from workers.engine.journal import any_call_digest, call_digest, start_text
from workers.engine.records import RunRecord
from workers.errors import RelayError
from workers.kit.agents import AgentKit
from workers.settings import now_ms
from workers.store import reads
from workers.store.layout import Keys
from workers.store.ops import Emit, Steps

__all__ = [
    "MAX_ATTACHMENT_BYTES",
    "MAX_TASK_CHARS",
    "NewRun",
    "Recorded",
    "check_memory",
    "check_start",
    "checked_concurrency",
    "checked_key",
    "checked_many",
    "checked_prices",
    "new_run",
    "recorded_stubs",
    "start_budget",
    "start_steps",
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


class Unattended(NamedTuple):
    """How a run a schedule started decides without a person (see `RunRecord`)."""

    fired_ms: int | None = None
    approve_plan: bool = False
    on_wait: Literal["wait", "notify", "skip"] = "wait"


def with_policy(config: Config, policy: object) -> Config:
    """`config` with `policy` in place of its own (None: as it is).

    Raises:
        RelayError: `policy` is not an agent_core.Policy.
    """
    if policy is None:
        return config
    if not isinstance(policy, Policy):
        raise RelayError(f"policy must be an agent_core.Policy, not {policy!r}")
    return config.model_copy(update={"policy": policy})


def checked_on_wait(given: object) -> Literal["wait", "notify", "skip"]:
    """A start's `on_wait`, as given.

    Raises:
        RelayError: it is not "wait", "notify" or "skip".
    """
    if given == "wait" or given == "notify" or given == "skip":  # noqa: PLR1714 - narrows
        return given
    raise RelayError(f"on_wait is 'wait', 'notify' or 'skip', not {given!r}")


def checked_many(tasks: object, options: Mapping[str, object]) -> list[str]:
    """The tasks `start_many` was given, as a list (each is checked as `start` checks it).

    Raises:
        RelayError: not a list of tasks (a string would start a run a character), or
            `run_id` given (one id cannot name many runs).
    """
    if isinstance(tasks, str | bytes) or not isinstance(tasks, Sequence):
        raise RelayError(f"start_many takes a list of tasks, not {type(tasks).__name__}")
    if options.get("run_id") is not None:
        raise RelayError("start_many takes no run_id: each run gets an id of its own")
    return list(tasks)


def check_memory(name: object) -> str:
    """A memory's name: 1 to 200 printable characters."""
    if not isinstance(name, str) or not name.strip() or len(name) > 200 or not name.isprintable():
        raise RelayError(f"a memory is named by 1 to 200 printable characters, got {name!r}")
    return name


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


class Recorded(BaseModel):
    """A recorded outcome of a tool: what its call with `args` returns (None: with any
    arguments not recorded otherwise). A run started with recorded tools never runs them."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    output: str
    args: dict[str, object] | None = None
    error: bool = False
    """The outcome is an error the model is told (the tool failed)."""


def recorded_stubs(
    recorded: Mapping[str, Sequence[Recorded]] | None, tools: Mapping[str, Tool]
) -> tuple[tuple[str, ...], dict[str, str]]:
    """The recorded tools' names, and their outcomes by call digest (for CREATE): each
    recording's arguments checked against its tool as a model's call's are, so a call
    with the same arguments has the same digest."""
    if not recorded:
        return (), {}
    if not isinstance(recorded, Mapping):
        raise RelayError("recorded maps tool names to lists of Recorded outcomes")
    stubs: dict[str, str] = {}
    for name, outcomes in recorded.items():
        tool = tools.get(name)
        if tool is None:
            raise RelayError(f"recorded: no tool named {name!r}")
        for one in outcomes:
            if not isinstance(one, Recorded):
                raise RelayError(f"recorded {name}: each outcome is a Recorded")
            output = ToolOutput.error(one.output) if one.error else ToolOutput.ok(one.output)
            stubs.setdefault(_recorded_digest(tool, one.args), output.model_dump_json())
    return tuple(recorded), stubs


def _recorded_digest(tool: Tool, args: dict[str, object] | None) -> str:
    if args is None:
        return any_call_digest(tool.name)
    try:
        return call_digest(tool.name, check_args(tool, dict(args)))
    except ToolArgsError as error:
        raise RelayError(f"recorded {tool.name}: {error}") from None


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


class NewRun(NamedTuple):
    """A run to create: its record, its started agent's snapshot, its journal's start."""

    record: RunRecord
    snapshot: str
    start: str


def new_run(
    kit: AgentKit,
    task: str,
    context: str,
    config: Config,
    *,
    attachments: Iterable[Attachment] | None,
    budget: Budget | int | None,
    tools: Sequence[str] | None,
    notes: Sequence[str] | None,
    recipe: str | None,
    schedule: str | None,
    run_id: str | None,
    key: str | None,
    memory: str | None,
    remembered: Callable[[str], list[str]],
    app: str,
    routes: tuple[str, ...] | None = None,
    recorded: tuple[str, ...] = (),
    unattended: Unattended | None = None,
) -> NewRun:
    """Check what a start was given; return the new root run's record (its id made up
    unless given), its started agent's snapshot and its journal's start. With `memory`,
    the agent is shown the notes `remembered(memory)` returns, then `notes`. The run is
    `app`'s: only workers of the Relay app of that name run it. `routes`: the model
    routes its calls may take; `recorded`: the tools whose outcomes are recorded;
    `unattended`: how a schedule's run decides without a person.

    Raises:
        RelayError: something given is refused (one line saying what).
    """
    if memory is not None:
        notes = [*remembered(check_memory(memory)), *(notes or ())]
    files = check_start(task, attachments, tools, run_id, known=kit.names())
    limits = start_budget(budget)
    agent = started_agent(kit, config, (task, context, files), tools, notes)
    run_id = run_id or secrets.token_hex(8)
    now = now_ms()
    record = RunRecord(
        id=run_id,
        root=run_id,
        task=task[:2_000],
        recipe=recipe,
        schedule=schedule,
        **(unattended or Unattended())._asdict(),
        created_ms=now,
        updated_ms=now,
        config=config,
        tools=tuple(tools) if tools is not None else None,
        budget=limits,
        key=checked_key(key) or app or None,  # as the README says: the app's name by default
        memory=memory,
        app=app,
        routes=routes,
        recorded=recorded,
    )
    snapshot = agent.snapshot()
    offered = agent.offered()
    return NewRun(record, snapshot, start_text(record, snapshot, offered, kit.idempotent(offered)))


@dataclass(frozen=True)
class PreparedRun:
    """A run made but not yet stored: what CREATE takes (`Relay.prepare_run`)."""

    record: RunRecord
    snapshot: str
    start: str
    """The journal's first entry."""
    stubs: dict[str, str]
    due_ms: int
    """When its first advance is due again, should the message be lost."""
    named: bool
    """Its id was given: a start whose run exists already returns that id."""


def start_steps(
    keys: Keys, made: PreparedRun, *, enlisted: Callable[[str], None] | None = None
) -> Steps[str]:
    """Store the run and send its first advance; return its id (steps: any transport).
    `enlisted(run_id)` lists its slot through a sync store's cache (None: the steps do).

    Raises:
        RelayError: a run with its (random) id exists already.
    """
    record = made.record
    if enlisted is not None:
        enlisted(record.id)
    created = yield from reads.create(
        keys, record, made.snapshot, made.due_ms, stubs=made.stubs, start=made.start,
        enlist=enlisted is None,
    )  # fmt: skip
    if not created and not made.named:  # 64 random bits: never
        raise RelayError(f"a run with id {record.id} exists already")
    if created:
        yield Emit(Outgoing([Message("advance", record.id)]))
    return record.id
