"""The client API to runs that exist: where they are, what waits on a person, the
decisions that wake them, their traces and live streams, steering them, and
cancelling them.

Every method talks to Redis directly and wakes a run with a small `relay.advance`
message; none waits on a worker. A person's steering (`send`, `pause`, `resume`,
`reply`) is an event in the run's inbox, applied once by the run's next step
(`workers.engine.steering` says what each does).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from agent_core import Outcome
from agent_core.text import counted
from workers.engine.budget import Budget
from workers.engine.effects import Message, Outgoing
from workers.engine.events import (
    Answer,
    CallDecision,
    CancelRun,
    FollowUp,
    InboxEvent,
    PauseRun,
    PlanDecision,
    ResumeRun,
    Told,
    expiry_event,
)
from workers.engine.ids import PendingKind, in_tree, model_call, pending_parts
from workers.engine.records import (
    Pending,
    ReplyStrategy,
    RunRecord,
    RunStatus,
    StreamEvent,
    TraceEntry,
    Usage,
    ending_of,
    lists_of,
)
from workers.errors import DecisionRefused, RelayError, RunCorrupt, RunNotFound, WaitTimeout
from workers.settings import Timing, now_ms
from workers.store import reads, scripts
from workers.store.layout import IndexKeys, Keys
from workers.store.live import stream_id
from workers.store.ops import Emit, Steps
from workers.store.runs import RunStore
from workers.store.scripts import Decided, ReplyAnswer

__all__ = [
    "MESSAGE_CHARS",
    "RunsClient",
    "answer_steps",
    "cancel_steps",
    "decide_steps",
    "extend_steps",
    "page_cursor",
    "parse_cursor",
    "plan_steps",
    "reply_steps",
    "status_steps",
    "steer_steps",
    "stream_steps",
    "trace_steps",
    "wait_steps",
    "watch_steps",
]

A = TypeVar("A")

MESSAGE_CHARS = 20_000
"""A person's message or follow-up is cut to this (the agent shows less of it)."""
STRATEGIES = ("enqueue", "reject", "interrupt")


class RunsClient:
    """Reading runs, deciding for them, cancelling them (the Relay's client API)."""

    def __init__(
        self, store: RunStore, send: Callable[[list[Message]], None], timing: Timing
    ) -> None:
        self.store = store
        self._send = send
        self._timing = timing

    def _record(self, run_id: str) -> tuple[RunRecord, Usage]:
        return self._drive(record_steps(self.store.keys, run_id))

    def _drive(self, steps: Steps[A]) -> A:
        """Run a client command's steps on the store's connection, sending the broker
        messages they emit."""
        return self.store.connection.drive(steps, on_emit=self._deliver)

    def _deliver(self, value: object) -> None:
        if isinstance(value, Outgoing):
            self._send(value.messages)

    def held_calls(self, run_id: str) -> list[str]:
        """The run's calls a worker holds now (its lease is live): its model call, its
        tools. A run quiet for a while with one of these is working, not stuck."""
        record, _ = self._record(run_id)
        calls = [c for c, track in record.calls.items() if track.status == "running"]
        if record.asked is not None:
            calls.append(model_call(record.asked))
        if not calls:
            return []
        keys = [self.store.keys.lease(run_id, call) for call in calls]
        with self.store.errors():
            pipe = self.store.redis.pipeline(transaction=False)
            for key in keys:
                pipe.exists(key)
            live = pipe.execute()
        return [call for call, up in zip(calls, live, strict=True) if up]

    def status(self, run_id: str) -> RunStatus:
        """Return where the run is: its state, what it waits for, usage, outcome, children."""
        return self._drive(status_steps(self.store.keys, run_id))

    def extend(self, run_id: str, more: Budget, *, step: int | None = None, by: str = "") -> int:
        """Raise the tree's limits by `more` and let its runs parked at the budget go on;
        return how many runs were woken. A limit the tree never had stays unlimited. The
        runs' traces say it was raised `by` whom (a person's name), and by what.

        With `step`, the raise is the one decision of the wait `run_id` is parked at at
        that step (a person answering what they saw, like an approval): refused, raising
        nothing, once that wait is not pending (raised already, even by a raise sent at
        the same moment), or when the tree would still be full under one of its limits.

        Raises:
            RelayError: `more` raises nothing the tree has a limit for.
            DecisionRefused: (with `step`) the wait is not pending, or the raise leaves
                the tree full (the message says which limit).
            RunNotFound: there is no such run.
        """
        return self._drive(
            extend_steps(self.store.keys, self._due(), run_id, more, step=step, by=by)
        )

    def wait(self, run_id: str, timeout: float = 60.0) -> Outcome:
        """Return the run's outcome once it finishes (a run a reply is on its way to
        finishes again first).

        Raises:
            WaitTimeout: it did not finish within `timeout` seconds.
            RunNotFound: there is no such run.
        """
        return self._drive(wait_steps(self.store.keys, run_id, timeout))

    def pending(self) -> list[Pending]:
        """Return what waits on a person: plans, calls and questions, oldest first."""
        return self.store.people.pending()

    def approve(
        self,
        run_id: str,
        call_id: str,
        yes: bool = True,
        reason: str = "",
        *,
        by: str = "",
        args: dict[str, Any] | None = None,
    ) -> None:
        """Decide a call that waits for approval. Refused unless that call is pending.

        `by` names who decided; the run's trace says so. `args`: approve the call with
        these arguments instead of the model's (checked by `Relay.approve`, which knows
        the tools; the worker checks them again).

        Raises:
            DecisionRefused: the call is not waiting for a decision, was decided
                already, or its time ran out (then it is declined, as the tick would).
            RunNotFound: there is no such run.
        """
        _check_yes(yes)
        if not isinstance(call_id, str):
            raise DecisionRefused(f"a call id is text, got {call_id!r}")
        if args is not None and (not yes or not isinstance(args, dict)):
            raise DecisionRefused("edited arguments are a dict, and go with an approval")
        event = CallDecision(
            call=call_id, yes=yes, reason=str(reason)[:2_000], by=str(by)[:200], args=args
        )
        keys, due = self.store.keys, self._due()
        self._drive(decide_steps(keys, due, run_id, "call", call_id, event=event))

    def deny(self, run_id: str, call_id: str, reason: str = "") -> None:
        """Decline a call that waits for approval (the model is told)."""
        self.approve(run_id, call_id, yes=False, reason=reason)

    def approve_plan(self, run_id: str, yes: bool = True, *, by: str = "") -> None:
        """Decide the plan a run waits on (refused like `approve`)."""
        _check_yes(yes)
        self._drive(plan_steps(self.store.keys, self._due(), run_id, yes, by))

    def answer(self, run_id: str, text: str, *, by: str = "") -> None:
        """Answer the question a run waits on (refused like `approve`; `by`: who answered)."""
        if not isinstance(text, str):
            raise DecisionRefused("an answer must be text")
        self._drive(answer_steps(self.store.keys, self._due(), run_id, text, by))

    def _due(self) -> int:
        """When a woken run's advance is due again, should its message be lost."""
        return now_ms() + self._timing.grace_ms

    def cancel(self, run_id: str, reason: str = "") -> bool:
        """Stop a run (parked or running) and its children; False if it had finished already.

        A run whose record cannot be read is woken too, so it fails and frees what it held.
        """
        return self._drive(cancel_steps(self.store.keys, self._due(), run_id, reason))

    def trace(self, run_id: str) -> list[TraceEntry]:
        """Return the run's trace so far (its own events; children have their own)."""
        return self._drive(trace_steps(self.store.keys, run_id))

    def watch(self, run_id: str, *, timeout: float | None = None) -> Iterator[TraceEntry]:
        """Yield the trace of a run and its descendants as it happens, until the run finishes.

        A run that finished already yields its whole trace, its specialists' included.
        """
        yield from self.store.connection.iterate(watch_steps(self.store.keys, run_id, timeout))

    # --- live: the stream, and steering -------------------------------------------------

    def stream(
        self, run_id: str, after: str = "0", *, timeout: float | None = None
    ) -> Iterator[StreamEvent]:
        """Yield the live events of a run and its specialists, after the event id `after`
        ("0": from the start), until the run finishes (its "done"), or `timeout` passes.

        Pass the last id seen as `after` to resume: nothing is missed (unless the
        reader fell more than STREAM_MAX events behind) and nothing comes twice. A run
        whose stream is gone (its model never streamed, or it finished more than
        STREAM_KEEP_S ago) ends with a "done" of its own, whose id is `after`'s.

        Raises:
            RelayError: `after` is not a stream id.
            RunNotFound: there is no such run.
        """
        steps = stream_steps(self.store.keys, run_id, after, timeout)
        yield from self.store.connection.iterate(steps)

    def send(self, run_id: str, text: str) -> None:
        """Give the run a person's message, shown to the model at its next call (kept while
        the run is parked, on a plan, a call, a question, its budget or a pause).

        Raises:
            DecisionRefused: the run has finished (`reply` starts a new turn).
            RelayError: the message is blank.
            RunNotFound: there is no such run.
        """
        _check_text(text, "a message")
        self._steer(run_id, Told(text=text[:MESSAGE_CHARS]), "send a message to")

    def pause(self, run_id: str) -> bool:
        """Pause the run and its specialists at their next step: no model call, tool call
        or specialist is sent until `resume` (calls under way finish and are applied).
        Returns False if it had finished already."""
        return self._steer(run_id, PauseRun(), "")

    def resume(self, run_id: str) -> bool:
        """Let a paused run go on (what it held is sent); returns False if it had finished."""
        return self._steer(run_id, ResumeRun(), "")

    def _steer(self, run_id: str, event: Told | PauseRun | ResumeRun, refuse: str) -> bool:
        return self._drive(steer_steps(self.store.keys, self._due(), run_id, event, refuse))

    def reply(self, run_id: str, text: str, strategy: ReplyStrategy = "enqueue") -> None:
        """Continue a run with a person's next request: a new turn, with its history.

        A finished run is reopened at once, whatever `strategy`. While it still works:
        `"enqueue"` begins the new turn when this one ends, `"reject"` refuses, and
        `"interrupt"` stops this turn (its calls and specialists, as cancel does) and
        begins the new one now. Only a root run takes a reply (a specialist reports
        to the run that started it). `wait` returns the new turn's outcome. A tree
        past its budget parks (or stops) again at its next model call: `extend` it.

        Raises:
            DecisionRefused: `reject`, and the run is still working (or another
                follow-up is on its way to it).
            RelayError: the text is blank, the strategy unknown, or the run a specialist's.
            RunNotFound: there is no such run.
        """
        self._drive(reply_steps(self.store.keys, self._due(), run_id, text, strategy))

    def memory(self, name: str) -> list[str]:
        """Return the notes kept under a memory's name, oldest first."""
        return self._drive(reads.memory(self.store.keys, name))

    def runs(self, limit: int = 100, state: str = "", before: str = "") -> list[RunStatus]:
        """Return the newest runs first (those not yet expired): those in `state` if given
        (one of RUN_FILTERS), created before the cursor `before` if given (`page_cursor` of
        the last run of the page before).

        Raises:
            ValueError: `state` is no state, or `before` no cursor.
        """
        shards = self.store.shards.all()  # (through this process's cache of listed slots)
        return self._drive(runs_steps(self.store.keys, limit, state, before, shards))

    def count_runs(self, state: str = "") -> int:
        """How many runs are in `state` (all runs if ""), expired ones the tick has not
        pruned yet included."""
        return self.store.count_runs(lists_of(state))


# --- the commands, as steps: written once, driven by RunsClient and AsyncRelay -------------


def record_steps(keys: Keys, run_id: str) -> Steps[tuple[RunRecord, Usage]]:
    """The run's record and usage. Raises RunNotFound (or RunCorrupt)."""
    found = yield from reads.read(keys, run_id)
    if found is None:
        raise RunNotFound(f"no run {run_id!r} (it never existed, or it finished and expired)")
    return found


def outcome_steps(keys: Keys, run_id: str) -> Steps[tuple[RunRecord, bool]]:
    """The run's record, and whether a follow-up is on its way to it (one read)."""
    found = yield from reads.outcome(keys, run_id)
    if found is None:
        raise RunNotFound(f"no run {run_id!r} (it never existed, or it finished and expired)")
    return found


def status_steps(keys: Keys, run_id: str) -> Steps[RunStatus]:
    """Where the run is: its state, what it waits for, usage, outcome, children."""
    record, total = yield from record_steps(keys, run_id)
    pending = yield from reads.pending_of(keys, record.pending)
    budget = yield from budget_steps(keys, record)
    return RunStatus(
        id=record.id,
        state=record.state,
        waiting_for=record.waiting_for,
        task=record.task,
        parent=record.parent,
        root=record.root,
        children=record.children,
        recipe=record.recipe,
        schedule=record.schedule,
        fired_ms=record.fired_ms,
        usage=record.usage,
        total_usage=total,
        budget=budget,
        key=record.key,
        usage_by_route=record.route_usage(),
        created_ms=record.created_ms,
        updated_ms=record.updated_ms,
        finished_ms=record.finished_ms,
        outcome=record.outcome,
        ending=None if record.outcome is None else ending_of(record.outcome.stop),
        unknown_calls=record.unknown_calls,
        pending=tuple(pending),
        paused=record.paused,
        queued=record.queued,
        forked_from=record.forked_from,
    )


def runs_steps(
    keys: Keys,
    limit: int,
    state: str = "",
    before: str = "",
    within: Sequence[IndexKeys] | None = None,
) -> Steps[list[RunStatus]]:
    """The newest runs first, as `RunsClient.runs` lists them (read from the shards
    `within`, default every listed shard); a run that expired since it was listed is
    left out.

    Raises:
        ValueError: `state` is no state, or `before` no cursor.
    """
    lists, cursor = lists_of(state), parse_cursor(before) if before else None
    newest = yield from reads.newest_runs(keys, limit, lists, cursor, within)
    found = []
    for run_id, _ in newest:
        try:
            found.append((yield from status_steps(keys, run_id)))
        except RunNotFound:
            continue
    return found


def budget_steps(keys: Keys, record: RunRecord) -> Steps[Budget | None]:
    """The tree's budget as it stands now (extensions included)."""
    limits = yield from reads.limits(keys, record.root)
    if limits is None:
        return None
    started = record.created_ms
    if record.root != record.id and limits.deadline_ms is not None:
        root = yield from reads.read(keys, record.root)
        started = root[0].created_ms if root is not None else started
    return Budget(
        tokens=limits.tokens,
        usd=None if limits.cost_micro is None else limits.cost_micro / 1_000_000,
        model_calls=limits.model_calls,
        seconds=None if limits.deadline_ms is None else max(limits.deadline_ms - started, 1) / 1000,
    )


def extend_steps(
    keys: Keys, due_ms: int, run_id: str, more: Budget, *, step: int | None = None, by: str = ""
) -> Steps[int]:
    """Raise the tree's limits by `more` and wake its runs parked at the budget; return
    how many were woken (see `RunsClient.extend`). With `step`, the raise answers the
    wait of `run_id` parked at that step, once (checked with the raise, in Redis)."""
    if not isinstance(more, Budget) or more.empty:
        raise RelayError("extend needs a Budget that raises at least one limit")
    record, _ = yield from record_steps(keys, run_id)
    parked = yield from reads.pending_in_tree(keys, record.root, "budget")
    seconds = None if more.seconds is None else int(more.seconds * 1000)
    raise_by = (more.tokens, more.usd_micro, more.model_calls, seconds)
    parked_at = None if step is None else (yield from _parked_at(keys, run_id))
    extend = scripts.extend(
        keys, root=record.root, raise_by=raise_by, parked=parked, due_ms=due_ms,
        answers=None if step is None else (run_id, step), parked_at=parked_at,
        by=by, raised=more.describe(),
    )  # fmt: skip
    extended = yield extend
    if extended is None:
        raise RunNotFound(f"no run {record.root!r} (it never existed, or it finished and expired)")
    if extended.gone:
        raise DecisionRefused(_not_parked(run_id, step))
    if extended.full is not None:
        raise DecisionRefused(_still_full(record.root, more, extended.full))
    if not extended.raised:
        raise RelayError(
            f"the budget of run {record.root} has no limit that {more.describe()} raises"
        )
    woken = sorted({p.run_id for p in parked} | ({run_id} if step is not None else set()))
    yield Emit(Outgoing([Message("advance", woke) for woke in woken]))
    return int(extended.woken)


TRACE_END = 2**53
"""A trace position past any line: reading from it gives the position after the last."""
PARKED_LINES = 50
"""How far back a run's trace is read for the line that says where it parked (a parked
run writes little after it: a person's message, a pause)."""


def _parked_at(keys: Keys, run_id: str) -> Steps[tuple[str, int] | None]:
    """The limit the run is parked at and what its next model call needs under it,
    from the newest `budget` line of its trace (None: not there, or written before it
    said what is needed)."""
    end, _ = yield from reads.trace(keys, run_id, TRACE_END)
    _, lines = yield from reads.trace(keys, run_id, end - PARKED_LINES)
    for line in reversed(lines):
        if line.kind == "budget_extended":
            return None  # (raised since, and not parked again yet: EXTEND refuses it)
        if line.kind == "budget":
            limit, need = line.data.get("limit"), line.data.get("need")
            if isinstance(limit, str) and isinstance(need, int) and need > 0:
                return limit, need
            return None
    return None


def _not_parked(run_id: str, step: int | None) -> str:
    return (
        f"run {run_id} is not parked at its budget at step {step} (any more): its budget"
        " was raised already, or it went on"
    )


def _still_full(root: str, more: Budget, full: tuple[str, int, int, int]) -> str:
    """Why a raise that would leave the tree full under `limit` is refused: what is used
    (or held), the limit after the raise, what the next model call needs under it."""
    limit, used, cap, need = full
    short = used + need - cap
    if limit == "usd":
        what, numbers = "dollars", f"${used / 1e6:,.6f} of ${cap / 1e6:,.6f}"
        needs, least = f"${need / 1e6:,.6f}", f"${short / 1e6:,.6f}"
    else:
        noun = "token" if limit == "tokens" else "model call"
        what, numbers = f"{noun}s", f"{counted(used, noun)} of {cap:,}"
        needs, least = counted(need, noun), counted(short, noun)
    # (a model call needs one model call: said only of tokens and dollars)
    needed = f", and a model call may need {needs}" if limit != "model_calls" else ""
    return (
        f"raising the budget of run {root} by {more.describe()} would still leave it at its"
        f" limit of {what} ({numbers} used or held{needed}): the run would stay parked."
        f" Nothing was raised: it needs at least {least} more"
    )


def wait_steps(keys: Keys, run_id: str, timeout: float) -> Steps[Outcome]:
    """The run's outcome once it finishes (a run a reply is on its way to finishes again
    first). Raises WaitTimeout, RunNotFound."""
    deadline = time.monotonic() + timeout
    cursor = yield from reads.activity_cursor(keys, run_id)
    while True:
        record, reopening = yield from outcome_steps(keys, run_id)
        if record.outcome is not None and not reopening:
            return record.outcome
        left = deadline - time.monotonic()
        if left <= 0:
            raise WaitTimeout(
                f"run {run_id} did not finish within {timeout:g} s (it is {record.state})"
            )
        # Wake when this run's trace grows (the save that ends a run writes a line),
        # and look at the record at least every second whatever else is busy.
        until = time.monotonic() + min(left, 1.0)
        while (now := time.monotonic()) < until:
            block_ms = max(1, int((until - now) * 1000))
            cursor, grew = yield from reads.wait_activity(keys, run_id, cursor, block_ms)
            if run_id in grew:
                break


def decide_steps(
    keys: Keys, due_ms: int, run_id: str, kind: PendingKind, what: str, *, event: InboxEvent
) -> Steps[None]:
    """Apply a decision for a pending entry and wake the run; refused (DecisionRefused)
    unless it is pending, not decided and not expired."""
    named = f"call {what}" if kind == "call" else f"a {kind}"
    decided = yield scripts.decide(
        keys, run_id=run_id, kind=kind, what=what, event=event,
        expired=expiry_event(kind, what), due_ms=due_ms,
    )  # fmt: skip
    if decided in (Decided.APPLIED, Decided.EXPIRED):
        yield Emit(Outgoing([Message("advance", run_id)]))
    if decided is Decided.APPLIED:
        return
    if decided is Decided.GONE:
        yield from record_steps(keys, run_id)  # RunNotFound (or RunCorrupt)
    if decided is Decided.EXPIRED:
        outcome = "declined" if kind != "question" else "left unanswered"
        raise DecisionRefused(
            f"{named} of run {run_id} waited too long: its time ran out before this"
            f" decision, so it was {outcome}"
        )
    if decided is Decided.DECIDED:
        raise DecisionRefused(f"{named} of run {run_id} was decided already")
    raise DecisionRefused(f"{named} of run {run_id} is not waiting for a decision")


def pending_seq_steps(keys: Keys, run_id: str, kind: str) -> Steps[int]:
    """The step of the plan or question the run waits on; DecisionRefused if none."""
    record, _ = yield from record_steps(keys, run_id)
    for member in record.pending:
        _, pending_kind, what = pending_parts(member)
        if pending_kind == kind:
            return int(what)
    state = (
        "finished"
        if record.state == "finished"
        else f"{record.state}, waiting for {record.waiting_for}"
    )
    raise DecisionRefused(f"run {run_id} is not waiting for {kind} ({state})")


def plan_steps(keys: Keys, due_ms: int, run_id: str, yes: bool, by: str) -> Steps[None]:
    """Decide the plan a run waits on."""
    seq = yield from pending_seq_steps(keys, run_id, "plan")
    event = PlanDecision(seq=seq, yes=yes, by=str(by)[:200])
    yield from decide_steps(keys, due_ms, run_id, "plan", str(seq), event=event)


def answer_steps(keys: Keys, due_ms: int, run_id: str, text: str, by: str) -> Steps[None]:
    """Answer the question a run waits on."""
    seq = yield from pending_seq_steps(keys, run_id, "question")
    event = Answer(seq=seq, text=text[:20_000], by=str(by)[:200])
    yield from decide_steps(keys, due_ms, run_id, "question", str(seq), event=event)


def cancel_steps(keys: Keys, due_ms: int, run_id: str, reason: str) -> Steps[bool]:
    """Stop a run and its children; False if it had finished already."""
    try:
        record: RunRecord | None = (yield from record_steps(keys, run_id))[0]
    except RunCorrupt:
        record = None
    if record is not None and record.state == "finished":
        return False
    event = CancelRun(reason=reason[:2_000] or "Cancelled by a person.")
    if not (yield from reads.append(keys, run_id, event, due_ms, cancel_flag=True)):
        raise RunNotFound(f"no run {run_id!r}")
    yield Emit(Outgoing([Message("advance", run_id)]))
    return True


def steer_steps(
    keys: Keys, due_ms: int, run_id: str, event: Told | PauseRun | ResumeRun, refuse: str
) -> Steps[bool]:
    """Append a person's event to a live run's inbox and wake it; False for a finished
    run (or DecisionRefused, naming what was refused, when `refuse` says it)."""
    record, _ = yield from record_steps(keys, run_id)
    if record.state == "finished":
        if refuse:
            raise DecisionRefused(
                f"cannot {refuse} run {run_id}: it has finished (reply to it to go on)"
            )
        return False
    if not (yield from reads.append(keys, run_id, event, due_ms)):
        raise RunNotFound(f"no run {run_id!r}")
    yield Emit(Outgoing([Message("advance", run_id)]))
    return True


def reply_steps(
    keys: Keys, due_ms: int, run_id: str, text: str, strategy: ReplyStrategy
) -> Steps[None]:
    """Continue a run with a person's next request (see `RunsClient.reply`)."""
    _check_text(text, "a reply")
    if strategy not in STRATEGIES:
        raise RelayError(f"strategy is one of {', '.join(STRATEGIES)}, got {strategy!r}")
    event = FollowUp(text=text[:MESSAGE_CHARS], strategy=strategy)
    answer = yield scripts.reply(keys, run_id=run_id, event=event, due_ms=due_ms)
    if answer is ReplyAnswer.SENT:
        yield Emit(Outgoing([Message("advance", run_id)]))
        return
    if answer is ReplyAnswer.BUSY:
        raise DecisionRefused(
            f"run {run_id} is still working: reply with strategy='enqueue' to go on when"
            " it finishes, or 'interrupt' to stop this turn"
        )
    if answer is ReplyAnswer.SPECIALIST:
        raise RelayError(f"run {run_id} is a specialist's: reply to the run that started it")
    yield from record_steps(keys, run_id)  # RunNotFound or RunCorrupt
    raise RunCorrupt(f"run {run_id}: its record cannot be read")


def trace_steps(keys: Keys, run_id: str) -> Steps[list[TraceEntry]]:
    """The run's trace so far (its own events; children have their own)."""
    yield from record_steps(keys, run_id)
    _, lines = yield from reads.trace(keys, run_id)
    return lines


def watch_steps(keys: Keys, run_id: str, timeout: float | None) -> Steps[None]:
    """Emit the trace of a run and its descendants as it happens, until the run finishes."""
    yield from record_steps(keys, run_id)
    deadline = None if timeout is None else time.monotonic() + timeout
    cursor = yield from reads.activity_cursor(keys, run_id)
    positions = {run_id: 0}
    due = {run_id}
    finished = False
    look_again = time.monotonic() + 2.0
    while True:
        while due:  # read every run that grew, and each child as soon as it is named
            run = due.pop()
            positions[run], entries = yield from reads.trace(keys, run, positions[run])
            for entry in entries:
                child = entry.data.get("child") if entry.kind == "child" else None
                if isinstance(child, str) and child not in positions:
                    positions[child] = 0
                    due.add(child)
                yield Emit(entry)
            if run == run_id and entries:  # a reopened run goes on after a "finished"
                finished = entries[-1].kind == "finished"
        if finished or (deadline is not None and time.monotonic() > deadline):
            return
        cursor, grew = yield from reads.wait_activity(keys, run_id, cursor, 500)
        due = grew & positions.keys()
        if time.monotonic() >= look_again:
            # Whatever else is busy (a busy activity stream can drop entries),
            # read every run followed now and then.
            look_again = time.monotonic() + 2.0
            finished = (yield from record_steps(keys, run_id))[0].state == "finished"
            due = set(positions)


def stream_steps(keys: Keys, run_id: str, after: str, timeout: float | None) -> Steps[None]:
    """Emit the live events of a run and its specialists after the id `after` until it
    finishes, or `timeout` passes (see `RunsClient.stream`)."""
    cursor = stream_id(after)
    if cursor is None:
        raise RelayError("after must be a stream id such as '0' or '1700000000000-0'")
    yield from record_steps(keys, run_id)
    deadline = None if timeout is None else time.monotonic() + timeout
    look_again = time.monotonic() + 1.0
    done = False  # the run's last event read is its "done"
    while deadline is None or time.monotonic() < deadline:
        events = yield from reads.live_events(keys, run_id, cursor, 500)
        for event in events:
            cursor = event.id
            if in_tree(event.run_id, run_id):
                yield Emit(event)
            done = event.kind == "done" if event.run_id == run_id else done
        if events and not (done and (yield from _ended_steps(keys, run_id, cursor))):
            continue
        if not done and time.monotonic() < look_again:
            continue
        look_again = time.monotonic() + 1.0
        record, _ = yield from record_steps(keys, run_id)
        if record.outcome is not None and (yield from _ended_steps(keys, run_id, cursor)):
            if not done:  # its stream is gone, or never was
                summary = record.outcome.summary
                yield Emit(StreamEvent(id=cursor, kind="done", run_id=run_id, text=summary))
            return


def _ended_steps(keys: Keys, run_id: str, cursor: str) -> Steps[bool]:
    """Whether the run is finished and its tree's stream holds nothing after `cursor`
    (a follow-up may have reopened it since the "done" read)."""
    if (yield from reads.live_events(keys, run_id, cursor, None)):
        return False
    record, reopening = yield from outcome_steps(keys, run_id)
    return record.state == "finished" and not reopening


def page_cursor(status: RunStatus) -> str:
    """Where a page of runs that ends with `status` ends: `before=` of the next page."""
    return f"{status.created_ms}:{status.id}"


def parse_cursor(text: str) -> tuple[int, str]:
    """The (created ms, run id) of a page cursor.

    Raises:
        ValueError: it is not one.
    """
    created, _, run_id = text.partition(":")
    if not (created.isascii() and created.isdigit() and len(created) <= 16 and run_id):
        raise ValueError(f"a page cursor is <created ms>:<run id>, not {text[:80]!r}")
    return int(created), run_id


def _check_yes(yes: object) -> None:
    # bool("no") is True: a decision must be a real bool, never a guess.
    if not isinstance(yes, bool):
        raise DecisionRefused(f"a decision is True or False, got {yes!r}")


def _check_text(text: object, what: str) -> None:
    if not isinstance(text, str) or not text.strip():
        raise RelayError(f"{what} must be non-empty text")
