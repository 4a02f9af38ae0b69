"""Prices at work: what a model call may reserve, and what a reply cost.

Admission itself is atomic, in Redis: CLAIM checks a model call's estimate
against its tree's limits and reserves it (lua/claim.lua); the save that applies
its outcome settles it (lua/save.lua). This module supplies the numbers: the
reply's cap and the highest price a call may be charged (`Pricing.admission`),
and the exact cost of a reply (`Pricing.priced`). `load_prices` reads
RELAY_PRICES's file.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from workers.engine.budget import Admission, Price
from workers.engine.records import Usage
from workers.errors import SettingsError
from workers.model.endpoints import ModelRoute
from workers.model.wire import ModelReply

__all__ = ["Pricing", "load_prices"]


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


def load_prices(path: str | Path) -> dict[str, Price]:
    """Read prices from a JSON or TOML file: `{"model-name": {"input_per_m": 0.4, ...}}`.

    Raises:
        SettingsError: the file cannot be read, or a price is not one (one line, naming it).
    """
    where = Path(path)
    try:
        text = where.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise SettingsError(f"RELAY_PRICES: cannot read {where}: {error}") from error
    try:
        data: Any = tomllib.loads(text) if where.suffix.lower() == ".toml" else json.loads(text)
    except (tomllib.TOMLDecodeError, ValueError) as error:
        problem = f"{where} is not valid {_kind(where)}: {error}"
        raise SettingsError(f"RELAY_PRICES: {problem}") from error
    if not isinstance(data, dict):
        raise SettingsError(f"RELAY_PRICES: {where} must map model names to prices")
    prices = {}
    for name, value in data.items():
        try:
            prices[str(name)] = Price.model_validate(value)
        except ValidationError as error:
            first = error.errors()[0]
            field = ".".join(str(p) for p in first["loc"]) or "the price"
            raise SettingsError(
                f"RELAY_PRICES: {where}: model {name!r}: {field}: {first['msg']}"
            ) from None
    return prices


def _kind(path: Path) -> str:
    return "TOML" if path.suffix.lower() == ".toml" else "JSON"
