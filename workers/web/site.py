"""What every route of one relay web shares: the Relay and its AsyncRelay, the settings,
the form tokens, the templates and the metrics registry; and deciding in a person's name."""

from __future__ import annotations

import hashlib
import hmac
import time
from dataclasses import dataclass
from typing import Any

from prometheus_client.registry import CollectorRegistry
from starlette.requests import Request
from starlette.responses import Response
from starlette.templating import Jinja2Templates

from workers.aio import AsyncRelay
from workers.errors import DecisionRefused
from workers.relay import Relay
from workers.web.auth import FormTokens, WebSettings

__all__ = ["Web"]


@dataclass
class Web:
    """What every route of one relay web shares."""

    relay: Relay
    arelay: AsyncRelay
    """The routes' client: its reads and decisions are awaited on the server's loop."""
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

    async def decide(
        self,
        user: str,
        kind: str,
        run_id: str,
        what: str,
        *,
        yes: bool,
        reason: str = "",
        args: dict[str, Any] | None = None,
    ) -> str:
        """Decide a pending call or plan in `user`'s name (a call approved with `args` if
        given: edited arguments); return what was done, in words.

        Raises:
            DecisionRefused: it is not pending (any more), was decided already, or the
                edited arguments are refused (the call stays pending).
            RunNotFound: there is no such run.
        """
        verb, relay = ("approved" if yes else "denied"), self.arelay
        if kind == "call":
            why = reason or f"denied by {user} in relay web"
            await relay.approve(
                run_id, what, yes, "" if yes else why, args=args if yes else None, by=user
            )
            edited = " with edited arguments" if yes and args is not None else ""
            return f"{verb} {what} of run {run_id}{edited}"
        if kind == "cancel":
            why = reason or f"cancelled by {user} in relay web"
            if not await relay.cancel(run_id, why):
                raise DecisionRefused(f"run {run_id} had finished already")
            return f"cancelling run {run_id} (its specialists stop too)"
        if kind == "plan":
            pending = [p for p in (await relay.status(run_id)).pending if p.kind == "plan"]
            if not pending or str(pending[0].seq) != what:
                raise DecisionRefused(f"the plan of run {run_id} you saw is no longer pending")
            await relay.approve_plan(run_id, yes=yes, by=user)
            return f"{verb} the plan of run {run_id}"
        raise DecisionRefused(f"relay web decides calls and plans and cancels runs, not {kind!r}")

    def signed(self, text: str) -> str:
        """A signature for `text` (a message this server puts in a redirect's URL)."""
        return hmac.new(self.settings.secret, text.encode(), hashlib.sha256).hexdigest()[:32]

    def form_token(self, user: str, pending: dict[str, Any]) -> str:
        what = (pending["kind"], pending["run_id"], pending["what"])
        return self.tokens.issue(user, what, int(time.time()))
