"""Small, pure helpers for text that crosses the agent's boundary."""

from __future__ import annotations

__all__ = ["a_or_an", "clean", "counted", "cut"]

CUT_MARKER = "\n[… cut: {hidden} more characters]"


def clean(text: str) -> str:
    """Return `text` with lone surrogates replaced by U+FFFD.

    Every text that enters the agent passes through here, so a snapshot can
    always be encoded as UTF-8 whatever the model, a tool or a person sent.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        # Pairs written as two surrogates are joined; lone ones become U+FFFD.
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text


def cut(text: str, limit: int) -> str:
    """Return `text` cut to about `limit` characters, with a visible marker when cut."""
    if len(text) <= limit:
        return text
    keep = max(0, limit - len(CUT_MARKER) - 8)
    return text[:keep] + CUT_MARKER.format(hidden=len(text) - keep)


def counted(count: int, noun: str, plural: str = "") -> str:
    """Return `1 model call`, `2 model calls`, `1,000 tokens`: the count (with thousands
    separators) and the noun, plural unless the count is one (`plural`: for a noun whose
    plural is not noun + s)."""
    return f"{count:,} {noun if count == 1 else plural or noun + 's'}"


def a_or_an(word: str) -> str:
    """Return `word` after its indefinite article by how it is spelt: `an int`, `a str`
    (a vowel letter's sound, which is right for type names and most words)."""
    article = "an" if word[:1].lower() in ("a", "e", "i", "o", "u") else "a"
    return f"{article} {word}"
