"""The Lua scripts that make each multi-key change atomic: one typed call per script.

Each script lives in `workers/store/lua/<name>.lua`, headed by its KEYS, ARGV
and answers. Here each has one function with named parameters that spells its
KEYS and ARGV (from the key map, `workers.store.layout`) and reads its answer
into a named value (`ClaimStatus`, `Saved`, `Admitted`, ...): no positional list
and no 1/0/-1 leaks past this module. `Connection.run` runs the call.

    run state     CREATE, LOAD, CLAIM, RENEW, UNCLAIM, RECORD, SAVE, SAVE_CLAIM, TRACE,
                  READ_TRACE
    people        DECIDE, EXTEND
    live runs     STREAM, REPLY
    the fleet     TICK_LOCK, SWEEP (a cluster's shards, one node at a time)
    model routes  ROUTE_ADMIT, ROUTE_DONE
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from importlib.resources import files
from typing import Any, Generic, Literal, TypeVar

from agent_core import Stop
from workers.engine.budget import Admission, Over
from workers.engine.effects import Advanced, OwnOutcome
from workers.engine.events import BudgetExtended, FollowUp, InboxEvent
from workers.engine.ids import OutboxMember, PendingKind, pending_member, root_of
from workers.engine.journal import JOURNAL_MAX
from workers.engine.records import RUN_LISTS, Pending, RunRecord, ending_of, run_list
from workers.store import codec
from workers.store.codec import StoredRun, as_text, fixed_json, record_json
from workers.store.layout import TRACE_MAX, IndexKeys, Keys, RunFields

__all__ = [
    "Admitted",
    "ClaimAnswer",
    "ClaimStatus",
    "Decided",
    "Extended",
    "Recorded",
    "ReplyAnswer",
    "Saved",
    "ScriptCall",
    "Swept",
    "claim",
    "create",
    "decide",
    "extend",
    "load",
    "lua",
    "read_trace",
    "record",
    "relist",
    "renew",
    "reply",
    "resent",
    "route_admit",
    "route_done",
    "save",
    "save_claim",
    "stream",
    "sweep",
    "tick_lock",
    "trace",
    "unclaim",
]

A = TypeVar("A")


@dataclass(frozen=True)
class ScriptCall(Generic[A]):
    """One call of the script `name`: its KEYS and ARGV, and how to read its answer."""

    name: str
    keys: list[str]
    args: list[Any]
    read: Callable[[Any], A]


def lua(name: str) -> str:
    """Return the source of the script `workers/store/lua/<name>.lua`, each of its
    `--# <other>` lines replaced by the script `<other>` as a local function of its own
    KEYS and ARGV (so SAVE_CLAIM runs SAVE and CLAIM as written, not copies of them)."""
    source = files("workers.store").joinpath("lua", f"{name}.lua").read_text(encoding="utf-8")
    return _CONSTANT.sub(_constant, _INCLUDE.sub(_included, source))


_INCLUDE = re.compile(r"^--# (\w+)$", re.MULTILINE)
_CONSTANT = re.compile(r"\$\{(\w+)\}")
_CONSTANTS = {"TRACE_MAX": TRACE_MAX, "JOURNAL_MAX": JOURNAL_MAX}
"""Limits a script keeps, written in where it says `${NAME}`: one value for Python and Lua,
and not sent with every call."""


def _constant(name: re.Match[str]) -> str:
    return str(_CONSTANTS[name.group(1)])


def _included(line: re.Match[str]) -> str:
    other = line.group(1)
    return f"local function {other}(KEYS, ARGV)\n{lua(other)}end"


# --- answers ----------------------------------------------------------------------------


class ClaimStatus(StrEnum):
    """What CLAIM found."""

    CLAIMED = "claimed"
    """The lease is ours: make the call."""
    GONE = "gone"
    """There is no such run."""
    DONE = "done"
    """The call's outcome is recorded already: only the run needs advancing."""
    REFUSED = "refused"
    """The run's record does not call for it: a forged, replayed or early message."""
    BUSY = "busy"
    """Another worker holds the call's lease."""


@dataclass(frozen=True)
class ClaimAnswer:
    """CLAIM's answer: the status, the attempts so far, the limit a model call was not
    admitted under (if any), and the run as it stands when claimed."""

    status: ClaimStatus
    attempts: int
    over: Over | None
    reply_cap: int
    """A model call's `max_tokens`: the tree's room, if less than asked (0: no cap)."""
    run: StoredRun | None
    task_before: str = ""
    """The Celery task that carried the claim before this one ("" if none, or unknown)."""


class Saved(StrEnum):
    """What SAVE did."""

    SAVED = "saved"
    STALE = "stale"
    """Someone saved first: reload and try again."""
    DUPLICATE = "duplicate"
    """The call saving its own outcome finds it recorded already."""
    FENCED = "fenced"
    """The call saving its own outcome lost it to a later attempt."""


class Recorded(StrEnum):
    """What RECORD did."""

    ADVANCE = "advance"
    """Recorded, and the run should advance now."""
    WAITING = "waiting"
    """Recorded; other calls of the batch are still out."""
    DUPLICATE = "duplicate"
    """It was recorded before."""
    FENCED = "fenced"
    """Another attempt took the call over: this outcome is not taken."""
    GONE = "gone"
    """There is no such run."""


class Renewed(StrEnum):
    """What RENEW did."""

    KEPT = "kept"
    CANCELLED = "cancelled"
    """Kept, but the run was cancelled: the call should stop."""
    LOST = "lost"
    """Another attempt took the call over, its outcome is in, or its turn was stopped."""


class Decided(StrEnum):
    """What DECIDE did."""

    APPLIED = "applied"
    EXPIRED = "expired"
    """Too late: the entry's time ran out, and the expiry was applied instead."""
    DECIDED = "decided"
    """Decided already."""
    NOT_PENDING = "not_pending"
    GONE = "gone"


class ReplyAnswer(StrEnum):
    """What REPLY did with a follow-up."""

    SENT = "sent"
    BUSY = "busy"
    """`reject`, and the run still works (or another follow-up is on its way)."""
    SPECIALIST = "specialist"
    """The run is a specialist's: only a root takes a follow-up."""
    CORRUPT = "corrupt"
    GONE = "gone"


@dataclass(frozen=True)
class Extended:
    """EXTEND's answer: whether a limit was raised, and how many parked runs woke; for a
    raise that names its wait, `gone` (the wait is no longer pending) or `full` (the
    limit the tree would still be full under: tokens, usd or model_calls, with what is
    used and held, the limit after the raise and what a model call needs under it), and
    then nothing was raised."""

    raised: bool
    woken: int
    gone: bool = False
    full: tuple[str, int, int, int] | None = None


@dataclass(frozen=True)
class Admitted:
    """What a route said to a call: admitted now, or when to ask again (and why not)."""

    verdict: Literal["admitted", "paused", "open", "wait", "left"]
    at_ms: int
    """admitted: 1 if the call is the circuit's probe; else when to ask again."""
    charged: int = 0
    """admitted: the tokens charged to the route's tokens per minute, for `route_done`."""

    @property
    def admitted(self) -> bool:
        return self.verdict == "admitted"


@dataclass(frozen=True)
class Swept:
    """SWEEP's answer: (member, score) pairs, and the shard keys the node did not serve."""

    found: list[tuple[str, float]]
    missed: list[str]


def _word(answer: Any) -> str:
    return as_text(answer)


# --- run state --------------------------------------------------------------------------


def create(
    keys: Keys,
    *,
    record: RunRecord,
    head: str,
    history: Sequence[str],
    agent_start: str,
    due_ms: int,
    start: str,
    stubs: Mapping[str, str] | None = None,
) -> ScriptCall[bool]:
    """CREATE the run (its snapshot as `head`, `agent_start` and `history` entries, its
    journal's `start`, its advance due at `due_ms`, its budget as its tree's limits; a
    fork's `stubs`, call digest -> ToolOutput JSON); True if made, False if it existed."""
    index = keys.index(record.id)
    script_keys = [keys.run(record.id), index.runs, index.outbox, index.deadlines]
    script_keys += [keys.history(record.id), index.listed(run_list(record.state, record.outcome))]
    script_keys.append(keys.journal(record.id))
    stubbed = {RunFields.stub(digest): output for digest, output in (stubs or {}).items()}
    args: list[Any] = [record.id, record_json(record), head, record.created_ms]
    args += [OutboxMember.advance(record.id), due_ms, *_limits(record), start]
    args += [json.dumps(stubbed) if stubbed else "", fixed_json(record), agent_start, *history]
    return ScriptCall("create", script_keys, args, lambda answer: _word(answer) == "created")


def _limits(record: RunRecord) -> list[str | int]:
    """The tree limits a new root's budget sets, in CREATE's order ('' for none)."""
    budget = record.budget
    if budget is None:
        return ["", "", "", ""]
    deadline = None if budget.seconds is None else record.created_ms + int(budget.seconds * 1000)
    values = (budget.tokens, budget.usd_micro, budget.model_calls, deadline)
    return ["" if value is None else value for value in values]


def load(keys: Keys, *, run_id: str, known_version: str) -> ScriptCall[StoredRun]:
    """LOAD the run, leaving its snapshot out if it is still at `known_version`."""
    script_keys = [keys.run(run_id), keys.history(run_id), keys.inbox(run_id)]
    return ScriptCall("load", script_keys, [known_version], lambda answer: StoredRun(*answer))


def claim(
    keys: Keys,
    *,
    run_id: str,
    call: str,
    seq: int | None,
    token: str,
    lease_ms: int,
    now_ms: int,
    admission: Admission,
    known_version: str,
    task: str = "",
) -> ScriptCall[ClaimAnswer]:
    """CLAIM call `call` of the run (a tool call; with `seq`, the model call `m<seq>`,
    admitted against its tree's budget), carried by the Celery task `task`; the run comes
    back when claimed, with the task of the claim before."""
    script_keys = [keys.run(run_id)]
    if keys.cluster:  # (a single Redis's CLAIM spells the others from the run's key)
        root = root_of(run_id)
        script_keys += [keys.lease(run_id, call), keys.index(run_id).outbox, keys.run(root)]
        script_keys += [keys.inbox(run_id), keys.history(run_id)]
    args: list[Any] = [call, "tool" if seq is None else "model", seq or 0, token, lease_ms]
    args += [now_ms + lease_ms, run_id, admission.max_tokens]  # (its outbox member: spelled)
    args += [admission.input_micro, admission.output_micro, known_version, task]

    def read(answer: Any) -> ClaimAnswer:
        status, attempts, over, cap, *run, before, fixed, start, loops = answer
        claimed = ClaimStatus(as_text(status))
        stored = (
            StoredRun._make([*run, fixed, start, loops]) if claimed is ClaimStatus.CLAIMED else None
        )
        over_limit, task_before = _over(as_text(over)), as_text(before)
        return ClaimAnswer(claimed, int(attempts), over_limit, int(cap), stored, task_before)

    return ScriptCall("claim", script_keys, args, read)


def _over(text: str) -> Over | None:
    """The limit in CLAIM's `over` ("limit|spent|reserved|cap|estimate", or "deadline")."""
    if not text:
        return None
    limit, *numbers = text.split("|")
    values = [int(float(n)) for n in numbers] + [0, 0, 0, 0]
    return Over(limit, *values[:4])


def renew(
    keys: Keys,
    *,
    run_id: str,
    call: str,
    attempt: int,
    member: str,
    token: str,
    lease_ms: int,
    now_ms: int,
) -> ScriptCall[Renewed]:
    """RENEW the lease of call `call`, and tell whether its run was cancelled meanwhile (one
    round trip for both, which a loop renewing hundreds of leases a period needs)."""
    script_keys = [keys.lease(run_id, call), keys.index(run_id).outbox, keys.run(run_id)]
    args = [token, lease_ms, member, now_ms + lease_ms, call, attempt]
    return ScriptCall("renew", script_keys, args, lambda answer: Renewed(_word(answer)))


def unclaim(
    keys: Keys, *, run_id: str, call: str, attempt: int, token: str, member: str, due_ms: int
) -> ScriptCall[bool]:
    """UNCLAIM a call that never started; True if the claim was still ours to give back."""
    script_keys = [keys.run(run_id), keys.lease(run_id, call), keys.index(run_id).outbox]
    args = [call, attempt, token, member, due_ms]
    return ScriptCall("unclaim", script_keys, args, lambda answer: _word(answer) == "given_back")


def record(
    keys: Keys,
    *,
    run_id: str,
    call: str,
    event: InboxEvent,
    attempt: int,
    member: str,
    token: str,
    due_ms: int,
    counted: bool,
) -> ScriptCall[Recorded]:
    """RECORD a call's outcome in the run's inbox, fenced by `attempt` (a `counted`
    outcome, a tool's, counts down its batch)."""
    script_keys = [keys.run(run_id), keys.inbox(run_id), keys.index(run_id).outbox]
    script_keys.append(keys.lease(run_id, call))
    args = [call, event.model_dump_json(), member, OutboxMember.advance(run_id), due_ms]
    args += [token, "1" if counted else "0", attempt]
    return ScriptCall("record", script_keys, args, lambda answer: Recorded(_word(answer)))


def save(
    keys: Keys, *, advanced: Advanced, version: str, own: OwnOutcome | None
) -> ScriptCall[Saved]:
    """SAVE a step if the run is still at `version`: its record, snapshot and effects
    (`codec.save_effects`), with `own`, the calling task's own outcome."""
    run_id = advanced.record.id
    script_keys = [keys.run(run_id)]
    if keys.cluster:  # (a single Redis's SAVE spells the others from the run's key)
        index = keys.index(run_id)
        script_keys += [keys.inbox(run_id), keys.trace(run_id), index.outbox, index.pending]
        script_keys += [index.pending_data, index.runs, keys.history(run_id)]
        script_keys.append(keys.journal(run_id))
    if advanced.stored is None and not advanced.snapshot:  # (a caller's bug: never store it)
        raise ValueError(f"run {run_id}: a step with neither a snapshot nor what to store")
    stored = advanced.stored or codec.whole(advanced.snapshot)
    effects = codec.save_effects(keys, advanced, own)
    # (Trace lines are arguments of their own, not strings inside the effects JSON:
    # escaped there, each quote cost a byte more, and SAVE decoded them for nothing.)
    trace = [codec.trace_line(t, run_id) for t in advanced.effects.trace]
    args: list[Any] = [version, record_json(advanced.record), stored.head, effects]
    args += [stored.drop, 1 if stored.rewrite else 0, advanced.effects.journal or ""]
    args += [codec.claimable(advanced.record), len(trace), *trace, *stored.append]
    return ScriptCall("save", script_keys, args, lambda answer: Saved(_word(answer)))


def save_claim(
    save_call: ScriptCall[Saved], claim_call: ScriptCall[ClaimAnswer]
) -> ScriptCall[tuple[Saved, ClaimAnswer | None]]:
    """SAVE_CLAIM: `save_call` (a SAVE), then, if it saved, `claim_call` (a CLAIM of the
    same run), in one script: (what SAVE did, CLAIM's answer if it ran)."""
    assert save_call.name == "save"
    assert claim_call.name == "claim"
    # CLAIM's keys that SAVE has (the run's hash, and on a cluster its outbox, inbox and
    # history) are sent once.
    script_keys = list(save_call.keys)
    for key in claim_call.keys:
        if key not in script_keys:
            script_keys.append(key)
    where = " ".join(str(script_keys.index(key) + 1) for key in claim_call.keys)
    sizes = f"{len(save_call.keys)} {len(save_call.args)}"
    args: list[Any] = [sizes, where, *save_call.args, *claim_call.args]

    def read(answer: Any) -> tuple[Saved, ClaimAnswer | None]:
        saved = Saved(_word(answer[0]))
        return saved, claim_call.read(answer[1]) if saved is Saved.SAVED else None

    return ScriptCall("save_claim", script_keys, args, read)


def trace(keys: Keys, *, run_id: str, lines: Sequence[str], keep: int) -> ScriptCall[bool]:
    """TRACE: add `lines` to the run's trace (keeping the newest `keep`); False if no run."""
    script_keys = [keys.run(run_id), keys.trace(run_id), keys.index(run_id).activity]
    args: list[Any] = [run_id, keep, *lines]
    return ScriptCall("trace", script_keys, args, lambda answer: _word(answer) == "added")


def read_trace(keys: Keys, *, run_id: str, start: int) -> ScriptCall[tuple[int, list[Any]]]:
    """READ_TRACE: (the position after the last line, the lines from `start` on)."""
    script_keys = [keys.run(run_id), keys.trace(run_id)]
    return ScriptCall(
        "read_trace", script_keys, [max(0, start)], lambda answer: (int(answer[0]), answer[1])
    )


# --- people -------------------------------------------------------------------------------


def decide(
    keys: Keys,
    *,
    run_id: str,
    kind: PendingKind,
    what: str,
    event: InboxEvent,
    expired: InboxEvent,
    due_ms: int,
) -> ScriptCall[Decided]:
    """DECIDE the pending entry (`kind`, `what`) of the run with `event`, or with
    `expired` (the event for "no decision in time") when it came too late: after its
    expiry by Redis's clock."""
    index = keys.index(run_id)
    script_keys = [keys.run(run_id), keys.inbox(run_id), index.outbox, index.pending]
    script_keys.append(index.pending_data)
    args: list[Any] = [pending_member(run_id, kind, what), RunFields.decision(kind, what)]
    args += [event.model_dump_json(), OutboxMember.advance(run_id), due_ms]
    args.append(expired.model_dump_json())
    return ScriptCall("decide", script_keys, args, lambda answer: Decided(_word(answer)))


_FULL_LIMITS = {1: "tokens", 2: "usd", 3: "model_calls"}
"""EXTEND's numbers for the limits of a tree's budget."""
_LIMIT_NUMBERS = {name: str(number) for number, name in _FULL_LIMITS.items()}


def extend(
    keys: Keys,
    *,
    root: str,
    raise_by: tuple[int | None, int | None, int | None, int | None],
    parked: Sequence[Pending],
    due_ms: int,
    answers: tuple[str, int] | None = None,
    parked_at: tuple[str, int] | None = None,
    by: str = "",
    raised: str = "",
) -> ScriptCall[Extended | None]:
    """EXTEND the tree's limits (tokens, micro-dollars, model calls, deadline ms; None:
    leave it) and wake the runs `parked` at its budget; None if there is no root. A raise
    that `answers` one wait (a person's form: the run and the step it is parked at) is
    refused once that wait is not pending, or when the tree would stay full (see
    extend.lua; `parked_at`: the limit that run parked at and what its next model call
    needs under it, if known): decided there, not here, so two sent at once cannot both
    pass. Each woken run is told `by` whom and what was `raised` (in words)."""
    index = keys.index(root)
    script_keys = [keys.run(root), index.deadlines, index.pending, index.pending_data]
    script_keys.append(index.outbox)
    args: list[Any] = ["" if n is None else n for n in raise_by]
    waits = {(entry.run_id, entry.seq) for entry in parked}
    if answers is not None:
        waits.add(answers)  # (parked since the tree's waits were read: woken all the same)
    named = "" if answers is None else pending_member(answers[0], "budget", str(answers[1]))
    limit, need = parked_at or ("", 0)
    args += [root, due_ms, named, _LIMIT_NUMBERS.get(limit, ""), need]
    for run_id, step in sorted(waits):
        seq = str(step)
        script_keys += [keys.run(run_id), keys.inbox(run_id)]
        args += [pending_member(run_id, "budget", seq), RunFields.decision("budget", seq)]
        args += [BudgetExtended(seq=step, by=by, raised=raised).model_dump_json()]
        args += [OutboxMember.advance(run_id)]

    def read(answer: Any) -> Extended | None:
        raised, woken, *numbers = (int(n) for n in answer)
        if raised == -1:
            return None
        if raised == -2:
            return Extended(False, 0, gone=True)
        if raised == -3:
            used, cap, need = numbers
            return Extended(False, 0, full=(_FULL_LIMITS[woken], used, cap, need))
        return Extended(bool(raised), woken)

    return ScriptCall("extend", script_keys, args, read)


# --- live runs ------------------------------------------------------------------------------


def stream(
    keys: Keys,
    *,
    run_id: str,
    events: Sequence[tuple[str, str]],
    keep: int,
    idle_s: int,
) -> ScriptCall[bool]:
    """STREAM (kind, text) events of `run_id` into its tree's live stream, keeping about
    `keep` entries for `idle_s`; False if the root finished (nothing was written)."""
    root = root_of(run_id)
    args: list[Any] = [keep, idle_s, run_id]
    for kind, text in events:
        args += [kind, text]
    # (A single Redis's STREAM spells the live stream's key from the root's.)
    script_keys = [keys.run(root), keys.live(root)] if keys.cluster else [keys.run(root)]
    return ScriptCall("stream", script_keys, args, lambda answer: _word(answer) == "added")


def reply(keys: Keys, *, run_id: str, event: FollowUp, due_ms: int) -> ScriptCall[ReplyAnswer]:
    """REPLY: put a follow-up in a root run's inbox, unless its strategy refuses."""
    script_keys = [keys.run(run_id), keys.inbox(run_id), keys.index(run_id).outbox]
    args = [event.model_dump_json(), event.strategy, OutboxMember.advance(run_id), due_ms]
    return ScriptCall("reply", script_keys, args, lambda answer: ReplyAnswer(_word(answer)))


# --- the fleet ------------------------------------------------------------------------------


def tick_lock(
    keys: Keys, *, holder: str, interval_ms: int, now_ms: int, settle_ms: int
) -> ScriptCall[int]:
    """TICK_LOCK: 0 if `holder` ticks now, else the ms until the lock lapses (after a gap
    of two intervals without a tick, the lock is first kept `settle_ms` by nobody)."""
    script_keys = [keys.tick_lock, keys.tick_stats]
    return ScriptCall("tick_lock", script_keys, [holder, interval_ms, now_ms, settle_ms], int)


def relist(keys: Keys, *, shard: IndexKeys, runs: Sequence[tuple[str, int]]) -> ScriptCall[int]:
    """RELIST the runs `runs` ((id, created ms), all of `shard`): each on the list its
    record says, off the others; how many were listed (a run gone is not)."""
    how = {
        "lists": list(RUN_LISTS),
        "endings": {stop.value: ending_of(stop) for stop in Stop},
    }
    script_keys = [*shard.lists, *(keys.run(run_id) for run_id, _ in runs)]
    args: list[Any] = [json.dumps(how)]
    for run_id, created in runs:
        args += [run_id, created]
    return ScriptCall("relist", script_keys, args, int)


def resent(
    keys: Keys, *, run_id: str, call: str, lost: int, line: str, taken: bool
) -> ScriptCall[bool]:
    """RESENT: add `line` (a `resent` trace line) to the run's trace if attempt `lost` of
    `call` was lost and it was not said yet: from the tick (`taken` False), the attempt is
    still the last, with no outcome and no lease; from the worker that claimed the next
    (`taken`), that one is the last."""
    script_keys = [keys.run(run_id), keys.trace(run_id), keys.index(run_id).activity]
    script_keys.append(keys.lease(run_id, call))
    args: list[Any] = [run_id, call, lost, TRACE_MAX, line, 1 if taken else 0]
    return ScriptCall("resent", script_keys, args, lambda answer: int(answer) == 1)


def sweep(
    *, mode: Literal["due", "newest"], low: str, high: str, limit: int, shards: Sequence[str]
) -> ScriptCall[Swept]:
    """SWEEP the sorted sets `shards` of one node: "due", each one's lowest scores from
    `low` to `high`; "newest", its highest (at most `limit` each)."""
    keys = list(shards)

    def read(answer: Any) -> Swept:
        entries, lost = answer
        found = [(as_text(entries[i]), float(entries[i + 1])) for i in range(0, len(entries), 2)]
        return Swept(found, [keys[int(position) - 1] for position in lost])

    return ScriptCall("sweep", [], [mode, low, high, limit, *keys], read)


# --- model routes -----------------------------------------------------------------------------


def _route_keys(keys: Keys, route: str, key: str, parts: Sequence[str]) -> list[str]:
    """The route's hash and the key's calls in flight, then on a cluster the route's
    `parts` (a single Redis's scripts spell them: `<route hash>:<part>`)."""
    spelled = [keys.route(route, part) for part in parts] if keys.cluster else []
    return [keys.route(route), keys.key_inflight(key, route), *spelled]


_ROUTE_PARTS = ("inflight", "queue", "queue-keys", "tags", "told")


def route_admit(
    keys: Keys,
    *,
    route: str,
    key: str,
    holder: str,
    now_ms: int,
    leave: bool = False,
    ms_per_request: float = 0,
    tokens: int = 0,
    ms_per_token: float = 0,
    route_cap: int = 0,
    key_cap: int = 0,
    lease_ms: int = 0,
    probe_ms: int = 0,
    stale_ms: int = 0,
    absent_ms: int = 0,
) -> ScriptCall[Admitted]:
    """ROUTE_ADMIT: may `holder` (a call of `key`, which may use `tokens`) go on `route`
    now? With `leave`, only take it out of the route's queue (another route took it,
    or it failed). Caps of 0 and spacings of 0 are no limit."""
    args: list[Any] = [now_ms, holder, key, ms_per_request, tokens, ms_per_token]
    args += [route_cap, key_cap, lease_ms, probe_ms, stale_ms, absent_ms]
    args.append("leave" if leave else "")

    def read(answer: Any) -> Admitted:
        verdict, at, charged = answer
        return Admitted(as_text(verdict), int(float(at)), int(charged))  # type: ignore[arg-type]

    return ScriptCall("route_admit", _route_keys(keys, route, key, _ROUTE_PARTS), args, read)


def route_done(
    keys: Keys,
    *,
    route: str,
    key: str,
    holder: str,
    outcome: Literal["ok", "failed", "limited", "refused", "stopped"],
    now_ms: int,
    paused_until_ms: int,
    charged: int,
    used: int | None,
    ms_per_token: float,
    failures_to_open: int,
    probe_ms: int,
    error: str,
) -> ScriptCall[str]:
    """ROUTE_DONE: what came of an admitted call (which ROUTE_ADMIT `charged` tokens, and
    `used` that many, None when unknown); answers the circuit's state."""
    args: list[Any] = [now_ms, holder, outcome, paused_until_ms, max(charged, 0)]
    args += [ms_per_token, failures_to_open, probe_ms, error[:300]]
    args.append("" if used is None else max(used, 0))
    return ScriptCall("route_done", _route_keys(keys, route, key, ("inflight",)), args, as_text)
