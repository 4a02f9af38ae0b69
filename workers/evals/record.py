"""`relay eval record RUN`: a run that happened on the fleet, as a case of a suite.

The case asks the run's task with the run's tools and config (where it differs
from the app's), answers its questions as the person did, denies the tools whose
calls were declined, and stands in for every tool with the outcome each call had,
read from the run's journal (the specialists' calls too): an eval of the case
touches nothing. It expects the run's stop and the tools it called; a person adds
the checks that say what *right* means for it.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

from workers.errors import RelayError
from workers.evals.suite import read_suite
from workers.relay import Relay

__all__ = ["record_case", "toml_value"]

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_CASE_NAME = re.compile(r"[^\w .:/-]")


def record_case(relay: Relay, run_id: str, name: str | None = None) -> str:
    """The run as a `[[case]]` of a suite, in TOML (it reads back as a suite).

    Raises:
        RelayError: no such run, it has not ended, or its journal cannot be read.
    """
    status = relay.status(run_id)
    if status.outcome is None:
        raise RelayError(f"run {run_id} has not ended: record it once it has")
    made = relay.tool_calls(run_id)
    case: dict[str, Any] = {
        "name": _CASE_NAME.sub("-", name or f"run-{run_id}")[:80],
        "task": status.task,
    }
    found = relay.store.read(run_id)
    if found is not None:
        record = found[0]
        if record.tools is not None:
            case["tools"] = list(record.tools)
        dumped = record.config.model_dump(mode="json")
        changed = {
            field: dumped[field]
            for field in type(record.config).model_fields
            if getattr(record.config, field) != getattr(relay.config, field)
        }
        if changed:
            case["config"] = changed
    declined = sorted({c.tool for c in made if c.output and c.output.status == "declined"})
    if declined:
        case["deny"] = declined
    answers = [e.text for e in relay.trace(run_id) if e.kind == "answer"]
    if answers:
        case["answers"] = answers
    case["recorded"] = _recorded(made)
    called = list(dict.fromkeys(c.tool for c in made))
    case["expect"] = {"stop": status.outcome.stop.value, **({"called": called} if called else {})}
    text = _case_toml(case, run_id)
    read_suite(text.encode(), f"the case recorded from {run_id}")  # (it must read back)
    return text


def _recorded(made: list[Any]) -> list[dict[str, Any]]:
    """One outcome per distinct call that had one (ok or error), in the order made."""
    seen: set[str] = set()
    found = []
    for call in made:
        if call.output is None or call.output.status not in ("ok", "error"):
            continue
        key = json.dumps([call.tool, call.args], sort_keys=True, default=str)
        if key in seen:
            continue
        seen.add(key)
        one = {"tool": call.tool, "args": call.args, "output": call.output.text}
        found.append({**one, "error": True} if call.output.status == "error" else one)
    return found


def _case_toml(case: dict[str, Any], run_id: str) -> str:
    lines = [f"# Recorded from run {run_id}: add the checks that say what right means.", "[[case]]"]
    for key, value in case.items():
        if key in ("recorded", "expect"):
            continue
        lines.append(f"{_key(key)} = {toml_value(value)}")
    lines.append("recorded = [")
    lines += [f"    {toml_value(one)}," for one in case["recorded"]]
    lines.append("]")
    lines += [f"expect.{_key(k)} = {toml_value(v)}" for k, v in case["expect"].items()]
    return "\n".join(lines) + "\n"


def _key(key: str) -> str:
    return key if _BARE_KEY.fullmatch(key) else _string(key)


def _string(text: str) -> str:
    """A TOML basic string: quotes, backslashes and control characters escaped."""
    out = []
    for char in text:
        if char in ('"', "\\"):
            out.append("\\" + char)
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            out.append(f"\\u{ord(char):04x}")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


def toml_value(value: object) -> str:
    """A value in TOML's inline form (a None in a table is left out: TOML has no null)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return _number(value)
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, Mapping):
        items = [f"{_key(str(k))} = {toml_value(v)}" for k, v in value.items() if v is not None]
        return "{ " + ", ".join(items) + " }" if items else "{}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value if v is not None) + "]"
    raise RelayError(f"a recorded value of type {type(value).__name__} cannot be written as TOML")


def _number(value: int | float) -> str:
    if isinstance(value, int) or math.isfinite(value):
        return repr(value)
    return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
