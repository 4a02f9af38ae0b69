"""Who may use relay web, and forms that cannot be forged or replayed.

Every request needs HTTP basic auth (`RELAY_WEB_USER`, `RELAY_WEB_PASSWORD`),
/metrics and the JSON API included. A browser sends basic credentials to any
page of the site, whoever made the request, so a decision also needs proof
that it came from a form this server rendered for this person and this call:

- an approval form carries a token: a nonce and an expiry, with an HMAC over
  them, the user's name and the exact thing decided (run, kind, call or step).
  A token for another call, another user, or edited in any way is refused;
- a token is used once: its nonce is claimed in Redis (`web-used:<nonce>`,
  `SET NX` with the token's lifetime), so a replayed form is refused even if
  the call were pending again;
- a request whose `Origin` is another site's, or that the browser marks as
  cross-site (`Sec-Fetch-Site`), is refused before anything else;
- the JSON API takes decisions only as `application/json`, which a page on
  another site cannot send without a preflight this server never grants.

Every response also says it may not be framed (clickjacking an Approve button).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["BasicAuth", "FormTokens", "WebSettings", "cross_site"]

TOKEN_TTL_S = 3_600
"""How long an approval form stays usable after it was rendered."""

_SECURITY_HEADERS = [
    (b"x-frame-options", b"DENY"),
    (b"content-security-policy", b"default-src 'self'; frame-ancestors 'none'; form-action 'self'"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
    (b"cache-control", b"no-store"),
]


@dataclass(frozen=True)
class WebSettings:
    """What relay web needs besides the Relay: who may sign in, and where Flower is."""

    user: str
    password: str
    secret: bytes
    """Signs approval forms; random per process unless RELAY_WEB_SECRET is set."""
    flower_url: str = ""
    """Flower's address, for links to each task (RELAY_FLOWER_URL); '' for no links."""

    @classmethod
    def of(cls, user: str, password: str, *, secret: str = "", flower_url: str = "") -> WebSettings:
        key = secret.encode() if secret else secrets.token_bytes(32)
        return cls(user, password, key, flower_url.rstrip("/"))


class BasicAuth:
    """ASGI middleware: HTTP basic auth for every request, and the security headers."""

    def __init__(self, app: ASGIApp, user: str, password: str) -> None:
        self.app = app
        self._user = user.encode()
        self._password = password.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *_SECURITY_HEADERS]
            await send(message)

        user = self._signed_in(Headers(scope=scope).get("authorization", ""))
        if user is None:
            refused = PlainTextResponse(
                "Sign in to relay web.",
                status_code=401,
                headers={"WWW-Authenticate": 'Basic realm="relay web", charset="UTF-8"'},
            )
            await refused(scope, receive, send_with_headers)
            return
        scope.setdefault("state", {})["user"] = user
        await self.app(scope, receive, send_with_headers)

    def _signed_in(self, header: str) -> str | None:
        scheme, _, encoded = header.partition(" ")
        if scheme.lower() != "basic":
            return None
        try:
            user, colon, password = base64.b64decode(encoded, validate=True).partition(b":")
        except (binascii.Error, ValueError):
            return None
        right_user = hmac.compare_digest(user, self._user)
        right_password = hmac.compare_digest(password, self._password)
        if not (colon and right_user and right_password):
            return None
        return user.decode()


def whole_number(text: str, most: int) -> int | None:
    """`text` as a whole number from 0 to `most` (ASCII digits only: `"²".isdigit()` is
    true in Python), or None."""
    if not (text.isascii() and text.isdigit()) or len(text) > len(str(most)):
        return None
    number = int(text)
    return number if number <= most else None


def same_text(given: str, expected: str) -> bool:
    """Whether `given` (from a request: any text) is `expected`, compared in constant time."""
    return hmac.compare_digest(given.encode(errors="replace"), expected.encode())


def cross_site(headers: Headers) -> bool:
    """Whether the browser says this request came from another site."""
    site = headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):
        return True
    origin = headers.get("origin")
    return origin is not None and urlsplit(origin).netloc != headers.get("host", "")


class FormTokens:
    """Tokens for approval forms: bound to a user and to what is decided, used once.

    `await claim(nonce, ttl_s)` records a nonce as used and says whether it was new.
    """

    def __init__(
        self,
        secret: bytes,
        claim: Callable[[str, int], Awaitable[bool]],
        ttl_s: int = TOKEN_TTL_S,
    ) -> None:
        self._secret = secret
        self._claim = claim
        self._ttl_s = ttl_s

    def _mac(self, user: str, what: tuple[str, ...], nonce: str, expires: int) -> str:
        text = "\x1f".join([user, *what, nonce, str(expires)])
        return hmac.new(self._secret, text.encode(), hashlib.sha256).hexdigest()

    def issue(self, user: str, what: tuple[str, ...], now_s: int) -> str:
        """Return a token for `user` to decide `what` (e.g. ("call", run, call id))."""
        nonce = secrets.token_urlsafe(16)
        expires = now_s + self._ttl_s
        return f"{nonce}.{expires}.{self._mac(user, what, nonce, expires)}"

    async def refusal(self, token: str, user: str, what: tuple[str, ...], now_s: int) -> str:
        """Return why `token` may not decide `what` for `user` ('' if it may: it is now used)."""
        nonce, _, rest = token.partition(".")
        expires_text, _, mac = rest.partition(".")
        expires = whole_number(expires_text, 2**53)
        if not (nonce and expires is not None and mac and token.isascii()):
            return "this form is not one relay web made"
        if not same_text(mac, self._mac(user, what, nonce, expires)):
            return "this form was not made for this decision (or for you)"
        if expires < now_s:
            return "this form is too old; open the page again"
        if not await self._claim(nonce, max(1, expires - now_s)):
            return "this form was used already"
        return ""
