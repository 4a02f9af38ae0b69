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
from workers.engine.budget import Budget
from workers.engine.records import RunStatus
from workers.errors import DecisionRefused, RelayError, RunNotFound
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
        more: Budget | None = None,
    ) -> str:
        """Decide what waits on a person, in `user`'s name, through the client API the
        command line uses; return what was done, in words. A call is approved (with
        `args` if given: edited arguments) or denied; a plan approved or not; a question
        answered with `reason` (`relay answer`); a tree's budget raised by `more`
        (`relay extend`); a run cancelled. A plan, question or budget is named by its
        step (`what`): a form for one the run no longer waits on is refused.

        Raises:
            DecisionRefused: it is not pending (any more), was decided already, the
                edited arguments are refused (the call stays pending), or the budget
                has no limit `more` raises, or would stay full after it.
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
            await self._still_waiting(run_id, "plan", what, "the plan")
            await relay.approve_plan(run_id, yes=yes, by=user)
            return f"{verb} the plan of run {run_id}"
        if kind == "question":
            await self._still_waiting(run_id, "question", what, "the question")
            await relay.answer(run_id, reason, by=user)
            return f"answered the question of run {run_id}"
        if kind == "budget" and more is not None:
            return await self._raise(user, run_id, what, more)
        raise DecisionRefused(
            f"relay web decides calls, plans, questions and budgets, not {kind!r}"
        )

    async def _raise(self, user: str, run_id: str, step: str, more: Budget) -> str:
        """Raise the budget run `run_id` is parked at at `step` by `more`, once: EXTEND
        checks in Redis, with the raise, that this wait is still pending (a second form
        or POST for it is refused, even one sent at the same moment) and that the raise
        leaves the tree room for the model call the run parked at (else the run would
        park again at once: the raise is refused saying which limit and how much more,
        raising nothing)."""
        if not (step.isascii() and step.isdigit()):
            raise DecisionRefused(f"the budget of run {run_id} is named by its step: {step!r}")
        status = await self.arelay.status(run_id)
        never = _unlimited(status.budget, more)
        if never:  # (refused before EXTEND, which would raise the tree's other limits)
            raise DecisionRefused(
                f"the budget of run {status.root} has no limit of {never} to raise"
            )
        try:
            woken = await self.arelay.extend(run_id, more, step=int(step), by=user)
        except (RunNotFound, DecisionRefused):
            raise
        except RelayError as error:  # a limit the tree never had
            raise DecisionRefused(str(error)) from None
        others = woken - 1
        also = f", and {others} other parked run{'s' * (others > 1)} of its tree" * (others > 0)
        return (
            f"raised the budget of run {status.root}'s tree by {more.describe()};"
            f" run {run_id} goes on from step {step}{also}"
        )

    async def _still_waiting(self, run_id: str, kind: str, step: str, shown: str) -> RunStatus:
        """The run's status, once sure it still waits on `shown` (the plan, question or
        budget of step `step`); refused once it went on, or waits on a later one."""
        status = await self.arelay.status(run_id)
        pending = [p for p in status.pending if p.kind == kind]
        if not pending or str(pending[0].seq) != step:
            raise DecisionRefused(f"{shown} of run {run_id} you saw is no longer pending")
        return status

    def signed(self, text: str) -> str:
        """A signature for `text` (a message this server puts in a redirect's URL)."""
        return hmac.new(self.settings.secret, text.encode(), hashlib.sha256).hexdigest()[:32]

    def form_token(self, user: str, pending: dict[str, Any]) -> str:
        what = (pending["kind"], pending["run_id"], pending["what"])
        return self.tokens.issue(user, what, int(time.time()))


_LIMITS = {"tokens": "tokens", "usd": "dollars", "model_calls": "model calls", "seconds": "time"}


def _unlimited(budget: Budget | None, more: Budget) -> str:
    """What `more` raises that `budget` has no limit of ("tokens, dollars"; "" if none):
    a limit a tree was started without stays unlimited, so raising it is refused."""
    return ", ".join(
        label
        for field, label in _LIMITS.items()
        if getattr(more, field) is not None and getattr(budget, field, None) is None
    )
