"""The blocking driver: `run(agent, host, task)` plays every step through a `Host`.

For a program that can simply wait on its model and tools. Anything else
(async code, a UI, a queue of workers) drives the `Agent` itself.

The driver carries out the agent's own host-side tools itself: `delegate`
(a child agent, driven to its end) and `read_skill_file` (read from the
skill's folder by `agent_core.skill_files`, imported only then).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from agent_core.agent import Agent
from agent_core.steps import (
    Ask,
    Done,
    ModelRequest,
    Outcome,
    Plan,
    Question,
    Run,
    Step,
    Stop,
    Summarize,
)
from agent_core.toolbox import DELEGATE, READ_SKILL_FILE
from agent_core.tools import ToolCall, ToolOutput

__all__ = ["CANNOT_ASK", "Host", "run"]

CANNOT_ASK = (
    "(The person cannot be asked right now. Carry on with your best judgement, and say in"
    " your final answer what you assumed.)"
)


class Host(Protocol):
    """What `run` needs from its host. Raising from `ask_model` counts as a failed call.

    Optional methods, used when present:
        approve_plan(steps: list[str]) -> bool      default: True
        approve_call(call: ToolCall) -> bool        default: True
        ask_person(question: str) -> str           default: the person cannot be asked
        summarize(request: ModelRequest) -> str     default: ask_model
    """

    def ask_model(self, request: ModelRequest) -> str:
        """Return the model's reply to `request`; raise if the call failed."""
        ...

    def run_tool(self, call: ToolCall) -> ToolOutput:
        """Run `call` and return what happened; raising gives the model the error text."""
        ...


def run(agent: Agent, host: Host, task: str, context: str = "") -> Outcome:
    """Start `agent` on `task` and drive it through `host` until it is done."""
    return _drive(agent, host, agent.start(task, context))


def _drive(agent: Agent, host: Host, step: Step) -> Outcome:
    while True:
        match step:
            case Ask(request):
                step = _ask(agent, host.ask_model, request)
            case Summarize(request):
                step = _ask(agent, getattr(host, "summarize", host.ask_model), request)
            case Plan(steps):
                approve_plan = getattr(host, "approve_plan", None)
                step = agent.approve_plan(approve_plan(list(steps)) if approve_plan else True)
            case Run(call):
                step = agent.result(call.id, _carry_out(agent, host, call))
            case Question(text):
                ask_person = getattr(host, "ask_person", None)
                step = agent.answer(ask_person(text) if ask_person else CANNOT_ASK)
            case Done(outcome):
                return outcome


def _ask(agent: Agent, model: Callable[[ModelRequest], str], request: ModelRequest) -> Step:
    try:
        text = model(request)
    except Exception as error:  # noqa: BLE001 - any failure of the host's model call is data
        return agent.fail(str(error) or type(error).__name__)
    if not isinstance(text, str):
        return agent.fail(f"the model returned {type(text).__name__}, not text")
    return agent.reply(text)


def _carry_out(agent: Agent, host: Host, call: ToolCall) -> ToolOutput:
    approve_call = getattr(host, "approve_call", None)
    if call.ask and approve_call is not None and not approve_call(call):
        return ToolOutput.declined()
    if call.tool == DELEGATE:
        return _delegate(agent, host, call)
    if call.tool == READ_SKILL_FILE:
        return _read_skill_file(agent, call)
    try:
        output = host.run_tool(call)
    except Exception as error:  # noqa: BLE001 - a tool's failure is told to the model
        return ToolOutput.error(str(error) or type(error).__name__)
    if not isinstance(output, ToolOutput):
        return ToolOutput.error(f"the tool returned {type(output).__name__}, not a ToolOutput")
    return output


def _delegate(agent: Agent, host: Host, call: ToolCall) -> ToolOutput:
    child = agent.start_child(call)
    outcome = _drive(child, host, child.resume())
    if outcome.stop is Stop.DONE:
        return ToolOutput.ok(outcome.summary)
    return ToolOutput.error(f"the specialist stopped: {outcome.stop.label()}: {outcome.summary}")


def _read_skill_file(agent: Agent, call: ToolCall) -> ToolOutput:
    # Imported here: the rest of agent_core never loads the module that touches the disk.
    from agent_core.skill_files import read_part  # noqa: PLC0415

    skill = agent.skill(str(call.args.get("skill")))
    if skill is None:
        return ToolOutput.error(f"no skill named {call.args.get('skill')!r} is loaded")
    path, offset = str(call.args.get("path")), int(call.args.get("offset", 0))
    limit = call.args.get("limit")
    return (
        read_part(skill, path, offset)
        if limit is None
        else read_part(skill, path, offset, int(limit))
    )
