"""The relay web application: its parts, its routes, and deciding for a person.

    build_app(relay, WebSettings.of(user, password))   -> a Starlette (ASGI) app

Starlette routes each request; pages are Jinja2 templates (autoescaped), and a
few lines of our own JavaScript (`static/relay.js`) follow a run's trace. The
client API is synchronous (redis-py), so handlers run it in Starlette's thread
pool. `workers.web.pages` holds the HTML pages, `workers.web.api` the JSON API
for scripts, `workers.web.exporter` /metrics; every route needs basic auth.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, select_autoescape
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import CollectorRegistry
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from workers.errors import DecisionRefused
from workers.relay import Relay
from workers.runtime.metrics import FleetMetrics
from workers.settings import now_ms
from workers.web.auth import BasicAuth, FormTokens, WebSettings
from workers.web.exporter import registry_for

__all__ = ["Web", "build_app"]

HERE = Path(__file__).parent


@dataclass
class Web:
    """What every route of one relay web shares."""

    relay: Relay
    settings: WebSettings
    tokens: FormTokens
    templates: Jinja2Templates
    registry: CollectorRegistry

    def user(self, request: Request) -> str:
        """The signed-in user (BasicAuth put it there)."""
        return str(request.state.user)

    def page(self, request: Request, name: str, status: int = 200, **context: Any) -> Response:
        context.update(user=self.user(request), flower_url=self.settings.flower_url)
        return self.templates.TemplateResponse(request, name, context, status_code=status)

    def decide(
        self, user: str, kind: str, run_id: str, what: str, *, yes: bool, reason: str = ""
    ) -> str:
        """Decide a pending call or plan in `user`'s name; return what was done, in words.

        Raises:
            DecisionRefused: it is not pending (any more), or was decided already.
            RunNotFound: there is no such run.
        """
        verb, client = ("approved" if yes else "denied"), self.relay.runs_client
        if kind == "call":
            why = reason or f"denied by {user} in relay web"
            client.approve(run_id, what, yes=yes, reason="" if yes else why, by=user)
            return f"{verb} {what} of run {run_id}"
        if kind == "plan":
            pending = [p for p in self.relay.status(run_id).pending if p.kind == "plan"]
            if not pending or str(pending[0].seq) != what:
                raise DecisionRefused(f"the plan of run {run_id} you saw is no longer pending")
            client.approve_plan(run_id, yes=yes, by=user)
            return f"{verb} the plan of run {run_id}"
        raise DecisionRefused(f"relay web decides calls and plans, not {kind!r}")

    def signed(self, text: str) -> str:
        """A signature for `text` (a message this server puts in a redirect's URL)."""
        return hmac.new(self.settings.secret, text.encode(), hashlib.sha256).hexdigest()[:32]

    def form_token(self, user: str, pending: dict[str, Any]) -> str:
        what = (pending["kind"], pending["run_id"], pending["what"])
        return self.tokens.issue(user, what, int(time.time()))


def _claim_nonce(relay: Relay) -> Any:
    store = relay.store

    def claim(nonce: str, ttl_s: int) -> bool:
        with store.errors():
            return bool(store.redis.set(store.keys.web_used(nonce), 1, nx=True, ex=ttl_s))

    return claim


def build_app(relay: Relay, settings: WebSettings) -> Starlette:
    """Return relay web for `relay`'s runs, behind `settings`' basic auth."""
    from workers.web import api, pages  # noqa: PLC0415 - they import Web from here

    environment = Environment(
        loader=FileSystemLoader(HERE / "templates"),
        autoescape=select_autoescape(default=True),
    )
    web = Web(
        relay=relay,
        settings=settings,
        tokens=FormTokens(settings.secret, _claim_nonce(relay)),
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
    return Starlette(routes=routes, middleware=middleware)
