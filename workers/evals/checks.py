"""Whether one run of a case passed, and if not, how it failed: a pure function of what
the run showed (`RunFacts`) and what the case expects.

A failed run gets one failure kind, the first that explains it: a stop other than the
one expected names itself (the model's replies were unusable, it invented tool names,
it ran out of calls, made no progress, went over its budget...); a run that stopped as
expected failed on what it did (a wrong final answer, wrong calls, a failed `after`).
Every run of a case must stop as expected: a `then` case whose first run made no
progress fails, whatever its last run did. The reasons say what the run said (its
stop's message, the tool names it invented) and which calls the eval declined.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agent_core import Stop
from workers.evals.pattern import Pattern
from workers.evals.suite import Expect

__all__ = ["FAILURE_KINDS", "INVENTED", "RunFacts", "Verdict", "judge"]

INVENTED = "there is no tool named"
"""How the core begins the reason it sends back a call of a tool that does not exist."""
REJECTED = "The final answer was rejected"
"""How a run that the app's verifier sent back too often ends (`Stop.FAILED`)."""

FAILURE_KINDS = (
    "timed out",
    "unusable replies",
    "invented tool names",
    "model failed",
    "call limit",
    "no progress",
    "over budget",
    "final rejected",
    "declined",
    "wrong stop",
    "wrong final",
    "wrong calls",
    "failed after-check",
    "could not run",
)
"""Every failure kind, in the order reports list them."""

_BY_STOP = {
    Stop.BAD_REPLIES: "unusable replies",
    Stop.MODEL_FAILED: "model failed",
    Stop.CALL_LIMIT: "call limit",
    Stop.MODEL_CALL_LIMIT: "call limit",
    Stop.NO_PROGRESS: "no progress",
    Stop.BUDGET_EXCEEDED: "over budget",
    Stop.PLAN_DECLINED: "declined",
}


@dataclass(frozen=True)
class RunFacts:
    """What one run of a case showed, as the eval read it once the run ended."""

    stop: Stop | None
    """How it ended (None: it did not end in time, or could not be run)."""
    final: str = ""
    calls: tuple[tuple[str, dict[str, Any]], ...] = ()
    """Every tool call the run and its specialists made: the tool, the arguments it ran with."""
    outcomes: tuple[str, ...] = ()
    """Each call's outcome, in the order of `calls`: ok, error, declined, unknown ("": none)."""
    model_calls: int = 0
    tokens: int = 0
    cost_usd: float = 0.0
    seconds: float = 0.0
    retries: tuple[str, ...] = ()
    """The reason the core gave for each reply it could not use (retried)."""
    over_budget: bool = False
    """It reached the case's budget (and was stopped there)."""
    after: tuple[str, ...] = ()
    """The outputs of the case's `expect.after` calls, in order."""
    problem: str = ""
    """Why the eval could not run it or read it (empty: it could)."""
    earlier: tuple[tuple[Stop, str], ...] = ()
    """How each run before the last ended (a case's `then`): its stop and message."""
    declined: tuple[str, ...] = ()
    """A line for each call the eval declined because the case may not approve its risk."""

    @property
    def invented(self) -> int:
        """Replies that called a tool that does not exist."""
        return sum(1 for reason in self.retries if reason.startswith(INVENTED))


@dataclass(frozen=True)
class Verdict:
    passed: bool
    kind: str | None = None
    """The failure kind (one of FAILURE_KINDS); None when it passed."""
    why: tuple[str, ...] = ()
    """Each check that failed, in a line."""


def judge(expect: Expect, facts: RunFacts) -> Verdict:
    """Whether `facts` pass every check of `expect`, and the failure kind if not."""
    verdict = _verdict(expect, facts)
    if verdict.passed or not facts.declined:
        return verdict
    return Verdict(False, verdict.kind, (*verdict.why, *facts.declined))


def _verdict(expect: Expect, facts: RunFacts) -> Verdict:
    stopped = _stop_verdict(expect, facts)
    if stopped is not None:
        return stopped
    checks = (
        ("wrong final", _final_problems(expect, facts.final)),
        ("wrong calls", _call_problems(expect, facts)),
        ("failed after-check", _after_problems(expect, facts.after)),
    )
    for kind, problems in checks:
        if problems:
            return Verdict(False, kind, problems)
    return Verdict(True)


def _stop_verdict(expect: Expect, facts: RunFacts) -> Verdict | None:
    """The verdict when a run of the trial did not end as expected, else None."""
    if facts.problem:
        return Verdict(False, "could not run", (facts.problem,))
    if facts.stop is None:
        return Verdict(False, "timed out", ("the run did not end in time",))
    for number, (stop, message) in enumerate(facts.earlier, start=1):
        if stop is not expect.stop:
            said = f"its run {number} of {len(facts.earlier) + 1} stopped with {stop.value},"
            return Verdict(
                False,
                _stop_kind(stop, message, invented=False),
                (f"{said} not {expect.stop.value}: {_cut(message)}",),
            )
    if facts.over_budget:
        return Verdict(False, "over budget", ("it reached the case's budget",))
    if facts.stop is not expect.stop:
        said = f"it stopped with {facts.stop.value}, not {expect.stop.value}: {_cut(facts.final)}"
        kind = _stop_kind(facts.stop, facts.final, invented=facts.invented > 0)
        return Verdict(False, kind, (said, *_invented_names(facts)))
    return None


def _stop_kind(stop: Stop, message: str, *, invented: bool) -> str:
    if stop is Stop.BAD_REPLIES and invented:
        return "invented tool names"
    if stop is Stop.FAILED and message.startswith(REJECTED):
        return "final rejected"
    return _BY_STOP.get(stop, "wrong stop")


def _cut(text: str, most: int = 500) -> str:
    """A run's message in a reason: its first `most` characters."""
    return text if len(text) <= most else text[: most - 1] + "…"


def _invented_names(facts: RunFacts) -> tuple[str, ...]:
    """The core's reasons for the replies that called a tool that does not exist (each
    names the tool), once each, but for those the run's message already says."""
    named = (r for r in facts.retries if r.startswith(INVENTED) and r not in facts.final)
    return tuple(dict.fromkeys(named))


def _final_problems(expect: Expect, final: str) -> tuple[str, ...]:
    lowered = final.casefold()
    problems = [
        f"the final answer does not contain {text!r}"
        for text in expect.final_contains
        if text.casefold() not in lowered
    ]
    if expect.final_matches is not None and not Pattern(expect.final_matches).found(final):
        problems.append(f"the final answer does not match {expect.final_matches!r}")
    return tuple(problems)


def _call_problems(expect: Expect, facts: RunFacts) -> tuple[str, ...]:
    problems = [
        f"it never called {wanted}"
        for wanted in expect.called
        if not any(wanted.matches(tool, args) for tool, args in facts.calls)
    ]
    problems += [
        f"it called {unwanted}"
        for unwanted in expect.not_called
        if any(unwanted.matches(tool, args) for tool, args in facts.calls)
    ]
    limits = (
        ("tool calls", len(facts.calls), expect.max_calls),
        ("model calls", facts.model_calls, expect.max_model_calls),
        ("tokens", facts.tokens, expect.max_tokens),
    )
    problems += [
        f"it used {used:,} {what}, more than {most:,}"
        for what, used, most in limits
        if most is not None and used > most
    ]
    if expect.max_cost is not None and facts.cost_usd > expect.max_cost:
        problems.append(f"it cost ${facts.cost_usd:.6f}, more than ${expect.max_cost:.6f}")
    return tuple(problems)


def _after_problems(expect: Expect, outputs: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(
        f"{after.tool} afterwards does not contain {after.contains!r}"
        for after, output in zip(expect.after, outputs, strict=False)
        if after.contains.casefold() not in output.casefold()
    )
