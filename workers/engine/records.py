"""What Relay keeps about a run, and what the client API shows of it.

All of it is pydantic data, validated whenever it is read back: a corrupt record
fails its own run, not the worker. The events that move a run are in
`workers.engine.events`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, computed_field

from agent_core import Config, Outcome, Risk, Stop
from agent_core.steps import FROZEN
from workers.engine.budget import Budget
from workers.engine.ids import PendingKind

__all__ = [
    "FIXED_FIELDS",
    "RUN_FILTERS",
    "RUN_LISTS",
    "CallTrack",
    "Ending",
    "ForkedFrom",
    "Pending",
    "ReplyStrategy",
    "RunList",
    "RunRecord",
    "RunState",
    "RunStatus",
    "StreamEvent",
    "StreamKind",
    "TraceEntry",
    "Usage",
    "WaitingFor",
    "by_route",
    "ending_of",
    "lists_of",
    "run_list",
]


class Usage(BaseModel):
    """What one model call (or, summed with `+`, many calls) used and cost.

    `cost_micro` is exact, in whole micro-dollars (each call rounded up);
    `cost_usd` shows it in dollars. `unpriced_calls` counts calls to a model
    with no price: they cost 0 here, and `relay show` says "no price".
    """

    model_config = ConfigDict(frozen=True, strict=True)

    prompt_tokens: NonNegativeInt = 0
    completion_tokens: NonNegativeInt = 0
    total_tokens: NonNegativeInt = 0
    cached_prompt_tokens: NonNegativeInt = 0
    """Prompt tokens the server served from its cache (where it says so)."""
    cost_micro: NonNegativeInt = 0
    model_calls: NonNegativeInt = 0
    unpriced_calls: NonNegativeInt = 0

    @computed_field  # type: ignore[prop-decorator]
    @property
    def cost_usd(self) -> float:
        """The cost in dollars (exact to the micro-dollar)."""
        return self.cost_micro / 1_000_000

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            completion_tokens=self.completion_tokens + other.completion_tokens,
            total_tokens=self.total_tokens + other.total_tokens,
            cached_prompt_tokens=self.cached_prompt_tokens + other.cached_prompt_tokens,
            cost_micro=self.cost_micro + other.cost_micro,
            model_calls=self.model_calls + other.model_calls,
            unpriced_calls=self.unpriced_calls + other.unpriced_calls,
        )


RunState = Literal["running", "waiting", "finished"]
Ending = Literal["done", "failed", "cancelled", "declined"]
"""How a finished run ended, in four classes an operator filters by: `done`; `cancelled`
(a person stopped it); `declined` (a person declined its plan); `failed`, every other
stop (the model failed, unusable replies, no progress, a call limit, the budget, ...)."""
RunList = Literal["running", "waiting", "done", "failed", "cancelled", "declined"]
"""The list a run is on: its state while it is not finished, then how it ended. Each is
an index in Redis, so a list filtered by it is read before it is cut to a page."""
RUN_LISTS: tuple[RunList, ...] = ("running", "waiting", "done", "failed", "cancelled", "declined")

RUN_FILTERS = ("running", "waiting", "finished", *RUN_LISTS[2:])
"""What a list of runs can be filtered by: a list, or `finished` (the four endings)."""


def lists_of(state: str) -> tuple[RunList, ...]:
    """The lists a filter by `state` reads (one of RUN_FILTERS; "" for every run: none).

    Raises:
        ValueError: `state` is not one of them.
    """
    if not state:
        return ()
    if state == "finished":
        return RUN_LISTS[2:]
    for which in RUN_LISTS:
        if which == state:
            return (which,)
    raise ValueError(f"a run's state is one of {', '.join(RUN_FILTERS)}, not {state!r}")


_ENDINGS: dict[Stop, Ending] = {
    Stop.DONE: "done",
    Stop.CANCELLED: "cancelled",
    Stop.PLAN_DECLINED: "declined",
}


def ending_of(stop: Stop) -> Ending:
    """The class of a run that stopped with `stop`."""
    return _ENDINGS.get(stop, "failed")


def run_list(state: RunState, outcome: Outcome | None) -> RunList:
    """The list a run in `state` that ended with `outcome` (if it did) is on."""
    if state != "finished":
        return state
    return ending_of(outcome.stop) if outcome is not None else "failed"


WaitingFor = Literal["model", "tools", "children", "plan", "call", "question", "budget", "pause"]
ReplyStrategy = Literal["enqueue", "reject", "interrupt"]
"""What `relay.reply` does when the run is still working: queue the new turn after the
current one, refuse it, or stop the current turn and begin the new one now."""


class CallTrack(BaseModel):
    """The host side of one call of the current batch (`held`: it may run, but the run
    is paused: it is sent when the run is resumed)."""

    model_config = FROZEN
    status: Literal["running", "approval", "child", "held"]
    tool: str
    child: str | None = None
    created_ms: int
    expires_ms: int | None = None
    args: dict[str, Any] | None = None
    """The arguments a person approved it with, edited (None: the model's, unchanged)."""


class ForkedFrom(BaseModel):
    """Where a fork began: the run it was forked from, after how many of its journal steps."""

    model_config = FROZEN
    run: str
    step: NonNegativeInt


class RunRecord(BaseModel):
    """Everything about a run but its agent snapshot (kept beside it)."""

    model_config = FROZEN

    id: str
    parent: str | None = None
    root: str
    ancestors: tuple[str, ...] = ()
    """Every run above this one, the root first; usage rolls up to each of them."""
    parent_call: str | None = None
    """The parent's delegate call this run answers."""
    depth: NonNegativeInt = 0
    task: str
    recipe: str | None = None
    schedule: str | None = None
    fired_ms: int | None = None
    """The firing of `schedule` that started it (its time, UTC ms)."""
    approve_plan: bool = False
    """Its plan is approved when made, by the start (a schedule's `approve_plan`)."""
    on_wait: Literal["wait", "notify", "skip"] = "wait"
    """When it would wait for a person (a schedule's `on_wait`): wait; wait and notify the
    schedule; or skip: decline the call, answer the question, decline the plan. A MONEY
    call always waits."""
    created_ms: int
    updated_ms: int
    finished_ms: int | None = None
    state: RunState = "running"
    waiting_for: WaitingFor | None = None
    seq: NonNegativeInt = 0
    """Counts changes of the agent's state; a model call is for one seq only."""
    asked: int | None = None
    """The seq a model call was sent for (none sent again for the same seq)."""
    pending: tuple[str, ...] = ()
    """Members of the pending index this run holds."""
    calls: dict[str, CallTrack] = Field(default_factory=dict)
    children: tuple[str, ...] = ()
    usage: Usage = Usage()
    """Tokens of this run's own model calls (descendants' are in the totals)."""
    usage_route: str | None = None
    """The one model route that served all of `usage`, while that is so (then
    `usage_by_route` is empty: the record is saved every step, and the same usage twice
    was a sixth of it). Read both through `route_usage`."""
    usage_by_route: dict[str, Usage] = Field(default_factory=dict)
    """This run's own usage, by the model route that served each call, unless
    `usage_route` says it is all on one."""
    key: str | None = None
    """Groups runs for fair shares of the model routes (a tenant, say); children inherit it."""
    app: str | None = None
    """The name of the Relay app that started the run: only its workers run it (None: a run
    from before apps were named in records, which any worker runs)."""
    budget: Budget | None = None
    """What the whole tree may spend, as given at the start (set on the root; children
    draw on it); `relay.extend` raises the limits kept in the root's hash."""
    parked: str | None = None
    """Why the run waits, holding no worker, for a person to extend the tree's budget
    (None: it does not)."""
    asked_bytes: NonNegativeInt = 0
    """The size of the model request asked for (`asked`): what admission reserves for."""
    config: Config
    tools: tuple[str, ...] | None = None
    """The tools this run may use (a recipe's); None: all."""
    verifier_rejections: NonNegativeInt = 0
    unknown_calls: NonNegativeInt = 0
    """Tool calls whose outcome is unknown (a worker died in a call that could not be
    run again): the run went on without knowing what they did."""
    forced_stop: Stop | None = None
    """A stop the host imposed (budget spent, run failed) in place of the agent's CANCELLED."""
    outcome: Outcome | None = None
    paused: bool = False
    """A person paused the run: no new model call, tool call or specialist is sent until
    they resume it."""
    queued: tuple[str, ...] = ()
    """Follow-ups a person sent while the run worked (`enqueue`): the next turns, in order."""
    memory: str | None = None
    """The name its notes are kept under (`Relay.start(memory=...)`), for later runs."""
    kept_note: str | None = None
    """The last note kept (under `memory` or the schedule): a later turn keeps only the
    notes after it."""
    forked_from: ForkedFrom | None = None
    """The run and step this run was forked from (`Relay.fork`); None: started afresh."""
    routes: tuple[str, ...] | None = None
    """The model routes its calls may take, in order (a fork's `route=`); None: all."""
    stubbed: tuple[str, ...] = ()
    """Digests of the tool calls (tool and arguments, `engine.journal.call_digest`) whose
    recorded outcome a fork with `stub_tools` hands back instead of running them."""
    recorded: tuple[str, ...] = ()
    """Tools whose calls never run: each gets the outcome recorded for its arguments
    (`Relay.start(recorded=...)`, an eval's recorded tools), else an error."""

    def route_usage(self) -> dict[str, Usage]:
        """This run's own usage, by the model route that served each call."""
        if self.usage_route is not None:
            return {self.usage_route: self.usage}
        return dict(self.usage_by_route)


def by_route(usage: Usage, usage_by_route: dict[str, Usage]) -> dict[str, Any]:
    """`RunRecord`'s `usage_route` and `usage_by_route` for a run's usage and its split by
    route: the route alone when one served all of it."""
    if len(usage_by_route) == 1:
        ((route, only),) = usage_by_route.items()
        if only == usage:
            return {"usage_route": route, "usage_by_route": {}}
    return {"usage_route": None, "usage_by_route": usage_by_route}


FIXED_FIELDS = frozenset(
    {
        "id", "parent", "root", "ancestors", "parent_call", "depth", "task", "recipe",
        "schedule", "fired_ms", "approve_plan", "on_wait", "created_ms", "key", "app",
        "budget", "config", "tools", "memory", "forked_from", "routes", "stubbed",
        "recorded",
    }
)  # fmt: skip
"""The fields of a `RunRecord` that are set when the run is made and never change (a step
changes only the others: `engine.working.Working.decided`). The store keeps them apart,
written once, so a step does not write the task and config again each time."""


class TraceEntry(BaseModel):
    """One line of a run's trace: the agent's events and the runtime's own."""

    model_config = ConfigDict(frozen=True)
    at_ms: int
    run: str
    kind: str
    text: str = ""
    call_id: str | None = None
    tool: str | None = None
    status: str | None = None
    stop: str | None = None
    data: dict[str, Any] = Field(default_factory=dict)


# --- what the client API shows ------------------------------------------------------


class Pending(BaseModel):
    """Something waiting on a person: a plan, a call or a question."""

    model_config = FROZEN
    kind: PendingKind
    run_id: str
    root_id: str
    call_id: str | None = None
    tool: str | None = None
    summary: str
    args: dict[str, Any] = Field(default_factory=dict)
    risk: Risk | None = None
    created_ms: int
    expires_ms: int | None = None
    seq: int = 0
    """The run's step this is for; a plan or answer decision names it implicitly."""


class RunStatus(BaseModel):
    """A run as the client API shows it."""

    model_config = FROZEN
    id: str
    state: RunState
    waiting_for: WaitingFor | None
    task: str
    parent: str | None
    root: str
    children: tuple[str, ...]
    recipe: str | None
    schedule: str | None
    fired_ms: int | None = None
    """The firing of `schedule` that started it (UTC ms)."""
    usage: Usage
    """This run's own model calls."""
    total_usage: Usage
    """This run's and all its descendants'."""
    created_ms: int
    updated_ms: int
    finished_ms: int | None
    outcome: Outcome | None
    ending: Ending | None = None
    """How it ended, in the four classes of `Ending` (None: it has not)."""
    unknown_calls: int = 0
    """Tool calls of this run whose outcome is unknown (see `RunRecord.unknown_calls`)."""
    pending: tuple[Pending, ...] = ()
    budget: Budget | None = None
    """The whole tree's budget as it stands (extensions included); None: no limits."""
    key: str | None = None
    usage_by_route: dict[str, Usage] = Field(default_factory=dict)
    """This run's own usage, by the model route that served each call."""
    paused: bool = False
    """A person paused it: it sends nothing new until resumed (`waiting_for` is "pause"
    once what was under way is done)."""
    queued: tuple[str, ...] = ()
    """Follow-ups waiting for the current turn to end, in order."""
    forked_from: ForkedFrom | None = None
    """The run and step this run was forked from (`Relay.fork`)."""


StreamKind = Literal["text", "step", "restarted", "done"]


class StreamEvent(BaseModel):
    """One event of a run's live stream (`relay.stream`).

    `kind`: `"text"`, a piece of a model reply as it arrives (the raw reply: feed
    it to `agent_core.FinalStream` for the final answer's text); `"step"`, a model
    call begins its reply (`text` names the call, `m<seq>`): what follows is a new
    reply; `"restarted"`, the same call's reply starts over (its worker died, or
    the server failed mid-reply): forget its text so far; `"done"`, the run
    finished (`text`: its outcome's summary). `run_id` is the run (or specialist)
    it is about; `id` the stream's id of the event, to resume after.
    """

    model_config = FROZEN
    id: str
    kind: StreamKind
    run_id: str
    text: str = ""
