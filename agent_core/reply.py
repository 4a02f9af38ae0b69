"""Reading the model's reply: one small JSON object, found in whatever it wrote.

The model's text is untrusted. Parsing is linear in its length: `<think>`
blocks are cut with `str.find`, and the first complete JSON object is found by
decoding at each candidate `{` and, on failure, resuming the search at the
point where the decoder gave up (a `{` before that point lies inside text that
already failed to parse the same way). Only a `{` followed by `"` or `}` can
open an object, and at most MAX_CANDIDATES candidates are decoded: the json
module's error message costs time linear in the error's offset, so an unbounded
number of failures would be quadratic. Nothing here raises: every failure is an
`Unusable` with a reason the model is shown.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from agent_core.text import clean

__all__ = [
    "NO_OBJECT",
    "AskUserReply",
    "CallReply",
    "FinalReply",
    "PlanReply",
    "RawCall",
    "Reply",
    "Unusable",
    "ends_inside_object",
    "parse_reply",
]

PROTOCOL_KEYS = ("plan", "tool", "tools", "final", "ask_user")
MAX_NUMBER_DIGITS = 400
MAX_NESTING = 500
"""Deepest bracket nesting the scanner follows while looking for a candidate's end."""
MAX_OBJECT_DEPTH = 64
"""Deepest nesting an accepted object may have; deeper data could not be saved and restored."""
MAX_CANDIDATES = 64
"""Candidate objects decoded at most: the first usable one wins."""
SHOWN_CHARS = 80
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
NO_OBJECT = "no complete JSON object was found in your reply"
"""Why a reply without one whole object is unusable; a reply cut short says this too."""


@dataclass(frozen=True)
class RawCall:
    """A call as the model wrote it: a tool name and arguments not yet checked."""

    tool: str
    args: dict[str, Any]


@dataclass(frozen=True)
class PlanReply:
    steps: list[str]


@dataclass(frozen=True)
class CallReply:
    calls: list[RawCall]


@dataclass(frozen=True)
class FinalReply:
    text: str
    data: dict[str, Any]


@dataclass(frozen=True)
class AskUserReply:
    question: str


@dataclass(frozen=True)
class Unusable:
    reason: str


Reply = PlanReply | CallReply | FinalReply | AskUserReply | Unusable


class _RefusedError(ValueError):
    """An object that decodes but must not be used (duplicate keys, NaN, a huge number)."""


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result = dict(pairs)
    if len(result) != len(pairs):
        seen: set[str] = set()
        twice = next(k for k, _ in pairs if k in seen or seen.add(k))  # type: ignore[func-returns-value]
        raise _RefusedError(f"the key {_shown(twice)!r} appears twice in one object")
    return result


def _constant(name: str) -> Any:
    raise _RefusedError(f"{name} is not a JSON number")


def _integer(digits: str) -> int:
    if len(digits) > MAX_NUMBER_DIGITS:
        raise _RefusedError(f"a number has {len(digits)} digits")
    return int(digits)


def _real(digits: str) -> float:
    if len(digits) > MAX_NUMBER_DIGITS:
        raise _RefusedError(f"a number has {len(digits)} digits")
    return float(digits)


_DECODER = json.JSONDecoder(
    object_pairs_hook=_pairs,
    parse_constant=_constant,
    parse_int=_integer,
    parse_float=_real,
    strict=False,  # models put raw newlines inside strings; accept them
)


def strip_thinking(text: str) -> str:
    """Return `text` without `<think>…</think>` blocks.

    A `</think>` before any `<think>` means the server dropped the opening tag:
    everything up to it is thinking. An unclosed `<think>` hides the rest.
    """
    first_close = _dropped_opening(text)
    if first_close != -1:
        text = text[first_close + len(THINK_CLOSE) :]
    kept: list[str] = []
    start = 0
    while True:
        opened = text.find(THINK_OPEN, start)
        if opened == -1:
            kept.append(text[start:])
            break
        kept.append(text[start:opened])
        closed = text.find(THINK_CLOSE, opened)
        if closed == -1:
            break
        start = closed + len(THINK_CLOSE)
    return "".join(kept)


def _dropped_opening(text: str) -> int:
    """Where the first `</think>` is if no `<think>` comes before it (the server dropped
    the opening tag: what precedes it is thinking), else -1."""
    close = text.find(THINK_CLOSE)
    opened = text.find(THINK_OPEN)
    return close if opened == -1 or close < opened else -1


def _past_deep_nesting(text: str, start: int) -> int:
    """Return where nesting from `start` passes MAX_NESTING, or where it closes.

    Used after the decoder hit its recursion limit, so the search resumes past
    the deep part instead of retrying every `{` inside it.
    """
    depth = 0
    index = start
    while index < len(text):
        char = text[index]
        if char == '"':
            index = _string_end(text, index)
            continue
        if char in "{[":
            depth += 1
            if depth > MAX_NESTING:
                return index
        elif char in "}]":
            depth -= 1
            if depth <= 0:
                return index + 1
        index += 1
    return len(text)


def _string_end(text: str, quote: int) -> int:
    """Return the index just past the JSON string opened at `quote` (or the end of text)."""
    index = quote + 1
    while True:
        index = text.find('"', index)
        if index == -1:
            return len(text)
        backslashes = 0
        while text[index - 1 - backslashes] == "\\":
            backslashes += 1
        index += 1
        if backslashes % 2 == 0:
            return index


def _can_open_object(text: str, brace: int) -> bool:
    rest = text[brace + 1 : brace + 64].lstrip()
    return rest[:1] in ('"', "}")


def first_object(text: str) -> dict[str, Any] | Unusable:
    """Return the first complete JSON object in `text` outside thinking, or why there is none.

    A `<think>` or `</think>` counts as a tag only outside an object: inside a
    JSON string of the reply it is text (a final may quote the tag), which is
    how `stream.FinalStream` reads it too. A `</think>` with no `<think>` before
    it closes thinking whose opening tag the server dropped, unless an object
    that starts before it decodes across it.
    """
    scan = _Scan(text)
    start = 0
    close = _dropped_opening(text)
    if close != -1:
        found = scan.objects(0, close, spanning=close)
        if found is not None:
            return found
        start = close + len(THINK_CLOSE)
    while True:
        opened = text.find(THINK_OPEN, start)
        found = scan.objects(start, len(text) if opened == -1 else opened)
        if found is not None:
            return found
        if opened == -1:
            return Unusable(NO_OBJECT)
        closed = text.find(THINK_CLOSE, opened + len(THINK_OPEN))
        if closed == -1:
            return Unusable(NO_OBJECT)  # an unclosed <think> hides the rest
        start = max(closed + len(THINK_CLOSE), scan.resume)


class _Scan:
    """Decodes candidate objects of one text, at most MAX_CANDIDATES in all."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.attempts = 0
        self.resume = 0

    def objects(
        self, start: int, until: int, spanning: int = -1
    ) -> dict[str, Any] | Unusable | None:
        """Return the first object starting in [start, until) and ending past `spanning`.

        A refusal is returned as it is; None when no candidate there decodes.
        """
        text = self.text
        candidate = text.find("{", start, until)
        while candidate != -1 and self.attempts < MAX_CANDIDATES:
            if not _can_open_object(text, candidate):
                candidate = text.find("{", candidate + 1, until)
                continue
            self.attempts += 1
            try:
                value, end = _DECODER.raw_decode(text, candidate)
            except _RefusedError as refused:
                return Unusable(f"your JSON could not be used: {refused}")
            except json.JSONDecodeError as error:
                self.resume = max(error.pos, candidate + 1)
            except RecursionError:
                self.resume = max(_past_deep_nesting(text, candidate), candidate + 1)
            else:
                if isinstance(value, dict) and end > spanning:
                    return _accepted(value, text)
                self.resume = end if isinstance(value, dict) else candidate + 1
            candidate = text.find("{", self.resume, until)
        return None


def _accepted(value: dict[str, Any], text: str) -> dict[str, Any] | Unusable:
    if _depth_over(value, MAX_OBJECT_DEPTH):
        return Unusable(f"your JSON is nested more than {MAX_OBJECT_DEPTH} levels deep")
    return _clean_strings(value) if "\\u" in text else value


def ends_inside_object(text: str) -> bool:
    """Return whether `text` is no usable reply and ends inside a JSON object it opened.

    That is a reply cut off on its way (a stream a gateway ended early), not a
    reply the model got wrong: the host can take it as a dropped connection and
    ask again instead of showing the model its own half object. Linear in the
    text: each candidate is scanned from where the last one closed.
    """
    if not isinstance(parse_reply(text), Unusable):
        return False
    text = clean(text)
    # A `</think>` read as a dropped opening tag's close is text of an object opened before
    # it that never closes (`{"final": "</think>` is cut off), as `first_object` reads a
    # tag that an object decodes across.
    close = _dropped_opening(text)
    if close != -1 and _left_open(text, close):
        return True
    text = strip_thinking(text)
    return _left_open(text, len(text))


def _left_open(text: str, before: int) -> bool:
    """Whether an object opened in `text` before index `before` is never closed."""
    last = len(text.rstrip()) - 1
    candidate = text.find("{", 0, before)
    while candidate != -1:
        if candidate == last:
            return True  # the text ends at the brace
        if not _can_open_object(text, candidate):
            candidate = text.find("{", candidate + 1, before)
            continue
        closed = _closing(text, candidate)
        if closed is None:
            return True
        candidate = text.find("{", closed, before)
    return False


def _closing(text: str, start: int) -> int | None:
    """Return the index just past the brackets opened at `start`, or None if the text
    ends before they (or a string inside them) close."""
    depth = 0
    index = start
    while index < len(text):
        char = text[index]
        if char == '"':
            index = _string_end(text, index)  # a string running to the end leaves it open
            continue
        if char in "{[":
            depth += 1
        elif char in "}]":
            depth -= 1
            if depth <= 0:
                return index + 1
        index += 1
    return None


def _depth_over(found: dict[str, Any], limit: int) -> bool:
    """Return whether `found` nests deeper than `limit` (iteratively: no recursion limit)."""
    pending: list[tuple[Any, int]] = [(found, 1)]
    while pending:
        value, depth = pending.pop()
        if depth > limit:
            return True
        children = value.values() if isinstance(value, dict) else value
        pending.extend((c, depth + 1) for c in children if isinstance(c, dict | list))
    return False


def _shown(text: str) -> str:
    """Return `text` short enough to quote back to the model."""
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 1] + "…"


def _clean_strings(found: dict[str, Any]) -> dict[str, Any]:
    """Return `found` with lone surrogates (from `\\udXXX` escapes) replaced, iteratively."""
    pending: list[dict[str, Any] | list[Any]] = [found]
    while pending:
        container = pending.pop()
        keys: Any = container.keys() if isinstance(container, dict) else range(len(container))
        for key in list(keys):
            value = container[key]
            if isinstance(value, str):
                container[key] = clean(value)
            elif isinstance(value, dict | list):
                pending.append(value)
        if isinstance(container, dict) and any(clean(k) != k for k in container):
            cleaned = {clean(k): v for k, v in container.items()}
            container.clear()
            container.update(cleaned)
    return found


def parse_reply(text: str) -> Reply:
    """Return what the model's reply means, or why it cannot be used."""
    found = first_object(clean(text))
    if isinstance(found, Unusable):
        return found
    keys = [k for k in PROTOCOL_KEYS if k in found]
    if not keys:
        return Unusable('your JSON object has none of the keys "plan", "tool", "tools", "final"')
    if len(keys) > 1:
        named = ", ".join(f'"{k}"' for k in keys)
        return Unusable(f"your JSON object has {named}: use exactly one of them per reply")
    return _READERS[keys[0]](found)


def _read_plan(found: dict[str, Any]) -> Reply:
    steps = found["plan"]
    if not isinstance(steps, list) or not steps:
        return Unusable('"plan" must be a non-empty list of short texts')
    if not all(isinstance(s, str) and s.strip() for s in steps):
        return Unusable('every step of "plan" must be a non-empty text')
    return PlanReply([s.strip() for s in steps])


def _read_call(entry: Any) -> RawCall | Unusable:
    if not isinstance(entry, dict):
        return Unusable('each call must be an object like {"tool": "name", "args": {...}}')
    name, args = entry.get("tool"), entry.get("args")
    if not isinstance(name, str) or not name:
        return Unusable('"tool" must be the name of a tool, as text')
    if args is None:
        args = {}
    if not isinstance(args, dict):
        return Unusable(f'"args" of {_shown(name)} must be a JSON object')
    return RawCall(name, args)


def _read_tool(found: dict[str, Any]) -> Reply:
    call = _read_call(found)
    return call if isinstance(call, Unusable) else CallReply([call])


def _read_tools(found: dict[str, Any]) -> Reply:
    entries = found["tools"]
    if not isinstance(entries, list) or not entries:
        return Unusable('"tools" must be a non-empty list of calls')
    calls: list[RawCall] = []
    for entry in entries:
        call = _read_call(entry)
        if isinstance(call, Unusable):
            return call
        calls.append(call)
    return CallReply(calls)


def _read_final(found: dict[str, Any]) -> Reply:
    text = found["final"]
    if not isinstance(text, str):
        return Unusable('"final" must be text')
    return FinalReply(text, found)


def _read_ask_user(found: dict[str, Any]) -> Reply:
    question = found["ask_user"]
    if not isinstance(question, str) or not question.strip():
        return Unusable('"ask_user" must be a question, as text')
    return AskUserReply(question.strip())


_READERS = {
    "plan": _read_plan,
    "tool": _read_tool,
    "tools": _read_tools,
    "final": _read_final,
    "ask_user": _read_ask_user,
}
