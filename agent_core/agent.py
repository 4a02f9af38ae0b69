"""`Agent`: the state machine a host drives, one event in, the next step out.

The agent never does I/O. Each method feeds one event to the transitions and
returns the step it now waits on; calling a method at the wrong time changes
nothing and returns that same step.

Besides the events of one task, a person can steer it (`tell`: a message the
model sees at its next request), start a new turn once it is done
(`follow_up`), and a reply the model could not finish (`reply(text,
truncated=True)`) is continued rather than thrown away.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from pydantic import BaseModel

from agent_core import events, transitions
from agent_core.args import check_args
from agent_core.config import Config
from agent_core.errors import DefinitionError, UsageError
from agent_core.prompts import ask_request, summary_request
from agent_core.skills import Skill
from agent_core.specialists import Specialist
from agent_core.state import (
    AgentState,
    Asking,
    Finished,
    Idle,
    Loops,
    Questioning,
    Reviewing,
    Running,
    Summarizing,
    TraceEvent,
    dump,
    dump_head,
    dump_loops,
    dump_start,
    load,
)
from agent_core.steps import Ask, Attachment, Done, Plan, Question, Run, Step, Summarize
from agent_core.text import clean
from agent_core.toolbox import DELEGATE, MAX_SPECIALIST_DEPTH, Setup, index_tools
from agent_core.tools import Tool, ToolCall, ToolOutput

__all__ = ["Agent"]


def _text(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise UsageError(f"{what} must be text, got {type(value).__name__}")
    return value


class Agent:
    """The agent: `Agent(config, tools)`, configured with the `with_*` calls, then started."""

    __slots__ = ("_config", "_setup", "_state", "_step", "_tools")

    def __init__(self, config: Config, tools: Sequence[Tool]) -> None:
        if not isinstance(config, Config):
            raise DefinitionError(f"config must be a Config, got {type(config).__name__}")
        self._config = config
        self._tools = index_tools(tools)
        self._state = AgentState()
        self._setup = Setup.build(config, self._tools, self._state)
        self._step: tuple[AgentState, Step] | None = None

    @classmethod
    def _with_state(cls, config: Config, tools: dict[str, Tool], state: AgentState) -> Agent:
        agent = cls.__new__(cls)
        agent._config, agent._tools, agent._state = config, tools, state
        agent._setup = Setup.build(config, tools, state)
        agent._step = None
        return agent

    # --- setting up -----------------------------------------------------------------

    def _configured(self, **changes: Any) -> Agent:
        if not isinstance(self._state.phase, Idle):
            raise UsageError("configure the agent before start")
        return Agent._with_state(self._config, self._tools, self._state.model_copy(update=changes))

    def with_specialists(self, specialists: Iterable[Specialist]) -> Agent:
        """Return this agent able to delegate to `specialists`.

        Raises:
            DefinitionError: two specialists share a name, or one lists a tool
                this agent does not have.
        """
        listed = tuple(specialists)
        names = [s.name for s in listed]
        if len(set(names)) != len(names):
            raise DefinitionError("two specialists share a name")
        for specialist in listed:
            missing = [n for n in specialist.tool_names if n not in self._setup.tools]
            if missing or not specialist.tool_names:
                what = f"unknown tools {missing}" if missing else "no tools"
                raise DefinitionError(f"specialist {specialist.name!r} lists {what}")
        return self._configured(specialists=listed)

    def with_memory(self, notes: Iterable[str]) -> Agent:
        """Return this agent showing `notes` (oldest first) and able to `remember` new ones."""
        return self._configured(
            remembering=True, memory=tuple(clean(_text(n, "a note")) for n in notes)
        )

    def with_skills(self, skills: Iterable[Skill]) -> Agent:
        """Return this agent offering `skills` through `use_skill` (and `read_skill_file`).

        `read_skill_file` is offered when a skill has files or a body longer
        than `use_skill` shows; the host reads them (see `agent_core.skill_files`).
        """
        listed = tuple(skills)
        if len({s.name for s in listed}) != len(listed):
            raise DefinitionError("two skills share a name")
        return self._configured(skills=listed)

    def with_questions(self) -> Agent:
        """Return this agent allowed to ask the person a question (`Question` steps)."""
        return self._configured(questions=True)

    # --- events -----------------------------------------------------------------------

    def _apply(self, event: events.Event) -> Step:
        self._state = transitions.apply(self._state, event, self._setup)
        return self.resume()

    def start(self, task: str, context: str = "") -> Step:
        """Begin `task`; returns the first step. A second start changes nothing."""
        return self.start_with(task, context, [])

    def start_with(self, task: str, context: str, attachments: Iterable[Attachment]) -> Step:
        """Begin `task` with files that go on every model request."""
        files = tuple(attachments)
        if not all(isinstance(a, Attachment) for a in files):
            raise UsageError("attachments must be Attachment values")
        event = events.Started(_text(task, "the task"), _text(context, "the context"), files)
        self._state = transitions.apply(self._state, event, self._setup)
        return self.resume()

    def reply(self, text: str, *, truncated: bool = False) -> Step:
        """The model replied `text` (to an `Ask` or a `Summarize`).

        `truncated=True`: the reply stopped at the length limit
        (`finish_reason="length"`). If it already holds one whole JSON object,
        that is used; otherwise the next `Ask` shows the text so far and asks
        for the rest, and the parts are joined before they are read (a model
        that starts over is read on its own). A reply cut more than 3 times,
        or longer than 60,000 characters joined, is unusable (a retry). A cut
        summary is used as it is. Every part is one model call.
        """
        text = _text(text, "the reply")
        event = events.ReplyCut(text) if truncated else events.Replied(text)
        return self._apply(event)

    def fail(self, error: str) -> Step:
        """The model call failed; retried like an unusable reply, then `Stop.MODEL_FAILED`."""
        return self._apply(events.Failed(_text(error, "the error")))

    def approve_plan(self, yes: bool) -> Step:
        """A person approved (or declined) the plan."""
        return self._apply(events.PlanDecided(bool(yes)))

    def result(self, call_id: str, output: ToolOutput) -> Step:
        """A call of the current batch finished; results may come in any order."""
        if not isinstance(output, ToolOutput):
            raise UsageError(f"a result must be a ToolOutput, got {type(output).__name__}")
        return self._apply(events.ResultGiven(_text(call_id, "the call id"), output))

    def answer(self, text: str) -> Step:
        """A person answered the current `Question`."""
        return self._apply(events.Answered(_text(text, "the answer")))

    def reject_final(self, problem: str) -> Step:
        """Send a final answer back to the model with `problem`."""
        return self._apply(events.FinalRejected(_text(problem, "the problem")))

    def cancel(self, reason: str = "") -> Step:
        """Stop now with `Stop.CANCELLED`."""
        return self._apply(events.Cancelled(_text(reason, "the reason")))

    def tell(self, text: str) -> Step:
        """A person's message for the model, sent while the agent works.

        Accepted in every live phase (waiting for the model, a summary, a plan
        decision, results or an answer) and kept until the next `Ask`, whose
        prompt shows it after the history, marked as from the person. Once
        the model replied to that request the message moves into history.
        Several messages accumulate (the newest 10 are kept, each cut to
        2,000 characters). Blank text, and a message to an agent that is done,
        change nothing; to go on with a finished agent, use `follow_up`.

        The step returned is the one waited on; an `Ask` already sent keeps
        its meaning (no trace event is added), so a host need not ask again.
        """
        return self._apply(events.Told(_text(text, "the message")))

    def follow_up(self, text: str) -> Step:
        """Start a new turn on a finished agent (any stop), with `text` as the request.

        History, notes, skills and any waiting messages stay; the end of the
        last turn and the new request go into history. Every prompt still
        shows the original task, then the current request after the history.
        The turn's counters start again: `max_calls` calls, the model-call
        allowance, retries and loop counts (call ids go on counting, and
        `Outcome.calls` counts every turn). A root agent with `require_plan`
        is asked for a new plan. Returns the next step: an `Ask` (a `Summarize`
        first, with `summarize`, when history has grown past `history_chars`).

        On an agent still working, or with blank text, nothing changes and
        the step waited on is returned: the host decides whether to queue,
        refuse or cancel first.
        """
        return self._apply(events.FollowedUp(_text(text, "the request")))

    # --- reading ----------------------------------------------------------------------

    def resume(self) -> Step:
        """Return the step the agent waits on.

        Raises:
            UsageError: the agent was never started.
        """
        state = self._state
        # Building a request renders the whole prompt; the state is immutable, so the
        # step is computed once per state however often a host asks for it.
        if self._step is not None and self._step[0] is state:
            return self._step[1]
        step = self._step_of(state)
        self._step = (state, step)
        return step

    def _step_of(self, state: AgentState) -> Step:
        match state.phase:
            case Asking():
                return Ask(request=ask_request(state, self._setup))
            case Summarizing(fold=fold):
                return Summarize(request=summary_request(state, self._setup, fold))
            case Reviewing():
                return Plan(steps=state.plan)
            case Running(batch=batch, results=results):
                return Run(call=next(c for c in batch if c.id not in results))
            case Questioning(question=question):
                return Question(text=question)
            case Finished(outcome=outcome):
                return Done(outcome=outcome)
        raise UsageError("the agent has not been started")

    def queued(self) -> list[ToolCall]:
        """Return the rest of the current batch (after the `Run` call), in order."""
        phase = self._state.phase
        if not isinstance(phase, Running):
            return []
        waiting = [c for c in phase.batch if c.id not in phase.results]
        return waiting[1:]

    def trace(self) -> list[TraceEvent]:
        """Return the trace events not yet taken."""
        return list(self._state.trace)

    def take_trace(self) -> list[TraceEvent]:
        """Return the trace events not yet taken, and forget them (keeps snapshots small)."""
        taken = list(self._state.trace)
        kept = self._step if self._step is not None and self._step[0] is self._state else None
        self._state = self._state.model_copy(update={"trace": ()})
        if kept is not None:  # the trace is not part of the step: it stays valid
            self._step = (self._state, kept[1])
        return taken

    def check_args(self, tool: str, args: dict[str, Any]) -> dict[str, Any]:
        """Return `args` for a call of `tool`, checked exactly as a model's call is (the
        declared kinds, then the tool's own `validate`): for a person who edits a call's
        arguments before approving it.

        Raises:
            ToolArgsError: the arguments are refused (the message says why).
            UsageError: this agent has no tool `tool`, or `args` is no dict.
        """
        found = self._tools.get(tool)
        if found is None:
            raise UsageError(f"this agent has no tool {tool!r}")
        if not isinstance(args, dict):
            raise UsageError(f"a call's arguments are a dict, got {type(args).__name__}")
        return check_args(found, args)

    def offered(self) -> tuple[Tool, ...]:
        """Return the host tools this agent may call (`delegate` too, with specialists)."""
        return tuple(self._setup.tools.values())

    def skill(self, name: str) -> Skill | None:
        """Return the skill this agent offers under `name` (for a host reading its files)."""
        return next((s for s in self._state.skills if s.name == name), None)

    def new_notes(self) -> list[str]:
        """Return the notes remembered during this task, oldest first."""
        return list(self._state.new_notes)

    # --- saving -----------------------------------------------------------------------

    def snapshot(self) -> str:
        """Return the whole state as JSON text; `Agent.restore` continues from it."""
        return dump(self._state)

    def snapshot_head(self, *, without_start: bool = False, without_loops: bool = False) -> str:
        """Return the snapshot without its history entries (see `history`).

        For a host that stores the entries apart, so a step writes only the new
        ones: the snapshot `restore` reads is this text with the state's
        `"history": [...]` (each entry's `model_dump_json()`) put back.

        With `without_start`, also without what the start set (the task, its
        context and attachments), which never changes after: the host keeps
        `snapshot_start` once and puts its fields back into the state too.

        With `without_loops`, also without the loop counters: the host keeps
        `snapshot_loops` apart, written when `loops()` is another object than before
        the step, and puts it back into the state too.
        """
        return dump_head(self._state, without_start=without_start, without_loops=without_loops)

    def snapshot_start(self) -> str:
        """Return what the start set (task, context, attachments) as a JSON object:
        the state's fields `snapshot_head(without_start=True)` leaves out."""
        return dump_start(self._state)

    def snapshot_loops(self) -> str:
        """Return the loop counters as a JSON object (`{"loops": ...}`, or `{}`): what
        `snapshot_head(without_loops=True)` leaves out."""
        return dump_loops(self._state)

    def loops(self) -> Loops:
        """The loop counters as they stand. Immutable: a step that counts nothing leaves
        the very same object, so a host sees whether to write them by identity."""
        return self._state.loops

    def history(self) -> tuple[BaseModel, ...]:
        """Return the history entries, oldest first.

        Entries are immutable, and a step keeps an entry it does not drop as the
        same object: a host tells which entries are new by identity (`is`).
        """
        return self._state.history

    def copy(self) -> Agent:
        """Return an independent agent in the same state (cheap: the state is
        immutable), e.g. to keep one aside while the other is advanced."""
        twin = Agent._with_state(self._config, self._tools, self._state)
        twin._step = self._step
        return twin

    @classmethod
    def restore(cls, config: Config, tools: Sequence[Tool], saved: str) -> Agent:
        """Return the agent saved in `saved`, exactly where it left off.

        Raises:
            SnapshotError: `saved` is empty, corrupt, foreign or of an unknown version.
        """
        agent = cls(config, tools)
        return cls._with_state(config, agent._tools, load(saved))

    # --- delegation -------------------------------------------------------------------

    def start_child(self, call: ToolCall) -> Agent:
        """Return the started child agent for a `delegate` call; `child.resume()` is its first step.

        The child has only its specialist's tools, its instructions, no plan of
        its own, and may delegate further only to specialists whose tools it has,
        down to a fixed depth.

        Raises:
            UsageError: `call` is not a delegate call to one of this agent's specialists.
        """
        state = self._state
        if not isinstance(call, ToolCall) or call.tool != DELEGATE:
            raise UsageError("start_child takes a delegate call")
        specialist = next(
            (s for s in state.specialists if s.name == call.args.get("specialist")), None
        )
        if specialist is None:
            raise UsageError(f"no specialist named {call.args.get('specialist')!r}")
        granted = tuple(
            n for n in specialist.tool_names if n in self._setup.tools and n != DELEGATE
        )
        depth = state.depth + 1
        nested = tuple(
            s
            for s in state.specialists
            if depth + 1 < MAX_SPECIALIST_DEPTH
            and s.name != specialist.name
            and set(s.tool_names) <= set(granted)
        )
        child_state = AgentState(
            specialists=nested,
            questions=state.questions,
            depth=depth,
            role=specialist.name,
            guidance=specialist.guidance,
            allowed_tools=granted,
        )
        child = Agent._with_state(self._config, self._tools, child_state)
        context = f"You are helping with this larger task:\n{state.task}"
        child.start(_text(call.args.get("task"), "the delegated task"), context)
        return child
