"""What a run may spend, what a model call costs, and what admission works with.

    Budget(tokens=200_000, usd=1.50, model_calls=40, seconds=900)
    Price(input_per_m=0.40, output_per_m=1.60, cached_input_per_m=0.10)

A `Budget` caps a whole tree (a run and every specialist under it); each field
is optional. A `Price` is dollars per million tokens of one model, by the name
the server reports. Dollars are kept exactly inside, as whole micro-dollars
(a price per million tokens is micro-dollars per token): a call's cost is
rounded up to the next micro-dollar, so a tree's spend is never under-counted.

Admission is atomic, in Redis (CLAIM): a model call's `Admission` (its reply's
cap and the highest prices it may be charged) is checked against the tree's
`TreeLimits`; a call not admitted learns the limit it is `Over`
(`workers.engine.events.not_admitted` says what the run is told).
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from agent_core.text import counted

__all__ = ["NO_ADMISSION", "Admission", "Budget", "Over", "Price", "TreeLimits", "micro"]

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
            parts.append(counted(self.tokens, "token"))
        if self.usd is not None:
            parts.append(f"${self.usd:,.2f}")
        if self.model_calls is not None:
            parts.append(counted(self.model_calls, "model call"))
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


@dataclass(frozen=True)
class Admission:
    """What a model call's admission against its tree's budget needs beside the request:
    the reply's largest size, and the highest prices (micro-dollars per token) it may
    be charged. `max_tokens` 0: the reply's size is not capped (nor reserved for)."""

    max_tokens: int
    input_micro: float
    output_micro: float


NO_ADMISSION = Admission(0, 0.0, 0.0)


@dataclass(frozen=True)
class Over:
    """The limit a model call was not admitted under, with the numbers (for the person)."""

    limit: str
    """tokens, usd, model_calls, or deadline."""
    spent: int = 0
    reserved: int = 0
    cap: int = 0
    estimate: int = 0

    @classmethod
    def of(cls, text: str) -> Over | None:
        if not text:
            return None
        limit, *numbers = text.split("|")
        values = [int(float(n)) for n in numbers] + [0, 0, 0, 0]
        return cls(limit, *values[:4])


@dataclass(frozen=True)
class TreeLimits:
    """A tree's budget as it stands: tokens, micro-dollars, model calls, deadline (ms);
    None where it has no such limit; and what its calls in flight reserved."""

    tokens: int | None
    cost_micro: int | None
    model_calls: int | None
    deadline_ms: int | None
    reserved: tuple[int, int, int]
