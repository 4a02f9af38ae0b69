"""Whether a bearer token is random enough to guard `relay mcp --http`.

A token passes when it has at least 32 visible ASCII characters (no spaces) and a
conservative estimate of its entropy reaches 128 bits. The estimate is the lesser of
two readings, each the Shannon entropy of what the token is made of times how many
of them there are:

    its characters   the entropy of their frequencies, times the characters left once
                     every repeat of an earlier piece (3 characters or more) is taken
                     out: `passwordpassword...` counts `password` once
    its steps        the entropy of the differences between neighbouring characters'
                     codes, times their number: `0123456789...`, `abcdef...` and
                     `ABCDEFGH` repeated are one step said over and over

Both read a random token close to its true entropy and a made-up one far below it
(`'changeme-' * 3 + '12345'` reads about 49 bits). `secrets.token_urlsafe(32)` (256
random bits, 43 characters) reads 170 bits or more (the least of 100,000 drawn was
174); `secrets.token_hex(16)` (exactly 128 random bits) reads under 128 nearly
always, and is refused: the estimate never credits more than the characters show.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Hashable, Sequence
from itertools import pairwise

__all__ = [
    "BEARER_TOKEN_BITS",
    "BEARER_TOKEN_CHARS",
    "MAKE_A_TOKEN",
    "TOKEN_RULE",
    "check_bearer_token",
    "estimated_bits",
]

BEARER_TOKEN_CHARS = 32
BEARER_TOKEN_BITS = 128
MAKE_A_TOKEN = "python -c 'import secrets; print(secrets.token_urlsafe(32))'"
TOKEN_RULE = (
    f"a random secret of at least {BEARER_TOKEN_CHARS} visible ASCII characters (no spaces)"
    f" with an estimated {BEARER_TOKEN_BITS} bits of entropy or more"
)
"""The rule, as errors and help say it."""

_VISIBLE = re.compile(r"[\x21-\x7e]+")  # what an HTTP header value carries as is
_SHORTEST_REPEAT = 3
_READ_CHARS = 1024
"""Only a token's first characters are read: they decide it (and a huge value costs no
more to check)."""


def check_bearer_token(token: str) -> str:
    """Return `token` if it can guard a server as a bearer token (the module's rule).

    Raises:
        ValueError: saying what is required, what is wrong and how to make one, never
            quoting the token.
    """
    if len(token) < BEARER_TOKEN_CHARS:
        problem = f"it has {len(token)} characters"
    elif not _VISIBLE.fullmatch(token):
        problem = "it holds spaces or characters outside visible ASCII"
    elif (bits := estimated_bits(token)) < BEARER_TOKEN_BITS:
        problem = (
            f"its entropy is estimated at {bits:.0f} bits (too few different characters,"
            " pieces repeated or characters in sequence)"
        )
    else:
        return token
    raise ValueError(f"expected {TOKEN_RULE}, but {problem}; make one with: {MAKE_A_TOKEN}")


def estimated_bits(token: str) -> float:
    """A conservative estimate of `token`'s entropy in bits (the module's two readings)."""
    read = token[:_READ_CHARS]
    steps = [ord(after) - ord(before) for before, after in pairwise(read)]
    by_characters = _entropy(read) * _unrepeated(read)
    by_steps = _entropy(steps) * len(steps)
    return min(by_characters, by_steps)


def _entropy(items: Sequence[Hashable]) -> float:
    """The Shannon entropy, in bits per item, of the items' frequencies."""
    total = len(items)
    return -sum(n / total * math.log2(n / total) for n in Counter(items).values())


def _unrepeated(text: str) -> int:
    """How many characters of `text` are left once each piece that repeats an earlier
    one (3 characters or more, read left to right, longest first) is taken out."""
    left = 0
    at = 0
    while at < len(text):
        size = _SHORTEST_REPEAT
        if at + size <= len(text) and _seen_before(text, at, size):
            while at + size < len(text) and _seen_before(text, at, size + 1):
                size += 1
            at += size
        else:
            left += 1
            at += 1
    return left


def _seen_before(text: str, at: int, size: int) -> bool:
    """Whether text[at:at+size] also starts somewhere before `at` (overlapping it, as
    in `aaaa`, counts)."""
    return text.find(text[at : at + size], 0, at + size - 1) != -1
