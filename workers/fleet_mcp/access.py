"""Who may use `relay mcp`, and which runs each client sees.

Over HTTP every request carries a bearer token, and the token names a client. A
client sees the runs of its apps (and, if it names keys, only those started with
one of them); any other run is, to it, a run that does not exist:

    # mcp-clients.toml: RELAY_MCP_CLIENTS=mcp-clients.toml, or relay mcp --clients FILE
    [[clients]]
    name = "billing-ide"      # who, in the trace of its decisions
    token = "..."             # python -c 'import secrets; print(secrets.token_urlsafe(32))'
    apps = ["billing"]        # the Relay apps whose runs it sees
    keys = ["acme"]           # optional: only runs with these keys

With one RELAY_MCP_TOKEN instead, or over stdio, the one client sees the runs of
the app `relay mcp` serves (`--app`), whatever their key. Every token is held to
`workers.fleet_mcp.tokens.check_bearer_token` (a random secret) before the server starts.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, SecretStr
from starlette.types import ASGIApp, Receive, Scope, Send

from workers.errors import RelayError, SettingsError
from workers.fleet_mcp.tokens import check_bearer_token
from workers.settings import load_entries

__all__ = [
    "CLIENT_SCOPE",
    "ClientEntry",
    "Sight",
    "guarded",
    "load_clients",
    "shown_name",
]

CLIENT_SCOPE = "relay.mcp_client"
"""The ASGI scope's entry where `guarded` leaves the `Sight` of the request's token."""
NAME_CHARS = 80
_KEPT = frozenset(" ._-+/@:#")
"""Characters of a client's self-reported name kept as they are, besides letters and
digits: none of them starts a terminal escape, HTML or Rich markup. Parentheses are
escaped: "mcp client NAME (token T)" is how a token's name is shown, and a client
must not be able to call itself `ide (token billing-ide)`."""


@dataclass(frozen=True)
class Sight:
    """What one client sees: the runs of `apps`, only those with a key in `keys` unless
    that is None. `name` is the client's name in the clients file ("" for the one client
    of RELAY_MCP_TOKEN or stdio)."""

    name: str
    apps: frozenset[str]
    keys: frozenset[str] | None = None

    def sees(self, app: str | None, key: str | None) -> bool:
        """Whether a run of `app` with `key` is this client's to see (a run from before
        apps were recorded, app None, is nobody's)."""
        return app in self.apps and (self.keys is None or key in self.keys)

    def key_to_start(self, app: str, key: str) -> str | None:
        """The key a run this client starts in `app` gets (`key` if given; None: the app's
        name, Relay's default).

        Raises:
            RelayError: the client may not start runs of `app`, or with that key, or
                must name one of its keys (the message says which it may use).
        """
        if app not in self.apps:
            raise RelayError(f"this client may not start runs of the app {app!r}")
        if self.keys is None:
            return key or None
        if key in self.keys:
            return key
        mine = ", ".join(sorted(self.keys))
        if not key and len(self.keys) == 1:
            return next(iter(self.keys))
        said = f"key {key!r} is not one of" if key else "name a key: one of"
        raise RelayError(f"{said} this client's keys ({mine})")


def _token(value: SecretStr) -> SecretStr:
    check_bearer_token(value.get_secret_value())
    return value


class ClientEntry(BaseModel):
    """One client of the clients file (RELAY_MCP_CLIENTS)."""

    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._@-]+$")
    token: Annotated[SecretStr, AfterValidator(_token)]
    apps: tuple[Annotated[str, Field(min_length=1, max_length=128)], ...] = Field(min_length=1)
    keys: tuple[Annotated[str, Field(min_length=1, max_length=128)], ...] | None = Field(
        default=None, min_length=1
    )

    def sight(self) -> Sight:
        keys = None if self.keys is None else frozenset(self.keys)
        return Sight(self.name, frozenset(self.apps), keys)


def load_clients(path: str) -> dict[str, Sight]:
    """Each client's token and what it sees, from the clients file at `path`.

    Raises:
        SettingsError: the file cannot be read, an entry is not a client (a weak token
            among them), or two clients share a name or a token.
    """
    entries = load_entries(path, ClientEntry, variable="RELAY_MCP_CLIENTS", what="client")
    clients: dict[str, Sight] = {}
    for entry in entries:
        token = entry.token.get_secret_value()
        if token in clients or entry.name in {s.name for s in clients.values()}:
            raise SettingsError(
                f"RELAY_MCP_CLIENTS: {path}: client {entry.name!r}: each client needs a name"
                " and a token of its own"
            )
        clients[token] = entry.sight()
    return clients


def guarded(app: ASGIApp, clients: Mapping[str, Sight]) -> ASGIApp:
    """`app`, answering 401 to any HTTP request whose `Authorization: Bearer <token>` is
    no client's, and handing on the others with their client's `Sight` in the ASGI
    scope (CLIENT_SCOPE).

    Raises:
        RelayError: no client, or a token that is no random secret.
    """
    if not clients:
        raise RelayError("relay mcp --http needs at least one client token")
    for token in clients:
        check_bearer_token(token)
    expected = [(f"Bearer {token}".encode(), sight) for token, sight in clients.items()]

    async def check(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            given = dict(scope.get("headers") or []).get(b"authorization", b"")
            found = None
            for bearer, sight in expected:  # every one compared, in constant time each
                if hmac.compare_digest(given, bearer):
                    found = sight
            if found is None:
                await send(
                    {
                        "type": "http.response.start",
                        "status": 401,
                        "headers": [(b"www-authenticate", b"Bearer")],
                    }
                )
                await send({"type": "http.response.body", "body": b"a bearer token is needed"})
                return
            scope[CLIENT_SCOPE] = found
        await app(scope, receive, send)

    return check


def shown_name(raw: object) -> str:
    """A client's self-reported name as it may be stored and shown anywhere (a trace, a
    terminal, a log, a web page): letters, digits and a few plain signs kept, every other
    character (escape codes, line breaks, markup, bidi controls) written as its escape
    (`\\x1b`, `\\u202e`); at most 80 characters, "unnamed" if empty."""
    pieces: list[str] = []
    size = 0
    for char in str(raw or ""):
        piece = char if char.isalnum() or char in _KEPT else _escaped(char)
        if size + len(piece) > NAME_CHARS:
            break
        pieces.append(piece)
        size += len(piece)
    return "".join(pieces).strip() or "unnamed"


def _escaped(char: str) -> str:
    code = ord(char)
    return (
        f"\\x{code:02x}"
        if code < 0x100
        else f"\\u{code:04x}"
        if code < 0x10000
        else f"\\U{code:08x}"
    )
