"""Checking the model's arguments against a tool's declared ones.

Each failure raises `ToolArgsError` with a sentence for the model; the agent
turns it into a retry. Values are coerced the way a careful reader would:
numbers written as text become numbers, `"true"`/`"false"` become booleans,
an INTEGER refuses 2.5, unknown extra arguments are dropped, and an optional
argument left out (or given as null) is absent from the result.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

from agent_core.errors import ToolArgsError, UsageError
from agent_core.tools import Arg, Kind, Tool

__all__ = ["check_args"]

MAX_NUMBER_TEXT = 64


def _text(arg: Arg, value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool | int | float) and not _non_finite(value):
        return json.dumps(value)
    raise ToolArgsError(f"'{arg.name}' must be text, got {_kind_of(value)}")


def _number_from_text(arg: Arg, value: str) -> int | float:
    text = value.strip()
    if not text or len(text) > MAX_NUMBER_TEXT:
        raise ToolArgsError(f"'{arg.name}' must be a number, got {_show(value)}")
    try:
        return int(text)
    except ValueError:
        pass
    try:
        number = float(text)
    except ValueError:
        raise ToolArgsError(f"'{arg.name}' must be a number, got {_show(value)}") from None
    if _non_finite(number):
        raise ToolArgsError(f"'{arg.name}' must be a finite number, got {_show(value)}")
    return number


def _number(arg: Arg, value: Any) -> int | float:
    if isinstance(value, str):
        return _number_from_text(arg, value)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ToolArgsError(f"'{arg.name}' must be a number, got {_kind_of(value)}")
    if _non_finite(value):
        raise ToolArgsError(f"'{arg.name}' must be a finite number")
    return value


def _integer(arg: Arg, value: Any) -> int:
    number = _number(arg, value)
    if isinstance(number, float):
        if not number.is_integer():
            raise ToolArgsError(f"'{arg.name}' must be a whole number, got {number!r}")
        return int(number)
    return number


def _boolean(arg: Arg, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise ToolArgsError(f"'{arg.name}' must be true or false, got {_show(value)}")


def _list(arg: Arg, value: Any) -> list[Any]:
    if isinstance(value, list):
        return value
    raise ToolArgsError(f"'{arg.name}' must be a JSON list, got {_kind_of(value)}")


def _object(arg: Arg, value: Any) -> dict[str, Any]:
    if isinstance(value, dict):
        return value
    raise ToolArgsError(f"'{arg.name}' must be a JSON object, got {_kind_of(value)}")


_COERCE: dict[Kind, Callable[[Arg, Any], Any]] = {
    Kind.TEXT: _text,
    Kind.NUMBER: _number,
    Kind.INTEGER: _integer,
    Kind.BOOLEAN: _boolean,
    Kind.LIST: _list,
    Kind.OBJECT: _object,
}


def _non_finite(value: float | int | bool) -> bool:
    return isinstance(value, float) and not math.isfinite(value)


def _kind_of(value: Any) -> str:
    names = {bool: "a boolean", int: "a number", float: "a number", str: "text"}
    names |= {list: "a list", dict: "an object", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def _show(value: Any) -> str:
    shown = json.dumps(value, ensure_ascii=False) if isinstance(value, str) else _kind_of(value)
    return shown if len(shown) <= 40 else shown[:37] + '..."'


def check_args(tool: Tool, given: dict[str, Any]) -> dict[str, Any]:
    """Return `given` checked and coerced against `tool`'s declared arguments.

    Raises:
        ToolArgsError: an argument is missing or of the wrong type, or the
            tool's own `validate` function refused the arguments.
        UsageError: the tool's `validate` function returned something other
            than a JSON-ready dict (a bug in the host, not the model).
    """
    checked: dict[str, Any] = {}
    for arg in tool.args:
        value = given.get(arg.name)
        if value is None:
            if arg.required:
                hint = f" ({arg.help})" if arg.help else ""
                raise ToolArgsError(f"'{arg.name}' is required: {arg.kind.value}{hint}")
            continue
        checked[arg.name] = _COERCE[arg.kind](arg, value)
    if tool.validator is None:
        return checked
    result = tool.validator(dict(checked))
    if not isinstance(result, dict):
        raise UsageError(f"validate for tool {tool.name!r} must return the arguments as a dict")
    try:
        json.dumps(result)
    except (TypeError, ValueError):
        raise UsageError(
            f"validate for tool {tool.name!r} returned arguments that are not JSON"
        ) from None
    return result
