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
    asking       reply_cut        _on_reply_cut   ask for the rest, or read what is whole
    asking       failed           _on_failure
    summarizing  replied          _on_summary
    summarizing  reply_cut        _on_summary     a cut summary is used as it is
    summarizing  failed           _on_failure
    reviewing    plan_decided     _on_plan_decision
    running      result_given     _on_result      the last result completes the batch
    questioning  answered         _on_answer
    finished     final_rejected   _on_final_rejected
    finished     followed_up      _on_follow_up   a new turn, with the history so far
    (any live)   told             _on_told        kept until the model is next asked
    (any live)   cancelled        _on_cancel

The agent's own tools each come in a reply of their own and are not counted
against `max_calls`: `remember` and `use_skill` change the state at once;
`read_skill_file` is checked here (a skill offered, a listed file or its
SKILL.md, at most MAX_SKILL_READS a task) and becomes a one-call batch with
its own ids (`read-1`, ...), which the host carries out like any READ call.

Around every handler `apply` does two things, the same for every pair. Before
it, an answer from the model (replied, reply_cut, failed) counts one model call,
and a reply moves the person's waiting messages into history (the prompt it
answers showed them). After it, an agent that would ask the model when its
turn has no model calls left stops with `Stop.MODEL_CALL_LIMIT` (`_capped`).

Every handler that leads to a new model request adds a trace event, so a host
can tell a new request from the one it already sent. `told` adds none: a
message changes what the next request says, not which request is due.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agent_core import history
from agent_core.args import check_args
from agent_core.errors import ToolArgsError
from agent_core.events import (
    Answered,
    Cancelled,
    Event,
    Failed,
    FinalRejected,
    FollowedUp,
    PlanDecided,
    Replied,
    ReplyCut,
    ResultGiven,
    Started,
    Told,
)
from agent_core.loops import Attempt, observe
from agent_core.reply import (
    NO_OBJECT,
    AskUserReply,
    CallReply,
    FinalReply,
    PlanReply,
    RawCall,
    Reply,
    Unusable,
    parse_reply,
)
from agent_core.skill_paths import SKILL_MD
from agent_core.skills import Skill
from agent_core.state import (
    AgentState,
    AnswerEntry,
    Asking,
    CallResult,
    CallsEntry,
    Entry,
    Finished,
    FollowUpEntry,
    Loops,
    MessageEntry,
    NoteEntry,
    NoticeEntry,
    Questioning,
    Reviewing,
    Running,
    SentBackEntry,
    SkillEntry,
    Summarizing,
    TraceEvent,
    TraceKind,
)
from agent_core.steps import Outcome, Stop
from agent_core.text import clean, counted, cut
from agent_core.toolbox import DELEGATE, READ_SKILL_FILE, REMEMBER, Setup, body_shown, part_chars
from agent_core.tools import Risk, ToolCall, ToolOutput, summary_line

__all__ = ["apply"]

MAX_SKILLS = 6
MAX_SKILL_READS = 24
"""`read_skill_file` calls a task may make; they do not count against `max_calls`."""
NOTE_CHARS = 300
MAX_NEW_NOTES = 20
QUESTION_CHARS = 2_000
TRACE_TEXT_CHARS = 4_000
PROBLEM_CHARS = 1_000
MESSAGE_CHARS = 2_000
MAX_TOLD = 10
"""Messages kept for the model's next request; older ones beyond this are dropped."""
REQUEST_CHARS = 10_000
MAX_CUTS = 3
"""Continuations of one reply cut by the length limit; one more cut makes it unusable."""
REPLY_CHARS = 60_000
"""A reply joined from its cut parts longer than this is unusable."""


Handler = Callable[[AgentState, Any, Setup], AgentState]
_MODEL_ANSWERS = ("replied", "reply_cut", "failed")


def apply(state: AgentState, event: Event, setup: Setup) -> AgentState:
    """Return the state after `event`; unchanged when the agent is not waiting for it."""
    handler = _TABLE.get((state.phase.kind, event.kind))
    if handler is None:
        return state
    if event.kind in _MODEL_ANSWERS:
        state = _answered(state, shown=event.kind != "failed", setup=setup)
    return _capped(handler(state, event, setup), setup)


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
    calls = state.calls_before + state.calls_used
    outcome = Outcome(stop=stop, summary=summary, data=data or {}, calls=calls)
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


def _model_calls_left(state: AgentState, setup: Setup) -> int:
    return setup.config.allowed_model_calls - state.model_calls


def _out_of_model_calls(state: AgentState, setup: Setup) -> AgentState:
    limit = setup.config.allowed_model_calls
    return _finish(
        state,
        Stop.MODEL_CALL_LIMIT,
        f"The limit of {counted(limit, 'model call')} was reached before the task was done.",
    )


def _capped(state: AgentState, setup: Setup) -> AgentState:
    """Return `state`, stopped if it waits for the model with no model calls left."""
    waits = isinstance(state.phase, Asking | Summarizing)
    if waits and _model_calls_left(state, setup) <= 0:
        return _out_of_model_calls(state, setup)
    return state


def _answered(state: AgentState, *, shown: bool, setup: Setup) -> AgentState:
    """Count one model call; after a reply to an `Ask`, its messages go into history."""
    state = state.model_copy(update={"model_calls": state.model_calls + 1})
    if not shown or not isinstance(state.phase, Asking) or not state.told:
        return state
    for text in state.told:
        state = _remembered(_traced(state, "message", text=text), MessageEntry(text=text), setup)
    return state.model_copy(update={"told": ()})


def _next_ask(state: AgentState, setup: Setup) -> AgentState:
    """Return `state` waiting for the model: a summary first when history is too long.

    No summary is asked for when only one model call is left: the last one is
    for the final answer.
    """
    if setup.config.summarize and not state.planning and _model_calls_left(state, setup) > 1:
        fold = history.fold_count(state.history, setup.config.history_chars)
        if fold:
            return state.model_copy(update={"phase": Summarizing(fold=fold)})
    return state.model_copy(update={"phase": Asking()})


def _progressed(
    state: AgentState, attempts: list[Attempt], setup: Setup, *, tool_calls: bool = True
) -> AgentState:
    """Return `state` after `attempts` were recorded: asking on, told once, or stopped."""
    verdict = observe(state.loops, attempts, setup.config.max_repeats, tool_calls=tool_calls)
    state = state.model_copy(update={"loops": verdict.loops})
    if verdict.stop:
        return _finish(state, Stop.NO_PROGRESS, verdict.stop)
    if verdict.warning:
        state = _traced(state, "warning", text=verdict.warning)
        state = _remembered(state, NoticeEntry(text=verdict.warning), setup)
    return _next_ask(state, setup)


def _remembered(state: AgentState, entry: Entry, setup: Setup) -> AgentState:
    """Return `state` with `entry` added to history, trimmed unless summaries fold it."""
    grown = (*state.history, entry)
    if not setup.config.summarize:
        grown = history.trimmed(grown, setup.config.history_chars)
    return state.model_copy(update={"history": grown})


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


def _read(state: AgentState, text: str) -> Reply:
    """Return what `text` means, joined to the cut reply before it (if any).

    When the joined text is unusable but `text` alone is whole, the model
    started over instead of going on: its new reply is used.
    """
    if not state.partial:
        return parse_reply(text)
    joined = parse_reply(state.partial + text)
    if isinstance(joined, Unusable):
        alone = parse_reply(text)
        if not isinstance(alone, Unusable):
            return alone
    return joined


def _whole(state: AgentState) -> AgentState:
    """Return `state` with no cut reply waiting for its rest."""
    return state.model_copy(update={"partial": "", "cuts": 0})


def _on_reply(state: AgentState, event: Replied, setup: Setup) -> AgentState:
    return _on_parsed(_whole(state), _read(state, event.text), setup)


def _on_reply_cut(state: AgentState, event: ReplyCut, setup: Setup) -> AgentState:
    reply = _read(state, event.text)
    if not isinstance(reply, Unusable) or reply.reason != NO_OBJECT:
        return _on_parsed(_whole(state), reply, setup)  # what was written is whole already
    joined = state.partial + clean(event.text)
    cuts = state.cuts + 1
    if cuts > MAX_CUTS or len(joined) > REPLY_CHARS:
        reason = (
            f"your reply was cut off by the length limit {cuts} times and is still not"
            " whole; reply again, much shorter"
        )
        return _retry(_whole(state), reason, setup)
    waiting = state.model_copy(update={"partial": joined, "cuts": cuts})
    said = f"the reply was cut off by the length limit; asked for the rest ({cuts} of {MAX_CUTS})"
    return _traced(waiting, "continued", text=said)


def _on_parsed(state: AgentState, reply: Reply, setup: Setup) -> AgentState:
    if _model_calls_left(state, setup) <= 0 and not isinstance(reply, FinalReply):
        return _out_of_model_calls(state, setup)  # no model call is left to read what it asks
    match reply:
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
    too_early = (
        state.plan
        and not state.sent_back_early
        and state.calls_used * 2 < len(state.plan)
        and _model_calls_left(state, setup) > 0
    )
    if too_early:
        problem = (
            f"you answered after {counted(state.calls_used, 'call')}, but most of your plan is"
            " untouched."
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
            f"The limit of {counted(setup.config.max_calls, 'call')} was reached before the task"
            " was done.",
        )
    keep = min(len(calls), setup.config.max_batch, left)
    checked: list[ToolCall] = []
    made = state.calls_before + state.calls_used
    for offset, raw in enumerate(calls[:keep]):
        call = _checked_call(state, raw, setup, made + offset + 1)
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
        summary=summary_line(raw.tool, tool.summarizer, args),
    )


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
        attempt = Attempt(f"{REMEMBER}({note!r})", REMEMBER, {"note": note}, ToolOutput.ok(""))
        return _progressed(_traced(noted, "note", text=note), [attempt], setup, tool_calls=False)
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
    body = skill.first_part(body_shown(setup.config))
    entry = SkillEntry(name=name, body=body, note=skill.note(len(body), read_with=READ_SKILL_FILE))
    loaded = _usable(state, skills_loaded=(*state.skills_loaded, name))
    loaded = _remembered(loaded, entry, setup)
    return _next_ask(_traced(loaded, "skill", text=name), setup)


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


def _on_summary(state: AgentState, event: Replied | ReplyCut, setup: Setup) -> AgentState:
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
        results=tuple(CallResult(call=history.kept(c), output=results[c.id]) for c in phase.batch),
        note=phase.note,
    )
    attempts = [Attempt(c.summary, c.tool, c.args, results[c.id]) for c in phase.batch]
    return _progressed(_remembered(recorded, entry, setup), attempts, setup)


def _on_answer(state: AgentState, event: Answered, setup: Setup) -> AgentState:
    assert isinstance(state.phase, Questioning)
    question = state.phase.question
    answer = cut(clean(event.text), QUESTION_CHARS)
    entry = AnswerEntry(question=question, answer=answer)
    answered = _remembered(_traced(state, "answer", text=answer), entry, setup)
    attempt = Attempt(
        f"ask_user({question!r})", "ask_user", {"question": question}, ToolOutput.ok(answer)
    )
    return _progressed(answered, [attempt], setup, tool_calls=False)


def _on_final_rejected(state: AgentState, event: FinalRejected, setup: Setup) -> AgentState:
    assert isinstance(state.phase, Finished)
    outcome = state.phase.outcome
    if outcome.stop is not Stop.DONE:
        return state
    problem = cut(clean(event.problem), 2_000) or "the answer was not accepted"
    entry = SentBackEntry(final=cut(outcome.summary, 2_000), problem=problem)
    reopened = _remembered(_traced(state, "sent_back", text=problem), entry, setup)
    return _next_ask(reopened, setup)


def _on_follow_up(state: AgentState, event: FollowedUp, setup: Setup) -> AgentState:
    """Start a new turn: history, notes, skills and waiting messages stay; the
    turn's counters (calls, model calls, retries, loops) start again, and a
    root agent that needs a plan is asked for a new one."""
    assert isinstance(state.phase, Finished)
    request = cut(clean(event.text).strip(), REQUEST_CHARS)
    if not request:
        return state
    outcome = state.phase.outcome
    entry = FollowUpEntry(stop=outcome.stop, answer=cut(outcome.summary, 2_000), request=request)
    turned = _whole(state).model_copy(
        update={
            "request": request,
            "calls_before": state.calls_before + state.calls_used,
            "calls_used": 0,
            "model_calls": 0,
            "loops": Loops(),
            "bad_replies": 0,
            "problem": "",
            "sent_back_early": False,
            "plan": (),
            "planning": setup.config.require_plan and state.depth == 0,
        }
    )
    turned = _remembered(_traced(turned, "follow_up", text=request), entry, setup)
    return _next_ask(turned, setup)


def _on_told(state: AgentState, event: Told, _setup: Setup) -> AgentState:
    text = cut(clean(event.text).strip(), MESSAGE_CHARS)
    if not text:
        return state
    return state.model_copy(update={"told": (*state.told, text)[-MAX_TOLD:]})


def _on_cancel(state: AgentState, event: Cancelled, _setup: Setup) -> AgentState:
    return _finish(state, Stop.CANCELLED, cut(clean(event.reason), 2_000) or "Cancelled.")


_LIVE = ("asking", "summarizing", "reviewing", "running", "questioning")
_TABLE: dict[tuple[str, str], Handler] = {
    ("idle", "started"): _begin,
    ("asking", "replied"): _on_reply,
    ("asking", "reply_cut"): _on_reply_cut,
    ("asking", "failed"): _on_failure,
    ("summarizing", "replied"): _on_summary,
    ("summarizing", "reply_cut"): _on_summary,
    ("summarizing", "failed"): _on_failure,
    ("reviewing", "plan_decided"): _on_plan_decision,
    ("running", "result_given"): _on_result,
    ("questioning", "answered"): _on_answer,
    ("finished", "final_rejected"): _on_final_rejected,
    ("finished", "followed_up"): _on_follow_up,
    **{(phase, "told"): _on_told for phase in _LIVE},
    **{(phase, "cancelled"): _on_cancel for phase in _LIVE},
}
