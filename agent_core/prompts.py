"""What the model reads: a system text (the format and the tools) and a prompt.

Both are pure functions of the state and setup, so the same state always
gives the same request, byte for byte.

The prompt reads top to bottom: the task (verbatim, every time) and what is
known about it, what happened so far, the person's current request after a
follow-up, why the last reply could not be used, messages the person sent
while the agent worked, and last what to reply now (or, after a reply cut
by the length limit, that reply so far and a request for the rest).
"""

from __future__ import annotations

from agent_core.history import render_history
from agent_core.skills import DESCRIPTION_MAX
from agent_core.state import AgentState
from agent_core.steps import ModelRequest, ReplyShape
from agent_core.text import counted, cut
from agent_core.toolbox import Setup
from agent_core.tools import Tool

__all__ = ["ask_request", "reply_shape", "summary_request"]

MEMORY_SHOWN = 20
NOTE_CHARS = 300


def _describe(tool: Tool) -> str:
    lines = [f"- {tool.name}: {tool.description}"]
    for arg in tool.args:
        optional = ", optional" if not arg.required else ""
        help_text = f": {arg.help}" if arg.help else ""
        lines.append(f"    {arg.name} ({arg.kind.value}{optional}){help_text}")
    return "\n".join(lines)


def _forms(state: AgentState, setup: Setup) -> list[str]:
    config = setup.config
    forms = [
        f'{{"plan": ["first step", "..."]}}  your plan, when asked for it'
        f" (at most {counted(config.max_plan_steps, 'step')})",
        '{"tool": "name", "args": {...}}  call one tool',
    ]
    if config.max_batch > 1:
        forms.append(
            '{"tools": [{"tool": "name", "args": {...}}, ...]}  up to'
            f" {config.max_batch} calls at once, when they do not depend on each other"
        )
    if state.questions:
        forms.append(
            '{"ask_user": "question"}  ask the person, only when you cannot go on without'
            " the answer; in a reply of its own"
        )
    forms.append(
        '{"final": "what you did, or the answer"}  when the task is done; other keys'
        " beside final are kept"
    )
    return forms


def system_text(state: AgentState, setup: Setup) -> str:
    """Return the system text: who the agent is, the reply format and every tool."""
    intro = (
        f"You are the specialist {state.role}, working on a task handed to you by another agent."
        if state.role
        else "You are an agent that completes a task by calling tools."
    )
    parts = [intro]
    if state.guidance:
        parts.append(state.guidance)
    parts.append(
        "Reply with exactly one JSON object per turn, and nothing else. The forms:\n"
        + "\n".join(f"  {form}" for form in _forms(state, setup))
    )
    offered = setup.offered()
    tools = "\n".join(_describe(t) for t in offered) if offered else "(none)"
    parts.append(f"Tools:\n{tools}")
    if state.skills:
        # A description over the format's limit is kept, but shown cut (it was warned about).
        listed = "\n".join(
            f"- {s.name}: {cut(s.description, DESCRIPTION_MAX)}" for s in state.skills
        )
        parts.append(f"Skills (load one with use_skill when it fits the task):\n{listed}")
    return "\n\n".join(parts)


def _progress(state: AgentState, setup: Setup) -> str:
    left = setup.config.max_calls - state.calls_used
    return f"({counted(state.calls_used, 'call')} made so far, {left} left)"


def _situation(state: AgentState, setup: Setup) -> list[str]:
    """Return the prompt's sections that describe the task and what happened."""
    sections = [f"Task:\n{state.task}"]
    if state.context:
        sections.append(f"Context:\n{state.context}")
    if state.attachments:
        files = ", ".join(f"{a.name} ({a.mime})" for a in state.attachments)
        sections.append(f"Files attached: {files}")
    if state.memory:
        notes = "\n".join(f"- {cut(n, NOTE_CHARS)}" for n in state.memory[-MEMORY_SHOWN:])
        sections.append(f"Notes saved from earlier tasks (oldest first):\n{notes}")
    if state.plan:
        steps = "\n".join(f"{i}. {step}" for i, step in enumerate(state.plan, 1))
        sections.append(f"Plan:\n{steps}\n{_progress(state, setup)}")
    if state.summary:
        sections.append(f"Summary of earlier work:\n{state.summary}")
    return sections


def _instruction(state: AgentState, setup: Setup) -> str:
    config = setup.config
    if config.allowed_model_calls - state.model_calls <= 1:
        return (
            'This is your last reply: no model calls are left after it. Reply with {"final":'
            ' "..."}: what you did, and what is still open.'
        )
    if state.planning:
        return (
            'Reply now with your plan: {"plan": ["first step", "..."]}, at most'
            f" {counted(config.max_plan_steps, 'step')}."
        )
    left = config.max_calls - state.calls_used
    if left <= 0:
        return (
            'No tool calls are left. Reply with {"final": "..."}: what you did, and what is'
            " still open."
        )
    return (
        'Reply with one JSON object: a tool call, or {"final": "..."} when the task is done.'
        f" Calls left: {left}."
    )


def reply_shape(state: AgentState, setup: Setup) -> ReplyShape | None:
    """Return the reply objects the next reply may be, as `_instruction` asks for them and
    the transitions take them; None when the model is to write the rest of a cut reply
    (plain text, joined to what came)."""
    if state.partial:
        return None
    config = setup.config
    if config.allowed_model_calls - state.model_calls <= 1:
        return ReplyShape()  # the last reply: the final answer alone is read
    if state.planning:  # calls wait for the plan; a final answer or a question does not
        return ReplyShape(plan_steps=config.max_plan_steps, ask_user=state.questions)
    calls_left = config.max_calls - state.calls_used > 0
    host, own = setup.shaped  # (the agent's own tools are never counted as calls)
    host = host if calls_left else ()
    # Made from checked values on every request: no need to check them again.
    return ReplyShape.model_construct(
        plan_steps=0,
        tools=(*host, *own),
        batch=config.max_batch if host else 1,
        ask_user=state.questions,
    )


def _told(state: AgentState) -> list[str]:
    if not state.told:
        return []
    if len(state.told) == 1:
        return [f"A message from the person, sent while you worked:\n{state.told[0]}"]
    listed = "\n".join(f"- {text}" for text in state.told)
    return [f"Messages from the person, sent while you worked (oldest first):\n{listed}"]


def _continuation(state: AgentState) -> list[str]:
    return [
        "Your last reply was cut off by the length limit. What you wrote so far:\n"
        f"--- your reply so far ---\n{state.partial}\n--- cut off here ---",
        "Continue it from exactly where it stops: write only the rest, without repeating"
        " anything above.",
    ]


def ask_request(state: AgentState, setup: Setup) -> ModelRequest:
    """Return the request for the model's next move."""
    sections = _situation(state, setup)
    if state.history:
        sections.append(f"What happened so far:\n{render_history(state.history)}")
    if state.request:
        sections.append(
            f"The person's current request (the task above is where this began):\n{state.request}"
        )
    if state.problem:
        sections.append(f"Your last reply could not be used: {state.problem}.")
    sections += _told(state)
    if state.partial:
        sections += _continuation(state)
    else:
        sections.append(_instruction(state, setup))
    return ModelRequest(
        system=system_text(state, setup),
        prompt="\n\n".join(sections),
        attachments=state.attachments,
        reply=reply_shape(state, setup),
    )


def summary_request(state: AgentState, setup: Setup, fold: int) -> ModelRequest:
    """Return the request that asks the model to fold the oldest `fold` entries."""
    sections = [f"Task:\n{state.task}"]
    if state.request:
        sections.append(f"The person's current request:\n{state.request}")
    if state.summary:
        sections.append(f"Summary so far:\n{state.summary}")
    sections.append(f"Earlier work to fold in:\n{render_history(state.history[:fold])}")
    sections.append(
        "Write a short summary, in plain text (not JSON), of the summary so far and the"
        " earlier work: what was done, what was found, and what is still open."
        f" At most {setup.config.history_chars // 4} characters."
    )
    system = (
        "You keep an agent's notes short. You summarise its earlier work so it can"
        " carry on without the details."
    )
    return ModelRequest(system=system, prompt="\n\n".join(sections), attachments=state.attachments)
