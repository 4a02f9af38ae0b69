"""Every transition of the agent, in one place.

Theory of operation: the agent is always waiting for one thing (its phase).
An event arrives (a method call on `Agent`); the table below maps
(phase, event) to a handler that returns the next state. A pair not in the
table is harmless: the state is returned unchanged, and the agent answers with
the step it was already waiting on. Handlers are pure functions of
(state, event, setup); the model's misbehaviour becomes a retry (`_retry`)
or, past the budget, a stated stop (`_finish`), never an exception.

    phase        event            handler
    idle         started          _begin
    asking       replied          _on_reply       plan / calls / own tool / final / question / retry
    asking       failed           _on_failure
    summarizing  replied          _on_summary
    summarizing  failed           _on_failure
    reviewing    plan_decided     _on_plan_decision
    running      result_given     _on_result      the last result completes the batch
    questioning  answered         _on_answer
    finished     final_rejected   _on_final_rejected
    (any live)   cancelled        _on_cancel

The agent's own tools each come in a reply of their own and are not counted
against `max_calls`: `remember` and `use_skill` change the state at once;
`read_skill_file` is checked here (a skill offered, a listed file or its
SKILL.md, at most MAX_SKILL_READS a task) and becomes a one-call batch with
its own ids (`read-1`, ...), which the host carries out like any READ call.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from agent_core import history
from agent_core.args import check_args
from agent_core.errors import ToolArgsError
from agent_core.reply import (
    AskUserReply,
    CallReply,
    FinalReply,
    PlanReply,
    RawCall,
    Unusable,
    parse_reply,
)
from agent_core.skills import SKILL_MD, Skill
from agent_core.state import (
    AgentState,
    AnswerEntry,
    Asking,
    CallResult,
    CallsEntry,
    Entry,
    Finished,
    NoteEntry,
    Questioning,
    Reviewing,
    Running,
    SentBackEntry,
    SkillEntry,
    Summarizing,
    TraceEvent,
    TraceKind,
)
from agent_core.steps import Attachment, Outcome, Stop
from agent_core.text import clean, cut
from agent_core.toolbox import DELEGATE, READ_SKILL_FILE, REMEMBER, Setup, body_shown, part_chars
from agent_core.tools import Risk, ToolCall, ToolOutput

__all__ = [
    "Answered",
    "Cancelled",
    "Event",
    "Failed",
    "FinalRejected",
    "PlanDecided",
    "Replied",
    "ResultGiven",
    "Started",
    "apply",
]

MAX_SKILLS = 6
MAX_SKILL_READS = 24
"""`read_skill_file` calls a task may make; they do not count against `max_calls`."""
FILES_SHOWN = 100
NOTE_CHARS = 300
MAX_NEW_NOTES = 20
QUESTION_CHARS = 2_000
TRACE_TEXT_CHARS = 4_000
SUMMARY_SHOWN_CHARS = 60
PROBLEM_CHARS = 1_000
ARG_KEPT_CHARS = 1_000


# --- events: what can happen to an agent ----------------------------------------


@dataclass(frozen=True)
class Started:
    task: str
    context: str
    attachments: tuple[Attachment, ...]
    kind: Literal["started"] = "started"


@dataclass(frozen=True)
class Replied:
    text: str
    kind: Literal["replied"] = "replied"


@dataclass(frozen=True)
class Failed:
    error: str
    kind: Literal["failed"] = "failed"


@dataclass(frozen=True)
class PlanDecided:
    yes: bool
    kind: Literal["plan_decided"] = "plan_decided"


@dataclass(frozen=True)
class ResultGiven:
    call_id: str
    output: ToolOutput
    kind: Literal["result_given"] = "result_given"


@dataclass(frozen=True)
class Answered:
    text: str
    kind: Literal["answered"] = "answered"


@dataclass(frozen=True)
class FinalRejected:
    problem: str
    kind: Literal["final_rejected"] = "final_rejected"


@dataclass(frozen=True)
class Cancelled:
    reason: str
    kind: Literal["cancelled"] = "cancelled"


Event = (
    Started | Replied | Failed | PlanDecided | ResultGiven | Answered | FinalRejected | Cancelled
)
Handler = Callable[[AgentState, Any, Setup], AgentState]


def apply(state: AgentState, event: Event, setup: Setup) -> AgentState:
    """Return the state after `event`; unchanged when the agent is not waiting for it."""
    handler = _TABLE.get((state.phase.kind, event.kind))
    return state if handler is None else handler(state, event, setup)


# --- small helpers ---------------------------------------------------------------


def _traced(state: AgentState, kind: TraceKind, **fields: Any) -> AgentState:
    text = fields.pop("text", "")
    event = TraceEvent(
        seq=state.trace_seq + 1, kind=kind, text=cut(text, TRACE_TEXT_CHARS), **fields
    )
    return state.model_copy(update={"trace": (*state.trace, event), "trace_seq": event.seq})


def _finish(
    state: AgentState, stop: Stop, summary: str, data: dict[str, Any] | None = None
) -> AgentState:
    outcome = Outcome(stop=stop, summary=summary, data=data or {}, calls=state.calls_used)
    done = state.model_copy(update={"phase": Finished(outcome=outcome)})
    return _traced(done, "stop", text=summary, stop=stop)


def _usable(state: AgentState, **changes: Any) -> AgentState:
    """Return `state` after a usable reply: the retry budget is whole again."""
    return state.model_copy(update={"bad_replies": 0, "problem": "", **changes})


def _retry(state: AgentState, reason: str, setup: Setup, *, failed: bool = False) -> AgentState:
    """Spend one retry on an unusable reply (or a failed call); past the budget, stop."""
    reason = cut(reason, PROBLEM_CHARS)
    count = state.bad_replies + 1
    if count > setup.config.max_retries:
        if failed:
            return _finish(state, Stop.MODEL_FAILED, f"The model could not be reached: {reason}")
        return _finish(state, Stop.BAD_REPLIES, f"The model's replies could not be used: {reason}")
    problem = state.problem if failed else reason
    retried = state.model_copy(update={"bad_replies": count, "problem": problem})
    # A failed call is not the model's reply: the trace keeps the two apart.
    return _traced(retried, "model_failed" if failed else "retry", text=reason)


def _next_ask(state: AgentState, setup: Setup) -> AgentState:
    """Return `state` waiting for the model: a summary first when history is too long."""
    if setup.config.summarize and not state.planning:
        fold = history.fold_count(state.history, setup.config.history_chars)
        if fold:
            return state.model_copy(update={"phase": Summarizing(fold=fold)})
    return state.model_copy(update={"phase": Asking()})


def _remembered(state: AgentState, entry: Entry, setup: Setup) -> AgentState:
    """Return `state` with `entry` added to history, trimmed unless summaries fold it."""
    grown = (*state.history, entry)
    if not setup.config.summarize:
        grown = history.trimmed(grown, setup.config.history_chars)
    return state.model_copy(update={"history": grown})


def _default_summary(tool: str, args: dict[str, Any]) -> str:
    shown = ", ".join(
        f"{k}={cut(history.render_args(v), SUMMARY_SHOWN_CHARS)}" for k, v in args.items()
    )
    return f"{tool}({shown})"


# --- handlers ----------------------------------------------------------------------


def _begin(state: AgentState, event: Started, setup: Setup) -> AgentState:
    started = state.model_copy(
        update={
            "task": clean(event.task),
            "context": clean(event.context),
            "attachments": event.attachments,
            "planning": setup.config.require_plan and state.depth == 0,
        }
    )
    return _next_ask(_traced(started, "started", text=started.task), setup)


def _on_reply(state: AgentState, event: Replied, setup: Setup) -> AgentState:
    match parse_reply(event.text):
        case Unusable(reason):
            return _retry(state, reason, setup)
        case PlanReply(steps):
            return _on_plan(state, steps, setup)
        case FinalReply(text, data):
            return _on_final(state, clean(text), data, setup)
        case CallReply(calls):
            return _on_calls(state, calls, setup)
        case AskUserReply(question):
            return _on_question(state, question, setup)
    raise AssertionError("unreachable")  # pragma: no cover


def _on_plan(state: AgentState, steps: list[str], setup: Setup) -> AgentState:
    if not state.planning:
        return _retry(
            state, "the plan is already settled: reply with a tool call or your final answer", setup
        )
    limit = setup.config.max_plan_steps
    if len(steps) > limit:
        return _retry(
            state, f"your plan has {len(steps)} steps; shorten it to at most {limit}", setup
        )
    plan = tuple(cut(step, NOTE_CHARS) for step in steps)
    planned = _usable(state, plan=plan, phase=Reviewing())
    return _traced(planned, "plan", text="\n".join(plan))


def _on_final(state: AgentState, text: str, data: dict[str, Any], setup: Setup) -> AgentState:
    too_early = state.plan and not state.sent_back_early and state.calls_used * 2 < len(state.plan)
    if too_early:
        problem = (
            f"you answered after {state.calls_used} calls, but most of your plan is untouched."
            " Carry on with the plan, or say in your final answer why it is not needed"
        )
        sent_back = _usable(state, sent_back_early=True)
        sent_back = _remembered(
            sent_back, SentBackEntry(final=cut(text, 2_000), problem=problem), setup
        )
        return _next_ask(_traced(sent_back, "sent_back", text=problem), setup)
    return _finish(_usable(state), Stop.DONE, text, data)


def _on_question(state: AgentState, question: str, setup: Setup) -> AgentState:
    if not state.questions:
        return _retry(state, "you cannot ask the person here; carry on with what you know", setup)
    asked = _usable(state, phase=Questioning(question=cut(question, QUESTION_CHARS)))
    return _traced(asked, "question", text=question)


def _on_calls(state: AgentState, calls: list[RawCall], setup: Setup) -> AgentState:
    if state.planning:
        return _retry(state, 'first reply with your plan: {"plan": ["first step", "..."]}', setup)
    own = [c for c in calls if c.tool in setup.own]
    if own and len(calls) > 1:
        return _retry(state, f"{own[0].tool} goes in a reply of its own, not in a batch", setup)
    if own:
        return _on_own_tool(state, own[0], setup)
    left = setup.config.max_calls - state.calls_used
    if left <= 0:
        return _finish(
            state,
            Stop.CALL_LIMIT,
            f"The limit of {setup.config.max_calls} calls was reached before the task was done.",
        )
    keep = min(len(calls), setup.config.max_batch, left)
    checked: list[ToolCall] = []
    for offset, raw in enumerate(calls[:keep]):
        call = _checked_call(state, raw, setup, state.calls_used + offset + 1)
        if isinstance(call, str):
            return _retry(state, call, setup)
        checked.append(call)
    note = ""
    if keep < len(calls):
        note = f"(You asked for {len(calls)} calls in one reply; only the first {keep} ran.)"
    running = _usable(
        state, calls_used=state.calls_used + keep, phase=Running(batch=tuple(checked), note=note)
    )
    for call in checked:
        running = _traced(running, "call", text=call.summary, call=call)
    return running


def _checked_call(state: AgentState, raw: RawCall, setup: Setup, number: int) -> ToolCall | str:
    """Return the call with checked arguments, or a sentence saying what is wrong."""
    if raw.tool == "ask_user":
        return 'ask_user is not a tool: reply {"ask_user": "your question"} on its own'
    tool = setup.tools.get(raw.tool)
    if tool is None:
        names = ", ".join(setup.tools) or "none"
        return f"there is no tool named {cut(raw.tool, 80)!r}; the tools are: {names}"
    try:
        args = check_args(tool, raw.args)
    except ToolArgsError as refused:
        return f"{tool.name}: {refused}"
    if tool.name == DELEGATE:
        known = ", ".join(s.name for s in state.specialists)
        if args["specialist"] not in {s.name for s in state.specialists}:
            wanted = cut(args["specialist"], 80)
            return f"there is no specialist named {wanted!r}; the specialists are: {known}"
    ask = tool.name != DELEGATE and setup.config.policy.asks(tool.risk_class)
    return ToolCall(
        id=f"call-{number}",
        tool=tool.name,
        args=args,
        risk=tool.risk_class,
        ask=ask,
        summary=_summary_line(tool.summarizer, raw, args),
    )


def _summary_line(
    summarizer: Callable[[dict[str, Any]], str] | None, raw: RawCall, args: dict[str, Any]
) -> str:
    if summarizer is not None:
        try:
            line = summarizer(dict(args))
        except Exception:  # noqa: BLE001 - display only: a failing summary falls back to the default
            line = None
        if isinstance(line, str) and line.strip():
            return cut(clean(line), 500)
    return _default_summary(raw.tool, args)


def _kept(call: ToolCall) -> ToolCall:
    """Return `call` as history keeps it: each long argument cut, so history stays bounded."""
    shown = {k: history.render_args(v) for k, v in call.args.items()}
    if all(len(text) <= ARG_KEPT_CHARS for text in shown.values()):
        return call
    args = {
        k: cut(shown[k], ARG_KEPT_CHARS) if len(shown[k]) > ARG_KEPT_CHARS else v
        for k, v in call.args.items()
    }
    return call.model_copy(update={"args": args})


def _on_own_tool(state: AgentState, raw: RawCall, setup: Setup) -> AgentState:
    tool = setup.own[raw.tool]
    try:
        args = check_args(tool, raw.args)
    except ToolArgsError as refused:
        return _retry(state, f"{tool.name}: {refused}", setup)
    if tool.name == REMEMBER:
        note = cut(clean(args["note"]).strip(), NOTE_CHARS)
        if not note:
            return _retry(state, "remember: the note is empty", setup)
        noted = _usable(state, new_notes=(*state.new_notes, note)[-MAX_NEW_NOTES:])
        noted = _remembered(noted, NoteEntry(text=note), setup)
        return _next_ask(_traced(noted, "note", text=note), setup)
    if tool.name == READ_SKILL_FILE:
        return _on_skill_read(state, args, setup)
    return _load_skill(state, args["name"], setup)


def _load_skill(state: AgentState, name: str, setup: Setup) -> AgentState:
    skill = next((s for s in state.skills if s.name == name), None)
    if skill is None:
        names = ", ".join(s.name for s in state.skills)
        return _retry(
            state, f"there is no skill named {cut(name, 80)!r}; the skills are: {names}", setup
        )
    if len(state.skills_loaded) >= MAX_SKILLS:
        return _retry(
            state, f"a task may load at most {MAX_SKILLS} skills; carry on without more", setup
        )
    if any(isinstance(e, SkillEntry) and e.name == name for e in state.history):
        return _retry(state, f"the skill {name} is already loaded above", setup)
    body = _first_part(skill.body, body_shown(setup.config))
    entry = SkillEntry(name=name, body=body, note=_skill_note(skill, len(body)))
    loaded = _usable(state, skills_loaded=(*state.skills_loaded, name))
    loaded = _remembered(loaded, entry, setup)
    return _next_ask(_traced(loaded, "skill", text=name), setup)


def _first_part(body: str, limit: int) -> str:
    """Return `body`, or its first `limit` characters ending at a line break when one is near."""
    if len(body) <= limit:
        return body
    line_end = body.rfind("\n", 0, limit)
    return body[: line_end + 1 if line_end >= limit // 2 else limit]


def _skill_note(skill: Skill, shown: int) -> str:
    """Return what follows a loaded skill's body: how to read the rest, and its files."""
    lines = []
    if shown < len(skill.body):
        read_on = json.dumps(
            {
                "tool": READ_SKILL_FILE,
                "args": {"skill": skill.name, "path": SKILL_MD, "offset": shown},
            }
        )
        lines.append(
            f"(The SKILL.md goes on for {len(skill.body) - shown} more characters;"
            f" read them with {read_on}.)"
        )
    if skill.resources:
        listed = ", ".join(skill.resources[:FILES_SHOWN])
        more = len(skill.resources) - FILES_SHOWN
        listed += f" and {more} more" if more > 0 else ""
        lines.append(f"Files of this skill (read one with {READ_SKILL_FILE}): {listed}")
    return "\n".join(lines)


def _on_skill_read(state: AgentState, args: dict[str, Any], setup: Setup) -> AgentState:
    """Check a `read_skill_file` call and hand it to the host as a call of its own."""
    skill = next((s for s in state.skills if s.name == args["skill"]), None)
    if skill is None:
        names = ", ".join(s.name for s in state.skills)
        wanted = cut(args["skill"], 80)
        return _retry(
            state,
            f"{READ_SKILL_FILE}: there is no skill named {wanted!r}; the skills are: {names}",
            setup,
        )
    path = _skill_path(skill, args["path"])
    if path is None:
        files = cut(", ".join((SKILL_MD, *skill.resources)), 2_000)
        wanted = cut(args["path"], 120)
        return _retry(
            state,
            f"{READ_SKILL_FILE}: {wanted!r} is not a file of the skill {skill.name};"
            f" its files are: {files}",
            setup,
        )
    offset = args.get("offset")
    if offset is not None and offset < 0:
        return _retry(state, f"{READ_SKILL_FILE}: the offset must be 0 or more", setup)
    if state.skill_reads >= MAX_SKILL_READS:
        return _retry(
            state,
            f"a task may read at most {MAX_SKILL_READS} skill files; carry on with what you have",
            setup,
        )
    number = state.skill_reads + 1
    given = {"offset": offset} if offset is not None else {}
    call = ToolCall(
        id=f"read-{number}",
        tool=READ_SKILL_FILE,
        args={"skill": skill.name, "path": path, **given, "limit": part_chars(setup.config)},
        risk=Risk.READ,
        ask=False,
        summary=f"{READ_SKILL_FILE}({skill.name}/{path}{f' from {offset}' if offset else ''})",
    )
    reading = _usable(state, skill_reads=number, phase=Running(batch=(call,)))
    return _traced(reading, "call", text=call.summary, call=call)


def _skill_path(skill: Skill, given: str) -> str | None:
    """Return the file of `skill` the model means by `given`, or None.

    Besides an exact match: a leading `./` or `<skill name>/`, `skill.md` in
    any case, and a bare file name that only one file of the skill has.
    """
    path = given.strip().removeprefix("./").removeprefix(f"{skill.name}/")
    if path.lower() == SKILL_MD.lower():
        return SKILL_MD
    if path in skill.resources:
        return path
    named = [r for r in skill.resources if r.rsplit("/", 1)[-1] == path]
    return named[0] if len(named) == 1 else None


def _on_failure(state: AgentState, event: Failed, setup: Setup) -> AgentState:
    return _retry(
        state, cut(clean(event.error), 500) or "the model call failed", setup, failed=True
    )


def _on_summary(state: AgentState, event: Replied, setup: Setup) -> AgentState:
    assert isinstance(state.phase, Summarizing)
    text = clean(event.text).strip()
    if not text:
        return _retry(state, "the summary was empty", setup)
    fold = state.phase.fold
    summary = cut(text, setup.config.history_chars // 4)
    folded = _usable(state, summary=summary, history=state.history[fold:])
    return _next_ask(_traced(folded, "summary", text=summary), setup)


def _on_plan_decision(state: AgentState, event: PlanDecided, setup: Setup) -> AgentState:
    if not event.yes:
        declined = _traced(state, "plan_declined")
        return _finish(declined, Stop.PLAN_DECLINED, "The plan was declined.")
    approved = _traced(state.model_copy(update={"planning": False}), "plan_approved")
    return _next_ask(approved, setup)


def _on_result(state: AgentState, event: ResultGiven, setup: Setup) -> AgentState:
    phase = state.phase
    assert isinstance(phase, Running)
    call = next((c for c in phase.batch if c.id == event.call_id), None)
    if call is None or call.id in phase.results:
        return state
    cap = history.output_cap(setup.config.history_chars)
    output = ToolOutput(status=event.output.status, text=cut(clean(event.output.text), cap))
    results = {**phase.results, call.id: output}
    recorded = _traced(state, "result", text=output.text, call=call, output=output)
    if len(results) < len(phase.batch):
        return recorded.model_copy(update={"phase": phase.model_copy(update={"results": results})})
    entry = CallsEntry(
        results=tuple(CallResult(call=_kept(c), output=results[c.id]) for c in phase.batch),
        note=phase.note,
    )
    return _next_ask(_remembered(recorded, entry, setup), setup)


def _on_answer(state: AgentState, event: Answered, setup: Setup) -> AgentState:
    assert isinstance(state.phase, Questioning)
    answer = cut(clean(event.text), QUESTION_CHARS)
    entry = AnswerEntry(question=state.phase.question, answer=answer)
    answered = _remembered(_traced(state, "answer", text=answer), entry, setup)
    return _next_ask(answered, setup)


def _on_final_rejected(state: AgentState, event: FinalRejected, setup: Setup) -> AgentState:
    assert isinstance(state.phase, Finished)
    outcome = state.phase.outcome
    if outcome.stop is not Stop.DONE:
        return state
    problem = cut(clean(event.problem), 2_000) or "the answer was not accepted"
    entry = SentBackEntry(final=cut(outcome.summary, 2_000), problem=problem)
    reopened = _remembered(_traced(state, "sent_back", text=problem), entry, setup)
    return _next_ask(reopened, setup)


def _on_cancel(state: AgentState, event: Cancelled, _setup: Setup) -> AgentState:
    return _finish(state, Stop.CANCELLED, cut(clean(event.reason), 2_000) or "Cancelled.")


_LIVE = ("asking", "summarizing", "reviewing", "running", "questioning")
_TABLE: dict[tuple[str, str], Handler] = {
    ("idle", "started"): _begin,
    ("asking", "replied"): _on_reply,
    ("asking", "failed"): _on_failure,
    ("summarizing", "replied"): _on_summary,
    ("summarizing", "failed"): _on_failure,
    ("reviewing", "plan_decided"): _on_plan_decision,
    ("running", "result_given"): _on_result,
    ("questioning", "answered"): _on_answer,
    ("finished", "final_rejected"): _on_final_rejected,
    **{(phase, "cancelled"): _on_cancel for phase in _LIVE},
}
