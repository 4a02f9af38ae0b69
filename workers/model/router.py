"""Routing a model call: the routes in order, within the fleet's limits.

    routes tried in order ──► admitted by the route's limits (workers.model.limits)?
        admitted   the call is made; a 429, a 5xx after its retries, a timeout, a
                   refused connection falls through to the next route; a request
                   the server calls wrong (400, 401, 404, 422) fails the call
        paused     (a 429's Retry-After, fleet-wide) or its circuit open: the next route
        wait       a moment: wait here; longer: `Requeue` (the task ends, the call comes
                   back with a countdown, holding no worker meanwhile)

A route's client waits between its retries at most a moment when another route
could take the call instead; on the last route it backs off as usual, but never
waits out a Retry-After longer than a moment. A 429 that says when to come back
is capacity, not failure: when no route takes the call, it is re-queued for then.
The call fails when a route failed otherwise and none took it.

Every outcome is told to the route (`RouteLimits.done`): its slots come back,
its circuit counts failures, a 429 pauses it for the fleet. A caller that saves the
reply in a script of its own may take a success's news along (`tell_ok=False`,
`Routed.ok`) rather than have it told in a round trip of its own. A route whose client
stopped speaking its protocol (its server refused it) is told once per process
(`RouteLimits.fell_back`), for `relay routes`.

A call is a coroutine on the process's event loop, like the client's. The limits are
redis-py's synchronous client, so each word with them runs in a thread (`_off_loop`)
and never blocks the loop; `renew` and `renew_many` are called from the thread that
renews leases, and stay synchronous.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TypeVar

from agent_core import ModelRequest
from workers.engine.effects import RouteNews
from workers.errors import ModelCallError, StoreUnavailable
from workers.model.endpoints import ModelRoute
from workers.model.limits import Outcome, RouteLimits
from workers.model.transport import ModelClient
from workers.model.wire import RESTART, ModelReply

__all__ = ["MOMENT_MS", "ModelRouter", "Requeue", "Routed"]

log = logging.getLogger(__name__)

MOMENT_MS = 1_000
"""A call waits in its worker at most this long for its turn; longer, it is re-queued."""
WRONG_REQUEST = frozenset({400, 401, 403, 404, 405, 413, 422})
"""Answers that say the request itself is wrong: another route would say the same."""


class Requeue(Exception):
    """Raised when no route can take the call soon: try again at `at_ms`."""

    def __init__(self, at_ms: int, why: str) -> None:
        super().__init__(why)
        self.at_ms = at_ms
        self.why = why


@dataclass(frozen=True)
class Routed:
    """A reply, and the route that gave it."""

    reply: ModelReply
    route: ModelRoute
    ok: RouteNews | None = None
    """What the route is still to hear of the call (`complete(tell_ok=False)`)."""


class ModelRouter:
    """Makes a model call on the first route that takes it (see the module docstring)."""

    def __init__(
        self,
        routes: Sequence[ModelRoute],
        limits: RouteLimits,
        model_for: Callable[[ModelRoute], ModelClient],
        *,
        key_concurrency: int | None,
        lease_ms: int,
        clock: Callable[[], int],
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.routes = tuple(routes)
        self._limits = limits
        self._model_for = model_for
        self._key_concurrency = key_concurrency
        self._lease_ms = lease_ms
        self._clock = clock
        self._sleep = sleep
        self._held: dict[str, tuple[ModelRoute, str]] = {}
        """holder -> the route it holds a slot of now, and its key (written on the loop,
        read by the renewing thread)."""
        self._fallbacks_kept: set[str] = set()
        """Routes whose protocol fallback this process has recorded."""

    async def complete(
        self,
        request: ModelRequest,
        *,
        key: str,
        holder: str,
        tokens: int,
        should_stop: Callable[[], bool] | None = None,
        on_text: Callable[[str], None] | None = None,
        max_tokens: int | None = None,
        only: Sequence[str] | None = None,
        tell_ok: bool = True,
    ) -> Routed:
        """Return the first route's reply to `request`; its text goes to `on_text` as it
        comes (`RESTART` first when a route that wrote part of a reply failed); the
        reply is capped at `max_tokens` where that is less than a route's own cap.
        `only` names the routes to take, in order (a fork's `route=`); None: all.
        Without `tell_ok`, the route that replied is not told the call went well: the
        caller must, once (`Routed.ok`: with its save, or `tell`).

        Raises:
            Requeue: no route can take it within a moment.
            ModelCallError: the request is wrong, or every route failed (the last error).
        """
        waited: list[ModelRoute] = []
        text = _Restarting(on_text) if on_text is not None else None
        try:
            return await self._first_reply(
                request, key, holder, tokens, should_stop, waited=waited, text=text,
                max_tokens=max_tokens, routes=self._chosen(only), tell_ok=tell_ok,
            )  # fmt: skip
        except Requeue:
            waited.clear()  # it comes back: it keeps its places in the queues
            raise
        finally:
            self._held.pop(holder, None)
            for route in waited:
                await _quietly(partial(self._limits.leave, route, key=key, holder=holder), "leave")

    def _chosen(self, only: Sequence[str] | None) -> Sequence[ModelRoute]:
        if only is None:
            return self.routes
        by_name = {route.name: route for route in self.routes}
        chosen = [by_name[name] for name in only if name in by_name]
        if not chosen:
            raise ModelCallError(
                f"none of the run's routes ({', '.join(only)}) is configured on this worker",
                retryable=False,
            )
        return chosen

    def tell(self, ok: RouteNews) -> None:
        """Tell a route that a call went well (`Routed.ok`, where the caller's save could
        not take it along). Synchronous: its caller keeps the call's outcome on a thread,
        never on the loop."""
        _told(partial(self._limits.tell, ok), "done")

    def renew(self, holder: str) -> None:
        """Keep the route slot `holder` holds for another lease (called with its claim's
        renewal, so a long call keeps its slot and a dead worker's lapses)."""
        held = self._held.get(holder)
        if held is not None:
            route, key = held
            lease, now = self._lease_ms, self._clock()
            renew = partial(
                self._limits.renew, route, key=key, holder=holder, lease_ms=lease, now_ms=now
            )
            _told(renew, "renew")

    def renew_many(self, holders: Sequence[str]) -> None:
        """Keep the route slots every one of `holders` holds (those that hold one) for
        another lease, in one round trip: the renewal of all the calls the process's loop
        holds. Quiet: a failure is logged, never raised (the slots lapse with their lease)."""
        held = [(*found, holder) for holder in holders if (found := self._held.get(holder))]
        if not held:
            return
        try:
            self._limits.renew_many(held, lease_ms=self._lease_ms, now_ms=self._clock())
        except StoreUnavailable as error:
            log.warning("could not renew %d model route slots: %s", len(held), error)

    async def _first_reply(
        self,
        request: ModelRequest,
        key: str,
        holder: str,
        tokens: int,
        should_stop: Callable[[], bool] | None,
        *,
        waited: list[ModelRoute],
        text: _Restarting | None,
        max_tokens: int | None = None,
        routes: Sequence[ModelRoute] = (),
        tell_ok: bool = True,
    ) -> Routed:
        """The first of `routes`'s replies; `waited` gathers the routes that queued the call."""
        last: ModelCallError | None = None
        soonest: tuple[int, str] | None = None
        for index, route in enumerate(routes):
            more = index + 1 < len(routes)
            verdict = await self._turn(route, key=key, holder=holder, tokens=tokens, more=more)
            if isinstance(verdict, tuple):
                soonest = verdict if soonest is None else min(soonest, verdict)
                waited.append(route)
                continue
            charged = verdict
            self._held[holder] = (route, key)
            try:
                reply = await self._asked(
                    route, request, should_stop, text, more=more, max_tokens=max_tokens
                )
            except asyncio.CancelledError:  # (its run cancelled on the loop: as a stop)
                await self._stopped(route, key, holder, charged)
                raise
            except ModelCallError as error:
                error.route = route.name  # the metrics count the failure on it
                if should_stop is not None and should_stop():
                    await self._stopped(route, key, holder, charged)
                    raise  # (its run was cancelled or its lease lost: no other route either)
                paused = await self._failed(route, key, holder, error, charged)
                if error.status in WRONG_REQUEST:
                    raise
                if paused is not None:  # a 429 saying when: capacity, not a failure
                    soonest = paused if soonest is None else min(soonest, paused)
                else:
                    last = error
                continue
            ok = await self._succeeded(route, key, holder, reply, charged, tell_ok=tell_ok)
            return Routed(reply, route, ok)
        if soonest is not None and last is None:
            raise Requeue(*soonest)
        if last is not None:
            raise last
        raise ModelCallError("no model route is configured: set RELAY_MODEL_URL", retryable=False)

    async def _asked(
        self,
        route: ModelRoute,
        request: ModelRequest,
        should_stop: Callable[[], bool] | None,
        text: _Restarting | None,
        *,
        more: bool,
        max_tokens: int | None,
    ) -> ModelReply:
        """`route`'s reply (`more`: another route comes after it, which may take the call
        rather than this one wait or retry)."""
        if text is not None:
            text.restart()
        moment = MOMENT_MS / 1000
        return await self._model_for(route).complete(
            request,
            should_stop=should_stop,
            on_text=text,
            longest_wait=moment if more else None,  # the next route may take it now
            longest_retry_after=moment,
            most_attempts=1 if more else None,  # a route with a fallback: asked once
            may_retry=partial(self._usable, route),  # its circuit, before every retry
            max_tokens=max_tokens,
        )

    async def _succeeded(
        self, route: ModelRoute, key: str, holder: str, reply: ModelReply, charged: int,
        *, tell_ok: bool,
    ) -> RouteNews | None:  # fmt: skip
        """Tell the route the call went well, and what it used of what it was `charged`
        (the route learns its real rate); or, without `tell_ok`, return what it is to hear."""
        await self._keep_fallback(route)
        now, used = self._clock(), reply.usage.total_tokens
        spent = int((reply.spent_for_s or 0) * 1000)  # the server has nothing left till then
        ok = self._limits.news(
            route, key=key, holder=holder, now_ms=now, paused_until_ms=now + spent,
            charged=charged, used=used,
        )  # fmt: skip
        if not tell_ok:
            return ok
        await _quietly(partial(self._limits.tell, ok), "done")
        return None

    async def _keep_fallback(self, route: ModelRoute) -> None:
        """Record, once, that this process's client of `route` speaks text because its
        server refused the route's protocol (whether or not the call went well after)."""
        if route.name in self._fallbacks_kept:
            return
        refusal = self._model_for(route).protocol_fallback
        if refusal is None:
            return
        kept = await _quietly(partial(self._limits.fell_back, route, refusal), "fell_back")
        if kept is not None:
            self._fallbacks_kept.add(route.name)  # with Redis away, the next call tries again

    async def _usable(self, route: ModelRoute) -> bool:
        """Whether `route` may be asked again now (its circuit closed, not paused): a call
        that retries asks first, so a route the fleet gave up on is spared its retries."""
        usable = partial(self._limits.usable, route, self._clock())
        return await _quietly(usable, "usable") is not False

    async def _turn(
        self, route: ModelRoute, *, key: str, holder: str, tokens: int, more: bool
    ) -> tuple[int, str] | int:
        """Wait for the route's turn if it comes within a moment; the tokens its admission
        charged when admitted, else (when to come back, why not now)."""
        while True:
            now = self._clock()
            admitted = await _off_loop(partial(
                self._limits.admit, route, key=key, holder=holder, tokens=tokens,
                key_concurrency=self._key_concurrency, lease_ms=self._lease_ms, now_ms=now,
            ))  # fmt: skip
            if admitted.admitted:
                return admitted.charged
            why = f"route {route.name}: {admitted.verdict}"
            if admitted.verdict in ("paused", "open") and more:
                return (admitted.at_ms, why)  # the next route may take it now
            wait = admitted.at_ms - now
            if wait > MOMENT_MS:
                return (admitted.at_ms, why)
            await self._sleep(max(wait, 0) / 1000)

    async def _stopped(self, route: ModelRoute, key: str, holder: str, charged: int) -> None:
        """The call was stopped by its caller, not failed by the route: its slots and the
        tokens it was `charged` come back, and neither its circuit nor `relay routes`'
        last error hear of it (a few cancels must not shut a route for the fleet)."""
        done = partial(self._limits.done, route, key=key, holder=holder, outcome="stopped")
        await _quietly(partial(done, charged=charged, now_ms=self._clock()), "done")

    async def _failed(
        self, route: ModelRoute, key: str, holder: str, error: ModelCallError, charged: int
    ) -> tuple[int, str] | None:
        """Tell the route how the call failed (the tokens it was `charged` come back);
        return (until when, why) if a 429 paused it."""
        await self._keep_fallback(route)  # its text retry may have failed: the refusal still holds
        now = self._clock()
        if error.status == 429:
            pause = int((error.retry_after or 1.0) * 1000)
            outcome: Outcome = "limited"
        elif error.status in WRONG_REQUEST:
            pause, outcome = 0, "refused"
        else:
            pause, outcome = 0, "failed"
        done = partial(self._limits.done, route, key=key, holder=holder, outcome=outcome)
        done = partial(done, charged=charged)
        told = partial(done, now_ms=now, paused_until_ms=now + pause, error=error.message)
        circuit = await _quietly(told, "done") or "unknown"
        log.warning(
            "model route %s failed (%s; circuit %s): %s", route.name, outcome, circuit, error
        )
        if outcome == "limited" and error.retry_after is not None:
            return (now + pause, f"route {route.name}: 429, back in {pause} ms")
        return None


T = TypeVar("T")


async def _off_loop(call: Callable[[], T]) -> T:
    """`call()`'s answer, the call made in a thread: the limits speak to Redis on redis-py's
    synchronous client, which would hold the event loop (and every call on it) meanwhile."""
    return await asyncio.to_thread(call)


def _told(tell: Callable[[], T], what: str) -> T | None:
    """Tell the routes' limits something once the call is made (or given up): with Redis
    away, the reply must not be lost for it; the call's slots lapse with their lease."""
    try:
        return tell()
    except StoreUnavailable as error:
        log.warning("could not tell the model routes (%s): %s", what, error)
        return None


async def _quietly(tell: Callable[[], T], what: str) -> T | None:
    """`_told`, from the loop: in a thread (`_off_loop`)."""
    return await _off_loop(partial(_told, tell, what))


class _Restarting:
    """An `on_text` that says `RESTART` before a route begins again after another's text."""

    def __init__(self, on_text: Callable[[str], None]) -> None:
        self._on_text = on_text
        self._wrote = False

    def __call__(self, piece: str) -> None:
        self._wrote = piece != RESTART
        self._on_text(piece)

    def restart(self) -> None:
        if self._wrote:
            self(RESTART)
