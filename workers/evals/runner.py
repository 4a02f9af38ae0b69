"""Running a suite on the fleet: every case, on every route, `repeat` times.

Each trial (a case on a route, once) is a real run started with `Relay.start`, pinned
to its route, with the case's tools, config, budget and recorded outcomes; workers
run it like any other, with the app's real tools (but those the case's `recorded`
stands in for). This process only watches: it decides what waits on a person the way
the case says (plans, denials, edits, answers; a run parked at its budget is stopped
there), starts a case's `then` runs one after another, and once a trial has ended
reads what it showed (`RunFacts`): its stop and final answer from its status, its
tool calls from its journal, its retries from its trace.

A trial's run asks a person about every call whose risk the case does not approve
(the suite's `approve`), whatever the case's config says (`Case.config_over`). A call
that asks is approved only when its risk is one the case approves, MONEY only with
`allow_money` as well, or when its tool is recorded (it never runs); any other is
declined, and the trial says which and why: a risk the suite does not list never runs.

Up to `parallel` trials are in flight at once; the routes' own limits (concurrency,
rates) still apply on the fleet, so a slow route holds only its own trials back.
"""

from __future__ import annotations

import secrets
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Literal

from agent_core import Config, Risk, Tool
from workers.client.replays import MadeCall
from workers.client.start import recorded_stubs
from workers.engine.records import Pending, RunStatus
from workers.errors import DecisionRefused, RelayError, StoreUnavailable
from workers.evals.checks import RunFacts, Verdict, judge
from workers.evals.suite import Case, Suite
from workers.kit.tools import ToolContext, tool_output
from workers.relay import Relay

__all__ = ["Trial", "TrialResult", "check_suite", "run_suite"]

POLL_SECONDS = 0.1
MAX_TRIALS = 100_000
"""Trials one `run_suite` takes at most (cases x repeats x routes)."""
DECIDED_BY = "relay eval"
TRACE_LINES = 40
"""The last lines of a failed trial's trace kept in its result (the report outlives
a private Redis)."""


@dataclass(frozen=True)
class Trial:
    """One run of a case on a route (`route` None: the app's routes, in order)."""

    case: Case
    route: str | None
    repeat: int
    approve: tuple[Risk, ...] = ()
    """The risks whose calls that ask this trial approves (the suite's `approves`)."""
    approved_by: Literal["suite", "case"] = "suite"
    """Whose list `approve` is ("suite", or "case" when the case narrowed it)."""


@dataclass(frozen=True)
class TrialResult:
    trial: Trial
    facts: RunFacts
    verdict: Verdict
    runs: tuple[str, ...] = ()
    """The runs it started (its `then` runs after the first)."""
    trace: tuple[str, ...] = ()
    """A failed trial's last trace lines (`kind: text`), read before the Redis could go."""


@dataclass
class _Live:
    """A trial in flight: its runs so far, and what this process decided for them."""

    trial: Trial
    runs: list[str]
    started: float
    memory: str | None
    answered: int = 0
    over_budget: bool = False
    statuses: list[RunStatus] = field(default_factory=list)
    declined: list[str] = field(default_factory=list)
    """Why each call the trial may not approve was declined (`RunFacts.declined`)."""
    problem: str = ""
    """Why the trial cannot go on (it could not be started, or its run not read)."""


def check_suite(
    relay: Relay, suite: Suite, routes: Sequence[str | None], *, allow_money: bool = False
) -> None:
    """Refuse, before anything runs, a suite that names what the app does not have, or
    approves MONEY without `allow_money`.

    Raises:
        RelayError: a tool, a route or an `after` tool is unknown (or not READ), or
            the suite approves money and `allow_money` is not given.
    """
    if Risk.MONEY in suite.approve and not allow_money:
        raise RelayError(
            f"suite {suite.name} approves money: its MONEY calls run for real with the"
            " app's tools; give --allow-money to let them, or take money out of approve"
        )
    known = {t.name: t for t in relay.tools}
    route_names = [r.name for r in relay.routes]
    for route in routes:
        if route is not None and route not in route_names:
            told = ", ".join(route_names) or "none (set RELAY_MODELS)"
            raise RelayError(f"no model route {route}; routes: {told}")
    for case in suite.case:
        try:
            _check_case(case, known, relay.name)
        except RelayError as error:
            raise RelayError(f"case {case.name}: {error}") from None


def _check_case(case: Case, known: dict[str, Tool], app: str) -> None:
    """Refuse a case naming a tool the app lacks, an argument a tool lacks, a recorded
    outcome that does not check, or an `after` call of a tool that is not READ."""
    named = [*(case.tools or ()), *case.deny, *case.edit, *(r.tool for r in case.recorded)]
    unknown = sorted({n for n in named if n not in known})
    if unknown:
        raise RelayError(f"{app} has no tool {', '.join(unknown)}")
    recorded_stubs(case.recorded_tools(), known)
    for tool_name, edit in case.edit.items():
        unknown_args = sorted(set(edit) - {arg.name for arg in known[tool_name].args})
        if unknown_args:
            raise RelayError(
                f"edit.{tool_name}: {tool_name} has no argument {', '.join(unknown_args)}"
            )
    for after in case.expect.after:
        tool = known.get(after.tool)
        if tool is None or tool.risk_class is not Risk.READ:
            raise RelayError(f"expect.after calls {after.tool}, which is not a READ tool of {app}")


def trials_of(suite: Suite, routes: Sequence[str | None], repeat: int) -> list[Trial]:
    """Every trial, route by route, case by case, repeat by repeat."""
    return [
        Trial(
            case,
            route,
            n,
            suite.approves(case),
            "suite" if case.approve is None else "case",
        )
        for route in routes
        for case in suite.case
        for n in range(1, (case.repeat or repeat) + 1)
    ]


def run_suite(
    relay: Relay,
    trials: Sequence[Trial],
    *,
    parallel: int = 8,
    timeout: float = 300.0,
    allow_money: bool = False,
    on_result: Callable[[TrialResult], None] = lambda _result: None,
) -> list[TrialResult]:
    """Run the trials on the fleet, up to `parallel` at once; return their results in
    the order given. A trial not ended within `timeout` seconds is cancelled; so is
    every trial in flight when this is interrupted (Ctrl-C) or fails, since nobody
    would be left to decide what they wait for. A MONEY call is approved only with
    `allow_money` (and its trial's `approve` listing money)."""
    if len(trials) > MAX_TRIALS:
        raise RelayError(f"{len(trials):,} trials is more than {MAX_TRIALS:,}: fewer repeats")
    waiting, live = deque(enumerate(trials)), dict[int, _Live]()
    done: dict[int, TrialResult] = {}
    try:
        while waiting or live:
            while waiting and len(live) < parallel:
                number, trial = waiting.popleft()
                live[number] = _begin(relay, trial)
            with suppress(StoreUnavailable):  # (Redis restarting: decide at the next poll)
                _decide(relay, live.values(), relay.pending(), allow_money=allow_money)
            for key, one in list(live.items()):
                result = _advance_or_fail(relay, one, timeout)
                if result is not None:
                    del live[key]
                    done[key] = result
                    on_result(result)
            if live:
                time.sleep(POLL_SECONDS)
    except BaseException:
        _cancel(relay, live.values())
        raise
    return [done[n] for n in range(len(trials))]


def _cancel(relay: Relay, live: Iterable[_Live]) -> None:
    for one in live:
        with suppress(Exception):  # (best effort: Redis may be what failed)
            if one.runs:
                relay.cancel(one.runs[-1], "relay eval stopped before the run ended")


def _begin(relay: Relay, trial: Trial) -> _Live:
    case = trial.case
    memory = f"eval-{case.name}-{secrets.token_hex(6)}" if case.memory else None
    one = _Live(trial, [], time.monotonic(), memory)
    try:
        one.runs.append(_start(relay, one, case.task))
    except RelayError as error:  # (the trial cannot run; the others can)
        one.problem = f"it could not be started: {error}"
    return one


def _advance_or_fail(relay: Relay, one: _Live, timeout: float) -> TrialResult | None:
    """`_advance`, or the trial's failure if it could not be started or read."""
    if not one.problem:
        try:
            return _advance(relay, one, timeout)
        except StoreUnavailable as error:  # (Redis restarting: try again, within the timeout)
            if time.monotonic() - one.started <= timeout:
                return None
            one.problem = str(error)
        except RelayError as error:  # (its run is gone, say: this trial fails, not the eval)
            one.problem = str(error)
    facts = RunFacts(stop=None, problem=one.problem)
    return TrialResult(one.trial, facts, judge(one.trial.case.expect, facts), tuple(one.runs))


def _start(relay: Relay, one: _Live, task: str) -> str:
    case = one.trial.case
    return relay.start(
        task,
        case.context,
        config=_config(relay, one.trial),
        budget=case.budget,
        tools=case.tools,
        memory=one.memory,
        route=one.trial.route,
        recorded=case.recorded_tools() or None,
    )


def _config(relay: Relay, trial: Trial) -> Config:
    """The trial's run config: it asks about every risk the trial does not approve, and
    about the risks of the case's `deny` and `edit` tools too, so that every call of
    those waits for the eval, which denies or edits it (unasked, it would just run)."""
    case = trial.case
    risks = {tool.name: tool.risk_class for tool in relay.tools}
    decided = {risks[name] for name in (*case.deny, *case.edit) if name in risks}
    return case.config_over(relay.config, [r for r in trial.approve if r not in decided])


def _decide(
    relay: Relay, live: Iterable[_Live], pending: list[Pending], *, allow_money: bool
) -> None:
    """Decide what waits on a person in the trials' runs, as their cases say."""
    by_root = {one.runs[-1]: one for one in live if one.runs}
    for waiting in pending:
        one = by_root.get(waiting.root_id)
        if one is None:
            continue  # (not ours: the eval shares the fleet)
        with suppress(DecisionRefused):  # (decided meanwhile: expired, or the run ended)
            _decide_one(relay, one, waiting, allow_money=allow_money)


def _decide_one(relay: Relay, one: _Live, waiting: Pending, *, allow_money: bool) -> None:
    case = one.trial.case
    if waiting.kind == "plan":
        yes = case.plan == "approve"
        relay.runs_client.approve_plan(waiting.run_id, yes, by=DECIDED_BY)
    elif waiting.kind == "question":
        answers = case.answers or ["I cannot say; do what you think best."]
        relay.answer(waiting.run_id, answers[min(one.answered, len(answers) - 1)])
        one.answered += 1
    elif waiting.kind == "budget":
        one.over_budget = True
        relay.cancel(waiting.root_id, "the case's budget was reached")
    elif waiting.call_id is not None:
        tool = waiting.tool or ""
        unapproved = _unapproved(one.trial, waiting, allow_money=allow_money)
        if tool in case.deny:
            relay.deny(waiting.run_id, waiting.call_id, "the case denies this call")
        elif unapproved:
            relay.deny(waiting.run_id, waiting.call_id, f"relay eval {unapproved}")
            one.declined.append(unapproved)
        elif tool in case.edit:
            edited = {**waiting.args, **case.edit[tool]}
            try:
                relay.approve(waiting.run_id, waiting.call_id, True, args=edited, by=DECIDED_BY)
            except DecisionRefused as refused:  # (the edit does not check: the run goes on)
                relay.deny(
                    waiting.run_id, waiting.call_id, f"the case's edit was refused: {refused}"
                )
        else:
            relay.approve(waiting.run_id, waiting.call_id, True, by=DECIDED_BY)


def _unapproved(trial: Trial, waiting: Pending, *, allow_money: bool) -> str:
    """Why the call may not be approved ("declined: ..."), or "" when it may: its tool
    is recorded (it never runs), or its risk is one the trial approves (MONEY only with
    `allow_money` too)."""
    tool = waiting.tool or "?"
    if tool in {r.tool for r in trial.case.recorded}:
        return ""
    risk = waiting.risk
    if risk in trial.approve and (risk is not Risk.MONEY or allow_money):
        return ""
    told = ", ".join(r.value for r in trial.approve) or "nothing"
    said = f"declined: {waiting.call_id} {tool} ({(risk or 'unknown risk').upper()}) needs"
    if risk is Risk.MONEY and risk in trial.approve:
        return f"{said} --allow-money"
    return f"{said} approval; the {trial.approved_by} approves {told}"


def _advance(relay: Relay, one: _Live, timeout: float) -> TrialResult | None:
    """The trial's result once its last run has ended (starting its next `then` run
    when one has ended), else None."""
    status = relay.status(one.runs[-1])
    if status.outcome is None:
        if time.monotonic() - one.started <= timeout:
            return None
        relay.cancel(one.runs[-1], f"relay eval: not ended within {timeout:g} s")
        one.statuses.append(status)
        return _result(relay, one, timed_out=True)
    one.statuses.append(status)
    if len(one.runs) <= len(one.trial.case.then):
        one.runs.append(_start(relay, one, one.trial.case.then[len(one.runs) - 1]))
        return None
    return _result(relay, one, timed_out=False)


def _result(relay: Relay, one: _Live, *, timed_out: bool) -> TrialResult:
    try:
        facts = _facts(relay, one, timed_out=timed_out)
    except RelayError as error:
        facts = RunFacts(stop=None, problem=str(error))
    verdict = judge(one.trial.case.expect, facts)
    trace: tuple[str, ...] = ()
    if not verdict.passed:
        with suppress(RelayError):  # (the trace is for reading; the verdict stands without)
            trace = tuple(_trace(relay, one.runs))
    return TrialResult(one.trial, facts, verdict, tuple(one.runs), trace)


def _trace(relay: Relay, runs: list[str]) -> list[str]:
    """The last `TRACE_LINES` of the trial's runs' traces, each `run kind: text`."""
    lines = [
        f"{entry.run} {entry.kind}" + (f": {entry.text}" if entry.text else "")
        for run_id in runs
        for entry in relay.trace(run_id)
    ]
    return [line[:300] for line in lines[-TRACE_LINES:]]


def _facts(relay: Relay, one: _Live, *, timed_out: bool) -> RunFacts:
    last = one.statuses[-1]
    usage = [s.total_usage for s in one.statuses]
    made: list[MadeCall] = relay.tool_calls(last.id)
    earlier = [(s.outcome.stop, s.outcome.summary) for s in one.statuses[:-1] if s.outcome]
    return RunFacts(
        stop=None if timed_out or last.outcome is None else last.outcome.stop,
        final=last.outcome.summary if last.outcome is not None else "",
        calls=tuple((c.tool, c.args) for c in made),
        outcomes=tuple(c.output.status if c.output is not None else "" for c in made),
        model_calls=sum(u.model_calls for u in usage),
        tokens=sum(u.total_tokens for u in usage),
        cost_usd=sum(u.cost_micro for u in usage) / 1_000_000,
        seconds=time.monotonic() - one.started,
        retries=tuple(_retries(relay, last)),
        over_budget=one.over_budget,
        after=tuple(_after(relay, one.trial.case, last.id)),
        earlier=tuple(earlier),
        declined=tuple(one.declined),
    )


def _retries(relay: Relay, status: RunStatus) -> Iterator[str]:
    """The reason of every reply the core could not use, in the run and its specialists."""
    runs = [status.id, *status.children]
    for run_id in runs:
        yield from (e.text for e in relay.trace(run_id) if e.kind == "retry")
        if run_id != status.id:
            runs += [c for c in relay.status(run_id).children if c not in runs]


def _after(relay: Relay, case: Case, run_id: str) -> Iterator[str]:
    """Each `expect.after` call's output (a READ tool, called here, as the run's)."""
    for number, after in enumerate(case.expect.after, start=1):
        spec = relay.kit.spec(after.tool)
        if spec is None:
            yield f"the tool {after.tool} is gone"
            continue
        context = ToolContext(run_id=run_id, call_id=f"eval-after-{number}")
        try:
            value = spec.call(dict(after.args), context)
        except Exception as error:  # noqa: BLE001 - the check fails, saying why
            yield f"{type(error).__name__}: {error}"
            continue
        yield tool_output(after.tool, value, relay.settings.tool_output_chars).text
