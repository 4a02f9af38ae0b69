"""Small, pure helpers for text that crosses the agent's boundary."""

from __future__ import annotations

__all__ = ["clean", "cut"]

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
