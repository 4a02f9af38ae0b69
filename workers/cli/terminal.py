"""Text for a terminal: what models, tools, plans and people wrote, made safe to print.

Everything `relay` prints that it did not write itself (a task, a plan, a tool's
output, a model's final answer, a question, an error that quotes user text)
goes through `printable` first, or `one_line` for a table cell or a line of a
live view. A model that writes `\\x1b[8m` cannot hide text from the person
approving its call, move the cursor, retitle the window or reorder a line.

- Control characters (C0, DEL, C1 such as the 8-bit CSI `\\x9b`) and the
  Unicode bidirectional overrides become `�` (U+FFFD), so a reader sees that
  something was there.
- `printable` keeps newlines and tabs (a carriage return before a newline is
  dropped); `one_line` turns every run of whitespace, newlines included, into
  one space.
- `json_text` escapes the same characters in JSON the CLI prints (`--json`),
  as `\\uXXXX`: the data stays exactly what it was, the terminal stays safe.
"""

from __future__ import annotations

import json
import re

__all__ = ["REPLACEMENT", "json_text", "one_line", "printable"]

REPLACEMENT = "\ufffd"
# Controls (C0 but newline and tab, DEL, C1), the bidi marks, embeddings, overrides
# and isolates, and the line and paragraph separators some terminals break lines on.
_UNSAFE = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]"
)
# In JSON, C0 characters are escaped already; the rest of _UNSAFE may come through raw.
_UNSAFE_IN_JSON = re.compile("[\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def printable(text: object) -> str:
    """Return `text` (made a str) with newlines and tabs kept and every other control replaced."""
    return _UNSAFE.sub(REPLACEMENT, str(text).replace("\r\n", "\n"))


def one_line(text: object, limit: int = 0) -> str:
    """Return `text` as one printable line: whitespace collapsed, cut to `limit` (0: no cut)."""
    line = " ".join(printable(text).split())
    return line if not limit or len(line) <= limit else line[: limit - 1] + "…"


def json_text(text: str) -> str:
    """Return JSON text with the characters a terminal would act on escaped as `\\uXXXX`.

    Such characters can only stand inside JSON strings, where an escape means the
    same character: the JSON decodes to exactly the same value.
    """
    return _UNSAFE_IN_JSON.sub(lambda found: f"\\u{ord(found[0]):04x}", text)


def whole_args(args: object) -> str:
    """A call's arguments whole, for a person deciding it: indented JSON, every character
    kept (none a terminal would act on)."""
    return printable(json.dumps(args or {}, ensure_ascii=False, indent=2))
