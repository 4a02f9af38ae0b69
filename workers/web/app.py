"""The relay web application: its parts, its routes, and deciding for a person.

    build_app(relay, WebSettings.of(user, password))   -> a Starlette (ASGI) app

Starlette routes each request; pages are Jinja2 templates (autoescaped), and a
few lines of our own JavaScript (`static/relay.js`) follow a run's trace.

The routes of runs, approvals and the API await an `AsyncRelay` (redis.asyncio) on
the server's event loop: a page that reads a hundred runs, or a script polling a
run's trace, holds no thread. What other rooms read with redis-py only (the schedule
store, the route states, the metrics collector) and what replays runs (a fork, a
diff) runs in Starlette's thread pool.

`workers.web.site` is what every route shares, `workers.web.pages` holds the HTML
pages, `workers.web.api` the JSON API for scripts, `workers.web.exporter` /metrics;
every route needs basic auth.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

from jinja2 import Environment, FileSystemLoader, select_autoescape
from prometheus_client.exposition import choose_encoder
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from workers.aio import AsyncRelay
from workers.relay import Relay
from workers.runtime.metrics import FleetMetrics
from workers.settings import now_ms
from workers.store.ops import command_steps
from workers.web import api, pages
from workers.web.auth import BasicAuth, FormTokens, WebSettings
from workers.web.exporter import registry_for
from workers.web.site import Web
from workers.web.views import MARKS

__all__ = ["build_app"]

HERE = Path(__file__).parent


def _claim_nonce(arelay: AsyncRelay) -> Callable[[str, int], Awaitable[bool]]:
    async def claim(nonce: str, ttl_s: int) -> bool:
        key = arelay.keys.web_used(nonce)
        return bool(await arelay.drive(command_steps("SET", key, 1, "NX", "EX", ttl_s)))

    return claim


def build_app(relay: Relay, settings: WebSettings) -> Starlette:
    """Return relay web for `relay`'s runs, behind `settings`' basic auth."""
    environment = Environment(
        loader=FileSystemLoader(HERE / "templates"),
        autoescape=select_autoescape(default=True),
    )
    environment.globals["marks"] = MARKS
    arelay = AsyncRelay(relay)
    web = Web(
        relay=relay,
        arelay=arelay,
        settings=settings,
        tokens=FormTokens(settings.secret, _claim_nonce(arelay)),
        templates=Jinja2Templates(env=environment),
        registry=registry_for(
            FleetMetrics(relay.store.connection, relay.store.shards, relay.store.people),
            now_ms,
            relay.route_states,
        ),
    )

    async def metrics(request: Request) -> Response:
        # The format the scraper asks for (Prometheus text, or OpenMetrics).
        encode, content_type = choose_encoder(request.headers.get("accept", ""))
        body = await run_in_threadpool(encode, web.registry)
        return Response(body, headers={"Content-Type": content_type})

    routes = [
        *pages.routes(web),
        *api.routes(web),
        Route("/metrics", metrics),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    middleware = [Middleware(BasicAuth, user=settings.user, password=settings.password)]

    @asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        yield
        await arelay.aclose()

    return Starlette(routes=routes, middleware=middleware, lifespan=lifespan)
