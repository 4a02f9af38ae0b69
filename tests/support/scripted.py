"""A scripted model for agent_core tests: replies written in advance, no mocks.

Two ways to use it:

- `Script` is a `Host` for `agent_core.run`: it plays its replies in order,
  records every request and call, and runs tools through plain functions.
- The reply builders (`plan`, `call`, `batch`, `final`) and the step helpers
  (`begin`, `prompt_of`, `finish_batch`) drive an `Agent` by hand, one step at
  a time, when a test needs to look between steps.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from agent_core import Agent, Ask, ModelRequest, Plan, Run, Step, Summarize, ToolCall, ToolOutput

__all__ = [
    "Script",
    "ScriptExhaustedError",
    "ToolFn",
    "batch",
    "begin",
    "call",
    "final",
    "finish_batch",
    "plan",
    "prompt_of",
]

ToolFn = Callable[[dict[str, Any]], "str | ToolOutput"]


# --- what the model writes ---------------------------------------------------------------


def plan(*steps: str) -> str:
    """Return a plan reply."""
    return json.dumps({"plan": list(steps)})


def call(tool: str, **args: Any) -> str:
    """Return a one-call reply."""
    return json.dumps({"tool": tool, "args": args})


def batch(*calls: tuple[str, Mapping[str, Any]]) -> str:
    """Return a batch reply from (tool, args) pairs."""
    return json.dumps({"tools": [{"tool": t, "args": dict(a)} for t, a in calls]})


def final(text: str, **extra: Any) -> str:
    """Return a final reply; `extra` keys sit beside `final` in the object."""
    return json.dumps({"final": text, **extra})


# --- a host that plays a script ------------------------------------------------------------


class ScriptExhaustedError(BaseException):
    """Raised when the agent asks the model more often than the script has replies.

    A BaseException on purpose: `run` turns an ordinary exception from
    `ask_model` into a failed model call, which would hide the mistake.
    """


class Script:
    """A `Host` for `agent_core.run` that plays `replies` in order.

    A reply that is an exception is raised from `ask_model` (a failed model
    call). `tools` maps a tool name to a function of the call's arguments that
    returns text (ok) or a `ToolOutput`; a raising function is the host's
    problem and is reported by `run` as an error output. A tool without a
    function answers `ok("<tool> done")`.

    The optional host methods (`approve_plan`, `approve_call`, `ask_person`,
    `summarize`) exist only when given, so the driver's defaults can be tested.
    Every request the model sees is in `requests` (summaries included), every
    call the host ran is in `calls`.
    """

    def __init__(
        self,
        replies: Iterable[str | BaseException],
        *,
        tools: Mapping[str, ToolFn] | None = None,
        approve_plan: Callable[[list[str]], bool] | None = None,
        approve_call: Callable[[ToolCall], bool] | None = None,
        ask_person: Callable[[str], str] | None = None,
        summarize: Callable[[ModelRequest], str] | None = None,
    ) -> None:
        self.replies = list(replies)
        self.tools = dict(tools or {})
        self.requests: list[ModelRequest] = []
        self.calls: list[ToolCall] = []
        optional = {
            "approve_plan": approve_plan,
            "approve_call": approve_call,
            "ask_person": ask_person,
            "summarize": summarize,
        }
        for name, fn in optional.items():
            if fn is not None:
                setattr(self, name, fn)

    def ask_model(self, request: ModelRequest) -> str:
        """Return the next scripted reply (or raise it, when it is an exception)."""
        self.requests.append(request)
        if not self.replies:
            raise ScriptExhaustedError(
                f"the script ran out of replies; the last prompt was:\n{request.prompt}"
            )
        reply = self.replies.pop(0)
        if isinstance(reply, BaseException):
            raise reply
        return reply

    def run_tool(self, call: ToolCall) -> ToolOutput:
        """Run `call` through its function, or answer that it was done."""
        self.calls.append(call)
        fn = self.tools.get(call.tool)
        if fn is None:
            return ToolOutput.ok(f"{call.tool} done")
        output = fn(dict(call.args))
        return output if isinstance(output, ToolOutput) else ToolOutput.ok(output)

    @property
    def prompts(self) -> list[str]:
        """Return the prompt of every request, in order."""
        return [r.prompt for r in self.requests]


# --- driving an Agent by hand -----------------------------------------------------------


def prompt_of(step: Step) -> str:
    """Return the prompt of an `Ask` or `Summarize` step (fails the test on any other)."""
    assert isinstance(step, Ask | Summarize), f"expected a model request, got {step!r}"
    return step.request.prompt


def begin(
    agent: Agent, task: str = "Copy notes.txt to backup.txt", *steps: str, context: str = ""
) -> Step:
    """Start `agent`; when `steps` are given, reply with them as the plan and approve it.

    Returns the step after that (an `Ask` for the first move, normally).
    """
    step = agent.start(task, context)
    if steps:
        assert isinstance(step, Ask), f"expected the plan to be asked for, got {step!r}"
        step = agent.reply(plan(*steps))
        assert isinstance(step, Plan), f"expected the plan for review, got {step!r}"
        step = agent.approve_plan(True)
    return step


def finish_batch(
    agent: Agent,
    step: Step,
    output: Callable[[ToolCall], ToolOutput] = lambda c: ToolOutput.ok(f"{c.tool} done"),
    *,
    reverse: bool = False,
) -> Step:
    """Give a result to every call of the batch `step` runs; returns the step after the last.

    With `reverse`, the results arrive newest call first.
    """
    assert isinstance(step, Run), f"expected a batch to run, got {step!r}"
    calls = [step.call, *agent.queued()]
    for each in reversed(calls) if reverse else calls:
        step = agent.result(each.id, output(each))
    return step
