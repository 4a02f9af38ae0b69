"""What a suite's trials add up to, per route and per case, and the forms it is
written in: plain data (`--json`), JUnit XML (`--junit`, for CI systems) and one
self-contained HTML page (`--html`) with a chart of pass rate against cost.

Figures per trial are means over the case's repeats; a route's figures are over all
its trials. A case on a route *falls short* when its pass rate is below its
`min_pass`: `relay eval` then exits 1.
"""

from __future__ import annotations

import html
import json
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from workers.evals.checks import FAILURE_KINDS
from workers.evals.runner import TrialResult

__all__ = ["Line", "Report", "build_report"]

DEFAULT_ROUTE = "(default)"
"""How a report names the app's routes taken in order (no --route given)."""


@dataclass(frozen=True)
class Line:
    """A route's figures, over all its trials or over one case's (`case`)."""

    route: str
    case: str | None
    trials: int
    passed: int
    min_pass: float | None
    model_calls: float
    tool_calls: float
    tokens: float
    cost_usd: float
    seconds: float
    retries: int
    invented: int
    failures: dict[str, int]

    @property
    def pass_rate(self) -> float:
        return self.passed / self.trials if self.trials else 0.0

    @property
    def short(self) -> bool:
        """A case below its min_pass."""
        return self.min_pass is not None and self.pass_rate < self.min_pass

    def as_dict(self) -> dict[str, Any]:
        return {
            "route": self.route,
            "case": self.case,
            "trials": self.trials,
            "passed": self.passed,
            "pass_rate": round(self.pass_rate, 4),
            "min_pass": self.min_pass,
            "falls_short": self.short,
            "model_calls": round(self.model_calls, 2),
            "tool_calls": round(self.tool_calls, 2),
            "tokens": round(self.tokens, 1),
            "cost_usd": round(self.cost_usd, 6),
            "seconds": round(self.seconds, 3),
            "retries": self.retries,
            "invented_tool_names": self.invented,
            "failures": self.failures,
        }


@dataclass(frozen=True)
class Report:
    suite: str
    routes: tuple[Line, ...]
    cases: tuple[Line, ...]
    results: tuple[TrialResult, ...]

    @property
    def short(self) -> list[Line]:
        """The cases that fell below their min_pass, on some route."""
        return [line for line in self.cases if line.short]

    def as_json(self) -> str:
        return json.dumps(
            {
                "suite": self.suite,
                "passed": not self.short,
                "routes": [line.as_dict() for line in self.routes],
                "cases": [line.as_dict() for line in self.cases],
                "trials": [_trial_dict(r) for r in self.results],
            },
            ensure_ascii=False,
            indent=2,
        )

    def junit(self) -> str:
        """JUnit XML: a test suite per route, a test case per trial."""
        top = ET.Element("testsuites", name=self.suite)
        for line in self.routes:
            mine = [r for r in self.results if _route_name(r) == line.route]
            suite = ET.SubElement(
                top,
                "testsuite",
                name=f"{self.suite} on {line.route}",
                tests=str(len(mine)),
                failures=str(len(mine) - line.passed),
                time=f"{sum(r.facts.seconds for r in mine):.3f}",
            )
            for result in mine:
                _junit_case(suite, result, line.route)
        ET.indent(top)
        return ET.tostring(top, encoding="unicode", xml_declaration=True) + "\n"

    def html(self) -> str:
        """One page: the chart of pass rate against cost per trial, then the tables."""
        rows = "".join(_html_row(line, bold=True) for line in self.routes)
        cases = "".join(_html_row(line, bold=False) for line in self.cases)
        title = html.escape(f"relay eval: {self.suite}")
        return _PAGE.format(
            title=title,
            chart=_chart(self.routes),
            head=_HEAD,
            rows=rows,
            cases=cases,
            verdict=html.escape(_verdict(self)),
        )


def build_report(suite: str, results: Sequence[TrialResult]) -> Report:
    """Sum the trials up per route and per case on a route."""
    by_route: dict[str, list[TrialResult]] = {}
    by_case: dict[tuple[str, str], list[TrialResult]] = {}
    for result in results:
        route = _route_name(result)
        by_route.setdefault(route, []).append(result)
        by_case.setdefault((route, result.trial.case.name), []).append(result)
    routes = tuple(_line(route, None, group) for route, group in by_route.items())
    cases = tuple(_line(route, case, group) for (route, case), group in by_case.items())
    return Report(suite, routes, cases, tuple(results))


def _route_name(result: TrialResult) -> str:
    return result.trial.route or DEFAULT_ROUTE


def _line(route: str, case: str | None, group: list[TrialResult]) -> Line:
    count = len(group)

    def mean(values: Sequence[float]) -> float:
        return sum(values) / count

    kinds = Counter(r.verdict.kind for r in group if r.verdict.kind is not None)
    return Line(
        route=route,
        case=case,
        trials=count,
        passed=sum(1 for r in group if r.verdict.passed),
        min_pass=group[0].trial.case.min_pass if case is not None else None,
        model_calls=mean([r.facts.model_calls for r in group]),
        tool_calls=mean([len(r.facts.calls) for r in group]),
        tokens=mean([r.facts.tokens for r in group]),
        cost_usd=mean([r.facts.cost_usd for r in group]),
        seconds=mean([r.facts.seconds for r in group]),
        retries=sum(len(r.facts.retries) for r in group),
        invented=sum(r.facts.invented for r in group),
        failures={k: kinds[k] for k in FAILURE_KINDS if kinds[k]},
    )


def _trial_dict(result: TrialResult) -> dict[str, Any]:
    facts = result.facts
    return {
        "route": _route_name(result),
        "case": result.trial.case.name,
        "repeat": result.trial.repeat,
        "runs": list(result.runs),
        "passed": result.verdict.passed,
        "failure": result.verdict.kind,
        "why": list(result.verdict.why),
        "stop": facts.stop.value if facts.stop is not None else None,
        "final": facts.final,
        "tool_calls": [{"tool": tool, "args": args} for tool, args in facts.calls],
        "model_calls": facts.model_calls,
        "tokens": facts.tokens,
        "cost_usd": round(facts.cost_usd, 6),
        "seconds": round(facts.seconds, 3),
        "retries": list(facts.retries),
    }


def _junit_case(suite: ET.Element, result: TrialResult, route: str) -> None:
    case = ET.SubElement(
        suite,
        "testcase",
        classname=route,
        name=f"{result.trial.case.name} #{result.trial.repeat}",
        time=f"{result.facts.seconds:.3f}",
    )
    if not result.verdict.passed:
        failure = ET.SubElement(case, "failure", message=result.verdict.kind or "failed")
        failure.text = "\n".join(result.verdict.why)
    if result.runs:
        ET.SubElement(case, "system-out").text = "runs: " + ", ".join(result.runs)


def _verdict(report: Report) -> str:
    short = report.short
    if not short:
        return "Every case reached its min_pass."
    named = ", ".join(f"{line.case} on {line.route}" for line in short)
    return f"{len(short)} case(s) fell below their min_pass: {named}."


_HEAD = (
    "<tr><th>route</th><th>case</th><th>pass</th><th>model calls</th><th>tool calls</th>"
    "<th>tokens</th><th>cost</th><th>seconds</th><th>retries</th><th>failures</th></tr>"
)


def _html_row(line: Line, *, bold: bool) -> str:
    failures = ", ".join(f"{kind} x{n}" for kind, n in line.failures.items()) or "—"
    marker = ' class="short"' if line.short else ""
    cells = [
        line.route,
        line.case or "all cases",
        f"{line.passed}/{line.trials} ({line.pass_rate:.0%})",
        f"{line.model_calls:.1f}",
        f"{line.tool_calls:.1f}",
        f"{line.tokens:,.0f}",
        f"${line.cost_usd:.6f}",
        f"{line.seconds:.2f}",
        f"{line.retries} ({line.invented} invented)",
        failures,
    ]
    tag = "th" if bold else "td"
    return f"<tr{marker}>" + "".join(f"<{tag}>{html.escape(c)}</{tag}>" for c in cells) + "</tr>"


_COLOURS = ("#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#4b5563")


def _chart(routes: Sequence[Line]) -> str:
    """An SVG scatter: one dot per route, pass rate up, cost per trial across."""
    width, height, left, bottom, top = 720, 340, 70, 50, 20
    most = max((line.cost_usd for line in routes), default=0.0) * 1.1 or 1e-6

    def x_of(cost: float) -> float:
        return left + (width - 2 * left) * cost / most

    def y_of(rate: float) -> float:
        return (height - bottom) - (height - bottom - top) * rate

    parts = [
        f'<svg role="img" viewBox="0 0 {width} {height}" width="{width}" height="{height}"'
        ' xmlns="http://www.w3.org/2000/svg"><title>Pass rate against cost per trial</title>',
        f'<line x1="{left}" y1="{y_of(0)}" x2="{width - left}" y2="{y_of(0)}" stroke="#888"/>',
        f'<line x1="{left}" y1="{y_of(1)}" x2="{left}" y2="{y_of(0)}" stroke="#888"/>',
        f'<text x="{width / 2}" y="{height - 8}" text-anchor="middle">cost per trial</text>',
        f'<text x="16" y="{height / 2}" transform="rotate(-90 16 {height / 2})"'
        ' text-anchor="middle">pass rate</text>',
    ]
    for rate in (0.0, 0.5, 1.0):
        parts.append(
            f'<text x="{left - 6}" y="{y_of(rate) + 4:.1f}" text-anchor="end">{rate:.0%}</text>'
        )
    for cost in (0.0, most / 2, most):
        parts.append(
            f'<text x="{x_of(cost):.1f}" y="{y_of(0) + 18:.1f}" text-anchor="middle">'
            f"${cost:.6f}</text>"
        )
    for number, line in enumerate(routes):
        x, y = x_of(line.cost_usd), y_of(line.pass_rate)
        colour = _COLOURS[number % len(_COLOURS)]
        label = html.escape(f"{line.route}: {line.pass_rate:.0%}, ${line.cost_usd:.6f}")
        # A label right of its dot, or left of it past the middle (it stays on the page).
        anchor, dx = ("end", -11) if x > width / 2 else ("start", 11)
        parts.append(
            f'<circle cx="{x:.1f}" cy="{y:.1f}" r="7" fill="{colour}"><title>{label}</title>'
            f'</circle><text x="{x + dx:.1f}" y="{y + 4:.1f}" text-anchor="{anchor}">{label}</text>'
        )
    return "".join(parts) + "</svg>"


_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font: 14px system-ui, sans-serif; margin: 2em; color: #111; }}
table {{ border-collapse: collapse; margin: 1em 0; }}
td, th {{ border: 1px solid #ccc; padding: 4px 8px; text-align: left; }}
tr.short {{ background: #fee2e2; }}
svg text {{ font-size: 12px; }}
</style></head>
<body>
<h1>{title}</h1>
<p>{verdict}</p>
{chart}
<h2>Routes</h2>
<table>{head}{rows}</table>
<h2>Cases</h2>
<table>{head}{cases}</table>
</body></html>
"""
