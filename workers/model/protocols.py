"""Speaking a route's protocol: what a request adds for it, and what a reply in it says.

The agent reads one JSON object per reply (`agent_core.reply`). A route's `protocol`
says how its server is asked for that object:

    text    the request as the core wrote it, byte for byte; the reply's text is read
    json    plus `response_format`: a JSON schema of exactly the objects this request
            allows (`reply_schema`), so a server that constrains its decoding (vLLM,
            llama.cpp, Ollama, OpenAI) cannot break the format
    tools   plus `tools`: each tool offered is a function, and so is every other form
            allowed (`final_answer`, `submit_plan`, `ask_user`), with `tool_choice:
            "required"`; the calls the server makes are written back as the object
            the core reads (`reply_text`), so the core never knows

What a request allows is its `ModelRequest.reply` (`agent_core.steps.ReplyShape`); a
request without one (a summary, the rest of a cut reply) is plain text on every route.

Choices. The schema is not `strict`: OpenAI's strict mode wants every property
required, so an optional argument could only be written as null, and its root an
object, not a choice of forms. `tool_choice` is "required": every form the core reads
is a function, so nothing is lost, and a server holding the model to a call cannot get
prose back (with "auto" a model that read the system text would write the JSON in its
content, and the functions would be for nothing); a server that ignores it and answers
in prose is read as text. The function arguments of `final_answer`, `submit_plan` and
`ask_user` are the core's own objects (`{"final": ...}`), so what the model writes
through them is the reply itself, other keys beside `final` kept.

Malformed calls (arguments that are not a JSON object, a function nobody offered, a
`tool_calls` that is not a list) are written as objects the core refuses with a reason
the model is shown, never an exception: see `reply_text`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict

from agent_core.steps import OfferedTool, ReplyShape
from agent_core.tools import Kind
from workers.settings import ModelProtocol

__all__ = [
    "CallPieces",
    "FunctionCall",
    "functions",
    "protocol_fields",
    "refuses",
    "reply_schema",
    "reply_text",
]

SHOWN_CHARS = 200
"""How much of unusable arguments the reply object quotes."""

_TYPES = {
    Kind.TEXT: "string",
    Kind.NUMBER: "number",
    Kind.INTEGER: "integer",
    Kind.BOOLEAN: "boolean",
    Kind.LIST: "array",
    Kind.OBJECT: "object",
}
_FORMS = (("plan", "submit_plan"), ("ask_user", "ask_user"), ("final", "final_answer"))
"""Each form's key in the reply object, and the function that stands for it."""
_REFUSALS = {
    "json": re.compile(r"response[_ ]?format|json[_ ]?schema", re.IGNORECASE),
    "tools": re.compile(r"\btools?\b|tool[_ ]?choice|function[_ ]?call", re.IGNORECASE),
}


class FunctionCall(BaseModel):
    """One function a model server called: its name ("" when the call named none) and
    its arguments as the server wrote them (JSON text, if it is well formed)."""

    model_config = ConfigDict(frozen=True)

    name: str
    arguments: str


# --- the request ------------------------------------------------------------------------


def protocol_fields(protocol: ModelProtocol, shape: ReplyShape | None) -> dict[str, Any]:
    """Return the fields a request's body gains in `protocol` (none for text, or for a
    request whose reply is plain text)."""
    if shape is None or protocol == "text":
        return {}
    if protocol == "json":
        named = {"name": "reply", "strict": False, "schema": reply_schema(shape)}
        return {"response_format": {"type": "json_schema", "json_schema": named}}
    return {"tools": functions(shape), "tool_choice": "required"}


def refuses(protocol: ModelProtocol, status: int | None, message: str) -> bool:
    """Whether an answer says the server does not take `protocol`'s fields: a 400 or 422
    that names them (another 400, an unknown model say, is not one)."""
    pattern = _REFUSALS.get(protocol)
    return pattern is not None and status in (400, 422) and bool(pattern.search(message))


def reply_schema(shape: ReplyShape) -> dict[str, Any]:
    """Return the JSON schema of the reply objects `shape` allows, and only those."""
    forms: list[dict[str, Any]] = []
    if shape.plan_steps:
        forms.append(_closed({"plan": _plan(shape)}))
    forms += [_call(tool) for tool in shape.tools]
    batched = [_call(tool) for tool in shape.tools if not tool.alone]
    if shape.batch > 1 and batched:
        calls = {"type": "array", "items": {"anyOf": batched}, "minItems": 1}
        forms.append(_closed({"tools": calls | {"maxItems": shape.batch}}))
    if shape.ask_user:
        forms.append(_closed({"ask_user": {"type": "string", "minLength": 1}}))
    final = {"type": "object", "properties": {"final": {"type": "string"}}, "required": ["final"]}
    forms.append(final)  # open: other keys beside final are kept
    return forms[0] if len(forms) == 1 else {"anyOf": forms}


def functions(shape: ReplyShape) -> list[dict[str, Any]]:
    """Return the functions `shape` allows: each tool, then each other form allowed."""
    names = {key: name for name, key in _form_names(shape).items()}
    listed = [_function(tool.name, tool.description, args_schema(tool)) for tool in shape.tools]
    if shape.plan_steps:
        what = "Propose your plan, when you are asked for it."
        listed.append(_function(names["plan"], what, _closed({"plan": _plan(shape)})))
    if shape.ask_user:
        what = "Ask the person, only when you cannot go on without the answer."
        question = {"type": "string", "minLength": 1, "description": "The question"}
        listed.append(_function(names["ask_user"], what, _closed({"ask_user": question})))
    what = "Finish: when the task is done. Other arguments beside final are kept."
    final = {"type": "string", "description": "What you did, or the answer"}
    parameters = {"type": "object", "properties": {"final": final}, "required": ["final"]}
    listed.append(_function(names["final"], what, parameters))
    return listed


def args_schema(tool: OfferedTool) -> dict[str, Any]:
    """Return the JSON schema of a tool's arguments, as its `Arg`s declare them."""
    properties: dict[str, Any] = {}
    for arg in tool.args:
        properties[arg.name] = {"type": _TYPES[arg.kind]} | (
            {"description": arg.help} if arg.help else {}
        )
    required = [arg.name for arg in tool.args if arg.required]
    return {"type": "object", "properties": properties, "required": required} | {
        "additionalProperties": False
    }


def _call(tool: OfferedTool) -> dict[str, Any]:
    name = {"type": "string", "enum": [tool.name]}
    return _closed({"tool": name, "args": args_schema(tool)}, description=tool.description)


def _plan(shape: ReplyShape) -> dict[str, Any]:
    step = {"type": "string", "minLength": 1}
    return {"type": "array", "items": step, "minItems": 1, "maxItems": shape.plan_steps}


def _closed(properties: dict[str, Any], description: str = "") -> dict[str, Any]:
    """An object with exactly these properties, each required."""
    said = {"description": description} if description else {}
    return said | {
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
    }


def _function(name: str, description: str, parameters: dict[str, Any]) -> dict[str, Any]:
    function = {"name": name, "description": description, "parameters": parameters}
    return {"type": "function", "function": function}


def _form_names(shape: ReplyShape | None) -> dict[str, str]:
    """The function standing for each form, by name: a tool of the same name keeps its
    own, and the form's takes a `_` in front."""
    taken = {tool.name for tool in shape.tools} if shape is not None else set()
    names: dict[str, str] = {}
    for key, wanted in _FORMS:
        name = wanted
        while name in taken:
            name = f"_{name}"
        names[name] = key
    return names


# --- the reply --------------------------------------------------------------------------


class CallPieces:
    """The function calls of a reply (`message.tool_calls`), or of a streamed one put
    together from its pieces (`delta.tool_calls`: a call's `index`, its name, and its
    arguments in pieces to join). Whatever the server sends, nothing here raises."""

    def __init__(self) -> None:
        self._calls: dict[int, list[str]] = {}
        self._bad: list[FunctionCall] = []

    def add(self, value: object, *, whole: bool) -> None:
        """Take one `tool_calls` value: every entry a call of its own when `whole` (a
        reply's message), else pieces of the calls their `index` names (a delta)."""
        if not isinstance(value, list):
            self._bad.append(FunctionCall(name="", arguments=_excerpt(value)))
            return
        for entry in value:
            function = entry.get("function") if isinstance(entry, dict) else None
            if not isinstance(function, dict):
                self._bad.append(FunctionCall(name="", arguments=_excerpt(entry)))
                continue
            name, arguments = function.get("name"), function.get("arguments")
            index = entry.get("index") if not whole else None
            if not isinstance(index, int) or isinstance(index, bool):
                new = whole or isinstance(name, str) or not self._calls
                index = len(self._calls) if new else max(self._calls)
            call = self._calls.setdefault(index, ["", ""])
            call[0] += name if isinstance(name, str) else ""
            call[1] += _arguments_text(arguments)

    def calls(self) -> tuple[FunctionCall, ...]:
        """The calls so far, in order, then those too malformed to have a place."""
        ordered = [self._calls[index] for index in sorted(self._calls)]
        made = tuple(FunctionCall(name=name, arguments=arguments) for name, arguments in ordered)
        return made + tuple(self._bad)

    def size(self) -> int:
        """Characters of the calls' names and arguments (what a reply's tokens are
        estimated from, when the server does not say)."""
        return sum(len(name) + len(arguments) for name, arguments in self._calls.values())


def reply_text(shape: ReplyShape | None, calls: Sequence[FunctionCall], *, cut: bool) -> str:
    """Return the reply object `calls` stand for, as the text the core reads.

    One call of a tool is `{"tool": name, "args": {...}}`, several `{"tools": [...]}`;
    a form's function gives its arguments (`{"final": ...}`). What the core must refuse
    is written so that it says why: arguments that are not an object become a text
    `args` ("args must be a JSON object"), a function nobody offered a tool of that
    name ("there is no tool named ..."), a call naming no function an empty tool name,
    a form mixed with other calls an object with both keys ("use exactly one"). A lone
    call `cut` by the length limit is left open where it stops, so the core asks for
    the rest.
    """
    forms = _form_names(shape)
    if cut and len(calls) == 1 and _object(calls[0].arguments) is None:
        call = calls[0]
        if call.name in forms:
            return call.arguments  # a form's arguments are the reply object itself
        return f'{{"tool": {_dumps(call.name)}, "args": {call.arguments}'
    parts: list[str] = []
    tools: list[dict[str, Any]] = []
    for call in calls:
        args = _object(call.arguments)
        key = forms.get(call.name)
        if key is not None and args is not None:
            given = {key: None} | args  # its own key first; left out, the core says so
            parts += [f"{_dumps(name)}: {_dumps(value)}" for name, value in given.items()]
        else:
            tools.append(
                {"tool": call.name, "args": _shown(call.arguments) if args is None else args}
            )
    if len(tools) == 1 and not parts:
        return _dumps(tools[0])
    if tools:
        parts.append(f'"tools": {_dumps(tools)}')
    return "{" + ", ".join(parts) + "}"  # keys written twice stay twice: the core refuses them


def _object(arguments: str) -> dict[str, Any] | None:
    """The arguments as an object (none written is an empty one), or None."""
    if not arguments.strip():
        return {}
    try:
        value = json.loads(arguments)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def _arguments_text(value: object) -> str:
    """Arguments as JSON text: some servers send an object instead of its text."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):  # pragma: no cover - parsed JSON always dumps
        return ""


def _shown(arguments: str) -> str:
    return arguments if len(arguments) <= SHOWN_CHARS else arguments[: SHOWN_CHARS - 1] + "…"


def _excerpt(value: object) -> str:
    return _shown(json.dumps(value, ensure_ascii=False, default=str))


def _dumps(value: object) -> str:
    return json.dumps(value, ensure_ascii=False)
