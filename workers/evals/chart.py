"""The HTML report's chart: one dot per route, pass rate up, cost per trial across
(model calls per trial when no route has a price, so an unpriced suite still shows
its routes apart), coloured by what the route's trials came to."""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

__all__ = ["COLOURS", "Dot", "State", "chart"]

State = Literal["passed", "some failed", "short"]

COLOURS: dict[State, tuple[str, str]] = {
    "passed": ("#16a34a", "every trial passed"),
    "some failed": ("#d97706", "some trials failed; every case reached its min_pass"),
    "short": ("#dc2626", "a case fell below its min_pass"),
}
"""Each state's colour, and what the legend says it means."""

_WIDTH, _HEIGHT, _LEFT, _BOTTOM, _TOP = 720, 380, 70, 50, 60


@dataclass(frozen=True)
class Dot:
    """A route on the chart."""

    route: str
    pass_rate: float
    cost_usd: float
    model_calls: float
    state: State


def chart(dots: Sequence[Dot]) -> str:
    """An SVG scatter of the routes, with a legend of what the colours mean."""
    priced = any(dot.cost_usd > 0 for dot in dots)
    across: Callable[[Dot], float] = (
        (lambda dot: dot.cost_usd) if priced else (lambda dot: dot.model_calls)
    )
    shown: Callable[[float], str] = (
        (lambda value: f"${value:.6f}") if priced else (lambda value: f"{value:.1f} calls")
    )
    what = "cost per trial" if priced else "model calls per trial (no route has a price)"
    most = max((across(dot) for dot in dots), default=0.0) * 1.1 or 1.0

    def x_of(value: float) -> float:
        return _LEFT + (_WIDTH - 2 * _LEFT) * value / most

    def y_of(rate: float) -> float:
        return (_HEIGHT - _BOTTOM) - (_HEIGHT - _BOTTOM - _TOP) * rate

    parts = [
        f'<svg role="img" viewBox="0 0 {_WIDTH} {_HEIGHT}" width="{_WIDTH}" height="{_HEIGHT}"'
        f' xmlns="http://www.w3.org/2000/svg"><title>Pass rate against {what}</title>',
        f'<line x1="{_LEFT}" y1="{y_of(0)}" x2="{_WIDTH - _LEFT}" y2="{y_of(0)}" stroke="#888"/>',
        f'<line x1="{_LEFT}" y1="{y_of(1)}" x2="{_LEFT}" y2="{y_of(0)}" stroke="#888"/>',
        f'<text x="{_WIDTH / 2}" y="{_HEIGHT - 8}" text-anchor="middle">{html.escape(what)}</text>',
        f'<text x="16" y="{_HEIGHT / 2}" transform="rotate(-90 16 {_HEIGHT / 2})"'
        ' text-anchor="middle">pass rate</text>',
        *_legend(),
    ]
    parts += [
        f'<text x="{_LEFT - 6}" y="{y_of(rate) + 4:.1f}" text-anchor="end">{rate:.0%}</text>'
        for rate in (0.0, 0.5, 1.0)
    ]
    parts += [
        f'<text x="{x_of(value):.1f}" y="{y_of(0) + 18:.1f}" text-anchor="middle">'
        f"{html.escape(shown(value))}</text>"
        for value in (0.0, most / 2, most)
    ]
    for dot in dots:
        x, y = x_of(across(dot)), y_of(dot.pass_rate)
        colour, meaning = COLOURS[dot.state]
        label = html.escape(f"{dot.route}: {dot.pass_rate:.0%}, {shown(across(dot))}")
        # A label right of its dot, or left of it past the middle (it stays on the page).
        anchor, dx = ("end", -11) if x > _WIDTH / 2 else ("start", 11)
        parts.append(
            f'<circle cx="{x:.1f}" cy="{y:.1f}" r="7" fill="{colour}" data-state="{dot.state}">'
            f"<title>{label} ({html.escape(meaning)})</title></circle>"
            f'<text x="{x + dx:.1f}" y="{y + 4:.1f}" text-anchor="{anchor}">{label}</text>'
        )
    return "".join(parts) + "</svg>"


def _legend() -> list[str]:
    parts = []
    for number, (colour, meaning) in enumerate(COLOURS.values()):
        y = 14 + 16 * number
        parts.append(
            f'<circle cx="{_LEFT + 6}" cy="{y - 4}" r="5" fill="{colour}"/>'
            f'<text x="{_LEFT + 16}" y="{y}">{html.escape(meaning)}</text>'
        )
    return parts
