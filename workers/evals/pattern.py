"""The regular expressions of `expect.final_matches`, matched in bounded time.

A suite is text anyone can hand over, and a final answer is text a model wrote, so a
pattern such as `(a+)+$` must not be able to hang `relay eval` (Python's `re`
backtracks: that one takes exponential time on `aaaa...b`, and no thread can stop
it). RE2 (the `google-re2` package) matches in time linear in the text, whatever the
pattern; what it gives up is backreferences and look-around, which a pattern is
refused for when the suite is read. This module is the one place that knows RE2.
"""

from __future__ import annotations

import re

import re2  # type: ignore[import-untyped]  # (google-re2 ships no types)

__all__ = ["Pattern", "PatternError"]


# Reads a pattern token by token, to find what RE2 leaves out: a character class whole
# (a `(?=` or `\1` in one is no group), a backreference (`\1`, `\g<name>`, `\k<name>`,
# `(?P=name)`), look-around (`(?=`, `(?!`, `(?<=`, `(?<!`), any other escape, one
# character. (Python's `re`, on the suite's own text: a class unclosed runs to the end,
# so no token is tried twice and this takes time linear in the pattern.)
_TOKEN = re.compile(
    r"(?P<character_class>\[\^?\]?(?:\\.?|[^\]\\])*(?:\]|\Z))"
    r"|(?P<backreference>\\(?:[1-9]|[gk]<)|\(\?P=)"
    r"|(?P<look_around>\(\?<?[=!])"
    r"|\\.|.",
    re.DOTALL,
)


def _left_out(pattern: str) -> str:
    """Why RE2 may have refused the pattern, when it has a construct RE2 leaves out
    ("`\\1` is a backreference: ..."); else "" (its error says all there is)."""
    for token in _TOKEN.finditer(pattern):
        if token.lastgroup == "backreference":
            return f" (`{token[0]}` is a backreference: RE2 matches none, nor look-around)"
        if token.lastgroup == "look_around":
            return f" (`{token[0]}` is look-around: RE2 matches none, nor backreferences)"
    return ""


class PatternError(ValueError):
    """Raised when a pattern is not one RE2 can match (bad syntax, a backreference,
    look-around, or too large a program)."""


def _options() -> object:
    options = re2.Options()
    options.log_errors = False  # (a refused pattern is our error line, not RE2's stderr)
    return options


class Pattern:
    """A compiled pattern; `found(text)` says whether it matches somewhere in `text`."""

    def __init__(self, pattern: str) -> None:
        try:
            self._compiled = re2.compile(pattern, _options())
        except re2.error as error:
            said = error.args[0] if error.args else error
            if isinstance(said, bytes):
                said = said.decode("utf-8", "replace")
            raise PatternError(
                f"not a regular expression RE2 can match: {said}{_left_out(pattern)}"
            ) from None
        except (TypeError, UnicodeError) as error:
            raise PatternError(f"not a regular expression RE2 can match: {error}") from None

    def found(self, text: str) -> bool:
        """Whether the pattern matches somewhere in `text` (in time linear in it)."""
        # (RE2 reads UTF-8; a lone surrogate, which JSON lets a model write, becomes U+FFFD)
        return self._compiled.search(text.encode("utf-8", "replace")) is not None
