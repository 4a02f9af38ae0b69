"""Budgets on the command line: the options `relay run` and `relay schedule add` take,
and `relay extend`.

    relay run "task" --budget-tokens 200000 --budget-usd 1.50 --budget-calls 40 --deadline 15m
    relay extend RUN --usd 1.00 --tokens 50000 --calls 10 --seconds 10m
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any, TypeVar

import click
from pydantic import ValidationError

from workers.cli.common import Context, Failure, app_option, who
from workers.cli.terminal import one_line
from workers.engine.budget import Budget

__all__ = ["Duration", "budget_from", "budget_options", "extend"]

F = TypeVar("F", bound=Callable[..., Any])

_PART = re.compile(r"(\d+(?:\.\d+)?)\s*(h|m|s)?", re.IGNORECASE)
_SCALE = {"h": 3600.0, "m": 60.0, "s": 1.0, None: 1.0}


class Duration(click.ParamType[float]):
    """Seconds, written `90`, `90s`, `15m`, `1h30m` or `2.5h`."""

    name = "duration"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        given = value if isinstance(value, int | float) and not isinstance(value, bool) else None
        seconds = float(given) if given is not None else _seconds(str(value))
        if seconds is None:
            self.fail(f"{value!r} is not a duration (like 90s, 15m or 1h30m)", param, ctx)
        if not math.isfinite(seconds) or seconds <= 0:
            self.fail(f"{value!r} is not a duration of more than 0 seconds", param, ctx)
        return seconds


def _seconds(text: str) -> float | None:
    text = text.strip()
    if not text:
        return None
    total, at = 0.0, 0
    for part in _PART.finditer(text):
        if part.start() != at:
            return None
        unit = part.group(2).lower() if part.group(2) else None
        total += float(part.group(1)) * _SCALE[unit]
        at = part.end()
    return total if at == len(text) else None


class _Positive(click.ParamType[Any]):
    """A positive, finite number (`int` for counts)."""

    def __init__(self, kind: type[int] | type[float]) -> None:
        self.kind = kind
        self.name = "count" if kind is int else "number"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        try:
            number = self.kind(value)
        except (TypeError, ValueError):
            self.fail(
                f"{value!r} is not a {'whole ' if self.kind is int else ''}number", param, ctx
            )
        if not math.isfinite(number) or number <= 0:
            self.fail(f"{value!r} is not more than 0", param, ctx)
        return number


COUNT = _Positive(int)
DOLLARS = _Positive(float)


def budget_options(fn: F) -> F:
    """Add --budget-tokens, --budget-usd, --budget-calls and --deadline to a command."""
    options = [
        click.option(
            "--deadline",
            type=Duration(),
            help="Stop the run (and its specialists) after this long: 90s, 15m, 1h30m.",
        ),
        click.option("--budget-calls", type=COUNT, help="Model calls the run tree may make."),
        click.option("--budget-usd", type=DOLLARS, help="Dollars the run tree may spend."),
        click.option("--budget-tokens", type=COUNT, help="Tokens the run tree may use."),
    ]
    for option in options:
        fn = option(fn)
    return fn


def budget_from(
    tokens: int | None, usd: float | None, calls: int | None, seconds: float | None
) -> Budget | None:
    """The Budget the options ask for (None: no limits)."""
    try:
        budget = Budget(tokens=tokens, usd=usd, model_calls=calls, seconds=seconds)
    except ValidationError as error:
        first = error.errors()[0]
        raise Failure(f"budget: {'.'.join(map(str, first['loc']))}: {first['msg']}") from None
    return None if budget.empty else budget


@click.command()
@click.argument("run_id")
@click.option("--tokens", type=COUNT, help="Raise the tree's token limit by this many.")
@click.option("--usd", type=DOLLARS, help="Raise the tree's dollar limit by this much.")
@click.option("--calls", type=COUNT, help="Raise the tree's model-call limit by this many.")
@click.option("--seconds", type=Duration(), help="Give the tree this much more time (15m).")
@app_option
@click.pass_obj
def extend(
    obj: Context,
    run_id: str,
    *,
    tokens: int | None,
    usd: float | None,
    calls: int | None,
    seconds: float | None,
) -> None:
    """Raise the budget of a run's tree, and let its runs parked at the budget go on.

    A limit the tree was started without stays unlimited. `relay pending`
    lists the runs waiting for their budget. The runs' traces say who raised it
    (the login name, as for approvals) and by what.
    """

    more = budget_from(tokens, usd, calls, seconds)
    if more is None:
        raise click.UsageError("say what to raise: --tokens, --usd, --calls or --seconds")
    woken = obj.relay.extend(run_id, more, by=who())
    runs = "no parked run" if woken == 0 else f"{woken} parked run{'s' if woken > 1 else ''}"
    click.echo(one_line(f"Raised the budget of {run_id} by {more.describe()}; {runs} went on."))
