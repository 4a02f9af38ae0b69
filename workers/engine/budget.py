"""What a run may spend, and what a model call costs.

    Budget(tokens=200_000, usd=1.50, model_calls=40, seconds=900)
    Price(input_per_m=0.40, output_per_m=1.60, cached_input_per_m=0.10)

A `Budget` caps a whole tree (a run and every specialist under it); each field
is optional. A `Price` is dollars per million tokens of one model, by the name
the server reports. Dollars are kept exactly inside, as whole micro-dollars
(a price per million tokens is micro-dollars per token): a call's cost is
rounded up to the next micro-dollar, so a tree's spend is never under-counted.
"""

from __future__ import annotations

import json
import tomllib
from decimal import ROUND_CEILING, Decimal
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from workers.errors import SettingsError

__all__ = ["Budget", "Price", "load_prices", "micro"]

_Dollars = Annotated[float, Field(ge=0, le=10**6, allow_inf_nan=False)]


def micro(usd: float) -> int:
    """Dollars as whole micro-dollars, rounded up."""
    return int(Decimal(str(usd)).scaleb(6).to_integral_value(rounding=ROUND_CEILING))


class Budget(BaseModel):
    """Caps on a whole run tree: tokens, dollars, model calls and seconds, each optional.

    A run at a tokens, dollars or model-call cap parks (`waiting_for="budget"`)
    until `relay.extend`, `relay.cancel` or RELAY_APPROVAL_TTL; when `seconds`
    (counted from the start) pass, the run stops with `Stop.BUDGET_EXCEEDED`.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    tokens: Annotated[int, Field(gt=0, le=10**15, strict=True)] | None = None
    usd: Annotated[float, Field(gt=0, le=10**9, allow_inf_nan=False)] | None = None
    model_calls: Annotated[int, Field(gt=0, le=10**9, strict=True)] | None = None
    seconds: Annotated[float, Field(gt=0, le=10**9, allow_inf_nan=False)] | None = None

    @property
    def empty(self) -> bool:
        return all(v is None for v in (self.tokens, self.usd, self.model_calls, self.seconds))

    @property
    def usd_micro(self) -> int | None:
        return None if self.usd is None else micro(self.usd)

    def describe(self) -> str:
        """A short line: `200,000 tokens, $1.50, 40 model calls, 900 s`."""
        parts = []
        if self.tokens is not None:
            parts.append(f"{self.tokens:,} tokens")
        if self.usd is not None:
            parts.append(f"${self.usd:,.2f}")
        if self.model_calls is not None:
            parts.append(f"{self.model_calls:,} model calls")
        if self.seconds is not None:
            parts.append(f"{self.seconds:g} s")
        return ", ".join(parts) or "no limits"


class Price(BaseModel):
    """Dollars per million tokens of one model: prompt (input), completion (output), and
    prompt tokens the server served from its cache (default: the input price)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    input_per_m: _Dollars
    output_per_m: _Dollars
    cached_input_per_m: _Dollars | None = None

    def cost_micro(self, prompt: int, completion: int, cached: int = 0) -> int:
        """The exact cost of a call in micro-dollars, rounded up to a whole one."""
        cached = min(max(cached, 0), prompt)
        cached_per_m = self.cached_input_per_m
        total = (
            Decimal(str(self.input_per_m)) * (prompt - cached)
            + Decimal(str(self.input_per_m if cached_per_m is None else cached_per_m)) * cached
            + Decimal(str(self.output_per_m)) * completion
        )
        return int(total.to_integral_value(rounding=ROUND_CEILING))

    def estimate_micro(self, prompt: int, completion: int) -> int:
        """The most a call of that size can cost (no cache discount), in micro-dollars."""
        return self.cost_micro(prompt, completion)


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
