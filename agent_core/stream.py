"""The text of `{"final": "…"}`, decoded while the model's reply streams in.

Theory of operation: `FinalStream` is a character-level state machine that
reads the reply once, left to right, and keeps only a few small fields. Outside
any object (`PROSE`) it looks for `{` and for `<think>`; everything inside a
`<think>…</think>` block is ignored. A `{` opens a candidate object, read with a
strict grammar at the top level (key, `:`, value, `,` or `}`) and a loose one
inside nested values (strings are skipped with their escapes, brackets are
counted). A character the top-level grammar does not allow means the `{` was
prose after all: the candidate is dropped and that character is read again as
prose, the way `reply.first_object` resumes where the decoder gave up.

Text is emitted only from the string value of a top-level `final` key, decoded
as it arrives; escapes and surrogate pairs may be cut anywhere between chunks.
The first object ends the stream: when its `final` string closes, or when it
closes without one (the reply parser uses the first complete object, so a later
object's `final` is never the answer).

Decoding choices: a lone surrogate escape and an invalid escape (`\\q`, or a
`\\u` with a non-hex digit) become U+FFFD; after a broken `\\u` the offending
character is read as ordinary string text. Raw characters pass through as they
are. Limits of reading in one pass: a `</think>` with no `<think>` before it
(which `reply.first_object` treats as closing hidden thinking) cannot be
undone once text was shown; and of duplicate `final` keys, the first string
one is shown.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from enum import Enum, auto

__all__ = ["FinalStream"]

REPLACEMENT = "\ufffd"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
FINAL_KEY = "final"

_WHITESPACE = " \t\n\r"
_HEX_DIGITS = "0123456789abcdefABCDEF"
_SCALAR_START = "-0123456789tfn"
_SCALAR_CHARS = frozenset("0123456789+-.eEtruefalsn")
_SIMPLE_ESCAPES = {
    '"': '"',
    "\\": "\\",
    "/": "/",
    "b": "\b",
    "f": "\f",
    "n": "\n",
    "r": "\r",
    "t": "\t",
}
# Single character classes: searching with them cannot backtrack.
_STRING_STOP = re.compile(r'["\\]')
_PROSE_STOP = re.compile(r"[{<]")
_NESTED_STOP = re.compile(r'["{}\[\]]')


class _StringDecoder:
    """Decodes the inside of one JSON string, piece by piece, up to its closing quote."""

    def __init__(self) -> None:
        self._escape = ""  # an escape begun but not finished: "\\", "\\u", "\\u1", … "\\u123"
        self._high: int | None = None  # a high surrogate waiting for its low half

    def decode(self, chunk: str, start: int) -> tuple[int, str, bool]:
        """Read `chunk` from `start`.

        Returns where reading stopped, the text decoded, and whether the closing
        quote was reached (reading stops just after it).
        """
        out: list[str] = []
        index, end = start, len(chunk)
        while index < end:
            if self._escape:
                if self._escape_char(chunk[index], out):
                    index += 1
                continue
            stop = _STRING_STOP.search(chunk, index)
            plain_end = stop.start() if stop else end
            if plain_end > index:
                self._drop_high(out)
                out.append(chunk[index:plain_end])
            if stop is None:
                break
            index = plain_end + 1
            if chunk[plain_end] == '"':
                self._drop_high(out)
                return index, "".join(out), True
            self._escape = "\\"
        return end, "".join(out), False

    def _escape_char(self, char: str, out: list[str]) -> bool:
        """Read one character of an escape; return False if it belongs to the text after."""
        if self._escape == "\\":
            if char == "u":
                self._escape = "\\u"
                return True
            self._escape = ""
            self._drop_high(out)
            out.append(_SIMPLE_ESCAPES.get(char, REPLACEMENT))
            return True
        if char not in _HEX_DIGITS:
            self._escape = ""
            self._drop_high(out)
            out.append(REPLACEMENT)
            return False
        self._escape += char
        if len(self._escape) == 6:
            code = int(self._escape[2:], 16)
            self._escape = ""
            self._code_unit(code, out)
        return True

    def _code_unit(self, code: int, out: list[str]) -> None:
        """Emit one UTF-16 code unit from a `\\u` escape, joining surrogate pairs."""
        if self._high is not None and 0xDC00 <= code <= 0xDFFF:
            out.append(chr(0x10000 + ((self._high - 0xD800) << 10) + (code - 0xDC00)))
            self._high = None
            return
        self._drop_high(out)
        if 0xD800 <= code <= 0xDBFF:
            self._high = code
        elif 0xDC00 <= code <= 0xDFFF:
            out.append(REPLACEMENT)
        else:
            out.append(chr(code))

    def _drop_high(self, out: list[str]) -> None:
        """Replace a high surrogate that was not followed by its low half."""
        if self._high is not None:
            out.append(REPLACEMENT)
            self._high = None


class _State(Enum):
    PROSE = auto()  # outside any object: waiting for "{" or "<think>"
    THINK = auto()  # inside <think>…</think>: ignored
    OPENED = auto()  # just after "{": a key or "}"
    NEXT_KEY = auto()  # just after ",": a key
    KEY = auto()  # inside a top-level key
    COLON = auto()  # after a key: ":"
    VALUE = auto()  # after ":": the start of a value
    FINAL = auto()  # inside the string value of "final": emitted
    STRING = auto()  # inside any other string: skipped
    NESTED = auto()  # inside a nested object or array: skipped, brackets counted
    SCALAR = auto()  # a top-level number, true, false or null
    AFTER_VALUE = auto()  # after a top-level value: "," or "}"
    FINISHED = auto()  # the first object, or its final string, has closed


class FinalStream:
    """Decodes the `final` text of a reply while it streams in.

    Feed the reply in chunks of any size; each call returns the text that chunk
    added. Memory stays small whatever the reply's length (`.text` aside, which
    keeps what was emitted).
    """

    def __init__(self) -> None:
        self._state = _State.PROSE
        self._tag = 0  # characters of <think> or </think> matched so far
        self._depth = 0  # open brackets inside a nested value
        self._key = ""  # the first characters of the current key, enough to compare
        self._string = _StringDecoder()
        self._out: list[str] = []
        self._emitted: list[str] = []
        self._done = False

    @property
    def text(self) -> str:
        """Everything emitted so far."""
        if len(self._emitted) > 1:
            self._emitted = ["".join(self._emitted)]
        return self._emitted[0] if self._emitted else ""

    @property
    def done(self) -> bool:
        """Whether the final string has closed: no more text will come."""
        return self._done

    def feed(self, chunk: str) -> str:
        """Read the next piece of the reply; return the final text it added ("" if none)."""
        index, end = 0, len(chunk)
        while index < end and self._state is not _State.FINISHED:
            index = _HANDLERS[self._state](self, chunk, index)
        added = "".join(self._out)
        self._out.clear()
        if added:
            self._emitted.append(added)
        return added

    # Each handler reads from `index` and returns where to go on. It consumes at
    # least one character, or changes state so the next handler will.

    def _prose(self, chunk: str, index: int) -> int:
        if self._tag:
            if not self._match_tag(THINK_OPEN, chunk[index]):
                return index  # not a tag after all: read the character again as prose
            if self._tag == len(THINK_OPEN):
                self._tag = 0
                self._state = _State.THINK
            return index + 1
        stop = _PROSE_STOP.search(chunk, index)
        if stop is None:
            return len(chunk)
        if stop.group() == "{":
            self._state = _State.OPENED
        else:
            self._tag = 1
        return stop.end()

    def _think(self, chunk: str, index: int) -> int:
        if self._tag:
            if not self._match_tag(THINK_CLOSE, chunk[index]):
                return index
            if self._tag == len(THINK_CLOSE):
                self._tag = 0
                self._state = _State.PROSE
            return index + 1
        opened = chunk.find("<", index)
        if opened == -1:
            return len(chunk)
        self._tag = 1
        return opened + 1

    def _match_tag(self, tag: str, char: str) -> bool:
        """Match one more character of `tag`; on a mismatch forget the match, return False."""
        # Only a tag's first character is "<", so a mismatch never hides a shorter match.
        if char != tag[self._tag]:
            self._tag = 0
            return False
        self._tag += 1
        return True

    def _key_start(self, chunk: str, index: int) -> int:
        index = _skip_whitespace(chunk, index)
        if index == len(chunk):
            return index
        char = chunk[index]
        if char == '"':
            self._key = ""
            self._state = _State.KEY
        elif char == "}" and self._state is _State.OPENED:
            self._state = _State.FINISHED
        else:
            return self._not_an_object(index)
        return index + 1

    def _key_text(self, chunk: str, index: int) -> int:
        index, text, closed = self._string.decode(chunk, index)
        # One character more than "final" is enough to tell "finally" from "final".
        self._key = (self._key + text[: len(FINAL_KEY) + 1])[: len(FINAL_KEY) + 1]
        if closed:
            self._state = _State.COLON
        return index

    def _colon(self, chunk: str, index: int) -> int:
        index = _skip_whitespace(chunk, index)
        if index == len(chunk):
            return index
        if chunk[index] != ":":
            return self._not_an_object(index)
        self._state = _State.VALUE
        return index + 1

    def _value_start(self, chunk: str, index: int) -> int:
        index = _skip_whitespace(chunk, index)
        if index == len(chunk):
            return index
        char = chunk[index]
        if char == '"':
            self._state = _State.FINAL if self._key == FINAL_KEY else _State.STRING
        elif char in "{[":
            self._depth = 1
            self._state = _State.NESTED
        elif char in _SCALAR_START:
            self._state = _State.SCALAR
        else:
            return self._not_an_object(index)
        return index + 1

    def _final_text(self, chunk: str, index: int) -> int:
        index, text, closed = self._string.decode(chunk, index)
        self._out.append(text)
        if closed:
            self._done = True
            self._state = _State.FINISHED
        return index

    def _skipped_string(self, chunk: str, index: int) -> int:
        index, _, closed = self._string.decode(chunk, index)
        if closed:
            self._state = _State.NESTED if self._depth else _State.AFTER_VALUE
        return index

    def _nested(self, chunk: str, index: int) -> int:
        stop = _NESTED_STOP.search(chunk, index)
        if stop is None:
            return len(chunk)
        char = stop.group()
        if char == '"':
            self._state = _State.STRING
        elif char in "{[":
            self._depth += 1
        else:
            self._depth -= 1
            if self._depth == 0:
                self._state = _State.AFTER_VALUE
        return stop.end()

    def _scalar(self, chunk: str, index: int) -> int:
        end = len(chunk)
        while index < end and chunk[index] in _SCALAR_CHARS:
            index += 1
        if index < end:
            self._state = _State.AFTER_VALUE  # the character after it is read there
        return index

    def _after_value(self, chunk: str, index: int) -> int:
        index = _skip_whitespace(chunk, index)
        if index == len(chunk):
            return index
        char = chunk[index]
        if char == ",":
            self._state = _State.NEXT_KEY
        elif char == "}":
            self._state = _State.FINISHED
        else:
            return self._not_an_object(index)
        return index + 1

    def _not_an_object(self, index: int) -> int:
        """Drop the candidate object; its offending character is read again as prose."""
        # Strings never fail, so the decoder is always between strings here.
        self._state = _State.PROSE
        return index


def _skip_whitespace(chunk: str, index: int) -> int:
    end = len(chunk)
    while index < end and chunk[index] in _WHITESPACE:
        index += 1
    return index


_HANDLERS: dict[_State, Callable[[FinalStream, str, int], int]] = {
    _State.PROSE: FinalStream._prose,
    _State.THINK: FinalStream._think,
    _State.OPENED: FinalStream._key_start,
    _State.NEXT_KEY: FinalStream._key_start,
    _State.KEY: FinalStream._key_text,
    _State.COLON: FinalStream._colon,
    _State.VALUE: FinalStream._value_start,
    _State.FINAL: FinalStream._final_text,
    _State.STRING: FinalStream._skipped_string,
    _State.NESTED: FinalStream._nested,
    _State.SCALAR: FinalStream._scalar,
    _State.AFTER_VALUE: FinalStream._after_value,
}
