"""Fleet-wide limits of model routes in Redis: one script to admit a call, one after it.

`admit` (lua/route_admit.lua) says whether a model call may use a route now: the
route may be paused by a 429, its circuit open (one probe per interval gets
through), its or the key's calls in flight at their cap, or its requests and
tokens per minute spent; waiting calls queue fairly between keys.
`done` (lua/route_done.lua) gives the call's slots back and tells the circuit and
the pause what happened (`tell` tells a call's `news`); a success's news may instead go
with the SAVE of the call's outcome, which runs the same script on a single Redis.
Every worker shares these, so limits hold for the fleet, not per process; a worker
that dies holding a slot loses it when its lease lapses.
`fell_back` keeps, once, why a route's server refused its protocol (`relay routes`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict

from workers.engine.effects import RouteNews
from workers.model.endpoints import ModelRoute
from workers.store import scripts
from workers.store.codec import as_text
from workers.store.connection import Connection
from workers.store.scripts import Admitted

__all__ = [
    "ABSENT_MS",
    "FAILURES_TO_OPEN",
    "PROBE_INTERVAL_MS",
    "SPACING_MARGIN",
    "STALE_MS",
    "RouteLimits",
    "RouteState",
]

FAILURES_TO_OPEN = 5
"""Failures in a row (server errors, timeouts, refusals, 429s) that open a route's circuit."""
PROBE_INTERVAL_MS = 10_000
"""While a circuit is open, one call per interval is let through to probe the route."""
SPACING_MARGIN = 1.02
"""Calls are spaced 2% wider than a route's limits: a provider counting its own minute
from slightly different moments (network jitter) still never sees one call too many."""
ABSENT_MS = 1_000
"""A waiting call this late for its turn (its worker busy, its countdown late) does not
hold back the calls queued behind it; it keeps its place for when it comes."""
STALE_MS = 30_000
"""A waiting call that has not come back this long after its turn has gone elsewhere."""

Outcome = Literal["ok", "failed", "limited", "refused", "stopped"]


class RouteState(BaseModel):
    """A route as the fleet shares it now: its limits, its circuit, its calls."""

    model_config = ConfigDict(frozen=True)

    name: str
    model: str
    rpm: int | None
    tpm: int | None
    max_concurrency: int | None
    circuit: Literal["closed", "open"]
    failures: int
    """Failures in a row (a success sets it back to 0)."""
    next_probe_ms: int | None
    """While the circuit is open: when the next call may probe the route."""
    paused_until_ms: int | None
    """A 429 paused the route for the fleet until then."""
    in_flight: int
    waiting: int
    """Calls queued for their turn."""
    error: str
    error_at_ms: int | None
    protocol: str = "text"
    """How the route asks for the reply object (`ModelRoute.protocol`)."""
    protocol_fallback: str | None = None
    """Why its workers speak text instead: the first refusal of its server, kept once."""


class RouteLimits:
    """The routes' shared limits, on one Redis connection."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection

    def admit(
        self,
        route: ModelRoute,
        *,
        key: str,
        holder: str,
        tokens: int,
        key_concurrency: int | None,
        lease_ms: int,
        now_ms: int,
    ) -> Admitted:
        """Ask whether the call `holder` of `key`, which may use `tokens`, may go now."""
        admit = scripts.route_admit(
            self._connection.keys,
            route=route.name,
            key=key,
            holder=holder,
            now_ms=now_ms,
            ms_per_request=_spacing(route.rpm),
            tokens=tokens,
            ms_per_token=_spacing(route.tpm),
            route_cap=route.max_concurrency or 0,
            key_cap=key_concurrency or 0,
            lease_ms=lease_ms,
            probe_ms=PROBE_INTERVAL_MS,
            stale_ms=STALE_MS,
            absent_ms=ABSENT_MS,
        )
        return self._connection.run(admit)

    def renew(
        self, route: ModelRoute, *, key: str, holder: str, lease_ms: int, now_ms: int
    ) -> None:
        """Keep a call's slots while it runs (a long reply outlasts one lease)."""
        until = now_ms + lease_ms
        connection = self._connection
        k = connection.keys
        with connection.errors():
            pipe = connection.redis.pipeline(transaction=False)
            pipe.zadd(k.route(route.name, "inflight"), {holder: until}, xx=True)
            pipe.zadd(k.key_inflight(key, route.name), {holder: until}, xx=True)
            pipe.execute()

    def renew_many(
        self, held: Sequence[tuple[ModelRoute, str, str]], *, lease_ms: int, now_ms: int
    ) -> None:
        """Keep the slots of every call in `held` (its route, key and holder) for another
        lease, in one round trip: `renew` for all the calls a process holds at once."""
        until = now_ms + lease_ms
        connection = self._connection
        k = connection.keys
        with connection.errors():
            pipe = connection.redis.pipeline(transaction=False)
            for route, key, holder in held:
                pipe.zadd(k.route(route.name, "inflight"), {holder: until}, xx=True)
                pipe.zadd(k.key_inflight(key, route.name), {holder: until}, xx=True)
            pipe.execute()

    def leave(self, route: ModelRoute, *, key: str, holder: str) -> None:
        """Take a call out of the route's queue: another route took it, or it failed."""
        leave = scripts.route_admit(
            self._connection.keys, route=route.name, key=key, holder=holder, now_ms=0, leave=True
        )
        self._connection.run(leave)

    def done(
        self,
        route: ModelRoute,
        *,
        key: str,
        holder: str,
        outcome: Outcome,
        now_ms: int,
        paused_until_ms: int = 0,
        charged: int = 0,
        used: int | None = None,
        error: str = "",
    ) -> str:
        """Tell the route what came of an admitted call; return its circuit's state.

        `charged`: the tokens its admission charged (`Admitted.charged`); `used`: the
        tokens the call used, None if it failed (all it was charged comes back)."""
        news = self.news(
            route, key=key, holder=holder, now_ms=now_ms, paused_until_ms=paused_until_ms,
            charged=charged, used=used,
        )  # fmt: skip
        return self.tell(news, outcome, error)

    @staticmethod
    def news(
        route: ModelRoute, *, key: str, holder: str, now_ms: int, paused_until_ms: int,
        charged: int, used: int | None,
    ) -> RouteNews:  # fmt: skip
        """What the route is to hear of a call (`charged` tokens at its admission, `used`
        by it), to `tell` now or, a success's, with the save of its outcome."""
        ms_per_token = _spacing(route.tpm)
        return RouteNews(
            route.name, key, holder, now_ms, paused_until_ms, charged, used, ms_per_token
        )

    def tell(self, news: RouteNews, outcome: Outcome = "ok", error: str = "") -> str:
        """Tell the route `news` of a call (ROUTE_DONE); return its circuit's state."""
        done = scripts.route_done(
            self._connection.keys,
            route=news.route,
            key=news.key,
            holder=news.holder,
            outcome=outcome,
            now_ms=news.now_ms,
            paused_until_ms=news.paused_until_ms,
            charged=news.charged,
            used=news.used,
            ms_per_token=news.ms_per_token,
            failures_to_open=FAILURES_TO_OPEN,
            probe_ms=PROBE_INTERVAL_MS,
            error=error,
        )
        return self._connection.run(done)

    def usable(self, route: ModelRoute, now_ms: int) -> bool:
        """Whether `route` may be asked now: its circuit is not open and no 429 (or a
        spent limit) paused it. One read; a probe's turn is ROUTE_ADMIT's to give."""
        connection = self._connection
        with connection.errors():
            circuit, paused = connection.redis.hmget(
                connection.keys.route(route.name), ["circuit", "paused"]
            )
        return as_text(circuit or b"") != "open" and float(paused or 0) <= now_ms

    def fell_back(self, route: ModelRoute, refusal: str) -> bool:
        """Keep why `route`'s server refused its protocol, unless a worker already did
        (kept per protocol: a route given another protocol shows its own); return
        whether this was the first."""
        connection = self._connection
        with connection.errors():
            kept = connection.redis.hsetnx(
                connection.keys.route(route.name), _fallback_field(route), refusal[:500]
            )
        return bool(kept)

    def state(self, route: ModelRoute, now_ms: int) -> RouteState:
        """What `relay routes` shows of a route now."""
        connection = self._connection
        k = connection.keys
        with connection.errors():
            pipe = connection.redis.pipeline(transaction=False)
            pipe.hgetall(k.route(route.name))
            pipe.zcount(k.route(route.name, "inflight"), now_ms, "+inf")
            pipe.zcard(k.route(route.name, "queue"))
            found, inflight, waiting = pipe.execute()
        fields = {as_text(f): as_text(v) for f, v in found.items()}

        def ms(name: str) -> int | None:
            value = int(float(fields.get(name, "0")))
            return value or None

        paused = ms("paused")
        return RouteState(
            name=route.name,
            model=route.model,
            rpm=route.rpm,
            tpm=route.tpm,
            max_concurrency=route.max_concurrency,
            circuit="open" if fields.get("circuit") == "open" else "closed",
            failures=int(fields.get("failures", "0")),
            next_probe_ms=ms("probe") if fields.get("circuit") == "open" else None,
            paused_until_ms=paused if paused is not None and paused > now_ms else None,
            in_flight=int(inflight),
            waiting=int(waiting),
            error=fields.get("error", ""),
            error_at_ms=ms("error_at"),
            protocol=route.protocol,
            protocol_fallback=fields.get(_fallback_field(route)) or None,
        )


def _fallback_field(route: ModelRoute) -> str:
    return f"fallback:{route.protocol}"


def _spacing(per_minute: int | None) -> float:
    """Milliseconds between two requests (or tokens) at `per_minute`, with the margin;
    0 for no limit."""
    return SPACING_MARGIN * 60_000 / per_minute if per_minute else 0
