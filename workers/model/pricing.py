"""Budgets at work: what a model call may reserve, what it cost, and what a person is told.

Admission itself is atomic, in Redis: CLAIM checks a model call's estimate
against its tree's limits and reserves it (lua/claim.lua); the save that applies
its outcome settles it (lua/save.lua). This module supplies the numbers: the
reply's cap and the highest price a call may be charged (`Pricing.admission`),
the exact cost of a reply (`Pricing.priced`), and the event a call that was not
admitted becomes (`not_admitted`): a run at a limit parks until `relay.extend`;
a run whose time is up stops.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from workers.engine.budget import Price
from workers.engine.records import BudgetReached, InboxEvent, ModelFailed, Usage
from workers.model.routes import ModelRoute
from workers.model.wire import ModelReply
from workers.store.runs import Admission, Over

__all__ = ["Pricing", "not_admitted"]


class Pricing:
    """The prices of the models one worker may call: a route's own price, else the price
    of the model by the name the server reports (or the name asked for)."""

    def __init__(
        self,
        prices: Mapping[str, Price],
        model: str,
        max_tokens: int,
        routes: Sequence[ModelRoute] = (),
    ) -> None:
        self.prices = dict(prices)
        self.model = model
        self.max_tokens = max_tokens
        self.routes = tuple(routes)

    def admission(self) -> Admission:
        """What a model call reserves beside its request: the reply's cap, and the highest
        prices it may be charged on any route (micro-dollars per token: dollars per
        million)."""
        known = [self._price_of(r.model, r) for r in self.routes] or [self.prices.get(self.model)]
        priced = [p for p in known if p is not None]
        if not priced:
            return Admission(self.max_tokens, 0.0, 0.0)
        highest_in = max(p.input_per_m for p in priced)
        highest_out = max(p.output_per_m for p in priced)
        return Admission(self.max_tokens, highest_in, highest_out)

    def _price_of(self, model: str, route: ModelRoute | None) -> Price | None:
        if route is not None and route.price is not None:
            return route.price
        return self.prices.get(model)

    def priced(self, reply: ModelReply, route: ModelRoute | None = None) -> Usage:
        """The reply's usage with its exact cost (0, and counted as unpriced, for a model
        with no price)."""
        usage = reply.usage.model_copy(update={"model_calls": 1})
        asked = route.model if route is not None else self.model
        price = self._price_of(reply.model or asked, route) or self._price_of(asked, route)
        if price is None:
            return usage.model_copy(update={"unpriced_calls": 1})
        cost = price.cost_micro(
            usage.prompt_tokens, usage.completion_tokens, usage.cached_prompt_tokens
        )
        return usage.model_copy(update={"cost_micro": cost})


def not_admitted(seq: int, over: Over) -> InboxEvent:
    """The event for a model call its tree's budget did not admit."""
    if over.limit == "deadline":
        return ModelFailed(seq=seq, error="The run's time budget ran out.", budget=True)
    if over.limit == "usd":
        spent, cap, need = (f"${n / 1_000_000:,.6f}" for n in (over.spent, over.cap, over.estimate))
        held = f"${over.reserved / 1_000_000:,.6f}"
        detail = f"The tree has spent {spent} of its {cap}"
    else:
        what = "tokens" if over.limit == "tokens" else "model calls"
        spent, cap, need = (f"{n:,} {what}" for n in (over.spent, over.cap, over.estimate))
        held = f"{over.reserved:,}"
        detail = f"The tree has used {spent} of its {cap}"
    reserved = f" ({held} held by calls under way)" if over.reserved else ""
    detail += f"{reserved}; the next model call may need {need}. Extend the budget to go on."
    limit = "usd" if over.limit == "usd" else "tokens" if over.limit == "tokens" else "model_calls"
    return BudgetReached(seq=seq, limit=limit, detail=detail)
