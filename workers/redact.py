"""URLs as they may be shown: without the password or the secrets in their query string.

A URL's secrets sit in two places: its user info (`redis://user:pw@host/0`) and
its query string (`https://h/v1?api-key=...`, `?key=...`, redis-py's
`?password=...`). `redact_url` masks both with `***`; `url_secrets` returns
the values it would mask, so a client can scrub them from a server's error text;
`hide_secrets_in_httpx_logs` has httpx's own log lines show URLs masked.

A query value is a secret when its name says so (it holds key, token, secret,
pass, pwd, auth, sig, credential, session or jwt, whatever the case and
punctuation: `api-key`, `apiKey`, `access_token`, `X-Amz-Signature`) or when it
looks like one (`sk-...`, or 32 characters and more of letters and digits mixed).
"""

from __future__ import annotations

import logging
import re
from urllib.parse import unquote_plus

import httpx

__all__ = ["hide_secrets_in_httpx_logs", "redact_url", "url_secrets"]

MASK = "***"
_SECRET_NAME = re.compile(r"key|token|secret|pass|pwd|auth|sig|credential|session|jwt")
_KEY_LIKE = re.compile(r"(sk|pk|rk)-\S{8,}|(?=\S*[A-Za-z])(?=\S*[0-9])[\w\-.~+/=%]{32,}")


def redact_url(url: str) -> str:
    """Return `url` with its password and its secret query values replaced by `***`.

    `redis://user:pw@host/0` becomes `redis://user:***@host/0` and
    `https://h/v1?api-version=1&api-key=sk-1` becomes `https://h/v1?api-version=1&api-key=***`;
    a URL without either comes back unchanged. When the user info cannot be
    read that way (an `@` past the host, as an unescaped `/`, `?` or `#` in a
    password leaves it), everything from after `://` up to the last `@` is
    masked instead.
    """
    return _redact_query(_redact_userinfo(url))


def url_secrets(url: str) -> list[str]:
    """Return the query values of `url` that `redact_url` masks, as sent and decoded.

    Longest first, so replacing them in turn never leaves part of one behind.
    """
    found = {
        shown
        for name, value in _query_pairs(url)
        if value and _is_secret(name, value)
        for shown in (value, unquote_plus(value))  # a server may echo either
    }
    return sorted(found, key=len, reverse=True)


def _redact_userinfo(url: str) -> str:
    head, separator, rest = url.partition("://")
    if not separator or "@" in head:
        return f"{MASK}@" + url.rpartition("@")[2] if "@" in url else url
    ends = [index for index in (rest.find(char) for char in "/?#") if index >= 0]
    netloc, tail = rest[: min(ends, default=len(rest))], rest[min(ends, default=len(rest)) :]
    if "@" in tail:
        return f"{head}://{MASK}@{rest.rpartition('@')[2]}"
    if "@" not in netloc:
        return url
    userinfo, _, host = netloc.rpartition("@")
    user, colon, _ = userinfo.partition(":")
    return f"{head}://{user}{':' + MASK if colon else ''}@{host}{tail}"


def _redact_query(url: str) -> str:
    before, question, rest = url.partition("?")
    if not question:
        return url
    query, hash_, fragment = rest.partition("#")
    pairs = []
    for pair in query.split("&"):
        name, equals, value = pair.partition("=")
        pairs.append(f"{name}={MASK}" if equals and value and _is_secret(name, value) else pair)
    return f"{before}?{'&'.join(pairs)}{hash_}{fragment}"


def _query_pairs(url: str) -> list[tuple[str, str]]:
    query = url.partition("?")[2].partition("#")[0]
    return [(name, value) for name, _, value in (p.partition("=") for p in query.split("&"))]


def _is_secret(name: str, value: str) -> bool:
    normalized = re.sub(r"[^a-z]", "", name.lower())
    return bool(_SECRET_NAME.search(normalized) or _KEY_LIKE.fullmatch(value))


class _RedactedUrls(logging.Filter):
    """httpx logs every request's URL at INFO; its query string may hold a key."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(
                redact_url(str(arg)) if isinstance(arg, httpx.URL) else arg for arg in record.args
            )
        return True


def hide_secrets_in_httpx_logs() -> None:
    """Have httpx's log lines show request URLs redacted (once per process)."""
    httpx_log = logging.getLogger("httpx")
    if not any(isinstance(f, _RedactedUrls) for f in httpx_log.filters):
        httpx_log.addFilter(_RedactedUrls())
