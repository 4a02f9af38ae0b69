"""What a suite's trials add up to, per route and per case, and the forms it is
written in: plain data (`--json`), JUnit XML (`--junit`, for CI systems) and one
self-contained HTML page (`--html`) with a chart of pass rate against cost (against
model calls when no route has a price).

Figures per trial are means over the case's repeats; a route's figures are over all
its trials. A case on a route *falls short* when its pass rate is below its
`min_pass`: `relay eval` then exits 1. Every form carries each failed trial's
reasons (its stop and the run's message, the tool names it invented, the calls the
eval declined) and the end of its trace, so a report read after a private Redis is
gone still says why; its run ids are then marked as gone, not offered for lookup.
"""

from __future__ import annotations

import html
import json
import re
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from workers.evals.chart import Dot, State, chart
from workers.evals.checks import FAILURE_KINDS
from workers.evals.runner import TrialResult

__all__ = ["Line", "Report", "build_report"]

DEFAULT_ROUTE = "(default)"
"""How a report names the app's routes taken in order (no --route given)."""
RUNS_GONE = "the runs were in relay eval's private Redis, gone when it ended"
"""What a report says of its run ids when nobody can look them up any more."""
REPLACEMENT = "\ufffd"
# What a model, a tool or a run may have written that has no place in a file a person
# or a CI system reads: the characters XML 1.0 forbids (C0 controls but tab, newline
# and carriage return; lone surrogates, which JSON allows; U+FFFE and U+FFFF) and the
# C1 controls a terminal acts on (`\x9b` is CSI) when someone `cat`s the file.
_NOT_IN_A_FILE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff\ufffe\uffff]")
_SURROGATE = re.compile("[\ud800-\udfff]")


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
    runs_kept: bool = True
    """The runs can still be looked up (False: they were in a private Redis, gone)."""

    @property
    def short(self) -> list[Line]:
        """The cases that fell below their min_pass, on some route."""
        return [line for line in self.cases if line.short]

    @property
    def failed(self) -> list[TrialResult]:
        """The trials that did not pass, in the order they were given."""
        return [r for r in self.results if not r.verdict.passed]

    def runs_of(self, result: TrialResult) -> str:
        """The trial's run ids, as they may be used: to look up, or as gone."""
        runs = ", ".join(result.runs) or "none"
        return f"runs: {runs}" if self.runs_kept else f"runs: {runs} ({RUNS_GONE})"

    def as_json(self) -> str:
        """The report as JSON (UTF-8 text: a lone surrogate is written as its escape)."""
        text = json.dumps(
            {
                "suite": self.suite,
                "passed": not self.short,
                "runs_kept": self.runs_kept,
                **({} if self.runs_kept else {"runs_note": RUNS_GONE}),
                "routes": [line.as_dict() for line in self.routes],
                "cases": [line.as_dict() for line in self.cases],
                "trials": [_trial_dict(r) for r in self.results],
            },
            ensure_ascii=False,
            indent=2,
        )
        # (one can stand only inside a string, where the escape means the same)
        return _SURROGATE.sub(lambda found: f"\\u{ord(found[0]):04x}", text)

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
                _junit_case(suite, result, line.route, self.runs_of(result))
        ET.indent(top)
        return _in_a_file(ET.tostring(top, encoding="unicode", xml_declaration=True)) + "\n"

    def html(self) -> str:
        """One page: the chart of pass rate against cost per trial, then the tables."""
        rows = "".join(_html_row(line, bold=True) for line in self.routes)
        cases = "".join(_html_row(line, bold=False) for line in self.cases)
        title = html.escape(f"relay eval: {self.suite}")
        page = _PAGE.format(
            title=title,
            chart=chart([_dot(line, self) for line in self.routes]),
            head=_HEAD,
            rows=rows,
            cases=cases,
            failed=_html_failed(self),
            verdict=html.escape(_verdict(self)),
        )
        return _in_a_file(page)


def _in_a_file(text: str) -> str:
    """`text` (XML or HTML, every value in it escaped) with each character it may not
    hold, or a terminal would act on, as U+FFFD: our markup has none, so only what the
    models, tools and runs wrote is touched, and a reader sees something was there."""
    return _NOT_IN_A_FILE.sub(REPLACEMENT, text)


def build_report(suite: str, results: Sequence[TrialResult], *, runs_kept: bool = True) -> Report:
    """Sum the trials up per route and per case on a route (`runs_kept` False: the
    runs' Redis is gone, so the report says so of their ids)."""
    by_route: dict[str, list[TrialResult]] = {}
    by_case: dict[tuple[str, str], list[TrialResult]] = {}
    for result in results:
        route = _route_name(result)
        by_route.setdefault(route, []).append(result)
        by_case.setdefault((route, result.trial.case.name), []).append(result)
    routes = tuple(_line(route, None, group) for route, group in by_route.items())
    cases = tuple(_line(route, case, group) for (route, case), group in by_case.items())
    return Report(suite, routes, cases, tuple(results), runs_kept)


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
        "tool_calls": _calls(result),
        "model_calls": facts.model_calls,
        "tokens": facts.tokens,
        "cost_usd": round(facts.cost_usd, 6),
        "seconds": round(facts.seconds, 3),
        "retries": list(facts.retries),
        "earlier_runs": [{"stop": stop.value, "message": said} for stop, said in facts.earlier],
        "declined": list(facts.declined),
        "trace": list(result.trace),
    }


def _calls(result: TrialResult) -> list[dict[str, Any]]:
    """The trial's calls, each saying whether it ran for real (the app's own tool), was
    answered from the case's `recorded`, or did not run (declined, denied)."""
    recorded = {r.tool for r in result.trial.case.recorded}
    outcomes = result.facts.outcomes or ("",) * len(result.facts.calls)
    found = []
    for (tool, args), outcome in zip(result.facts.calls, outcomes, strict=True):
        ran = "recorded" if tool in recorded else "for real"
        if outcome in ("", "declined"):
            ran = "not run"
        found.append({"tool": tool, "args": args, "outcome": outcome or None, "ran": ran})
    return found


def _junit_case(suite: ET.Element, result: TrialResult, route: str, runs: str) -> None:
    case = ET.SubElement(
        suite,
        "testcase",
        classname=route,
        name=f"{result.trial.case.name} #{result.trial.repeat}",
        time=f"{result.facts.seconds:.3f}",
    )
    if not result.verdict.passed:
        kind = result.verdict.kind or "failed"
        first = result.verdict.why[0] if result.verdict.why else ""
        failure = ET.SubElement(case, "failure", message=f"{kind}: {first}"[:1000])
        failure.text = "\n".join(result.verdict.why)
    out = [runs, *result.facts.declined]
    if result.trace:
        out += ["the end of its trace:", *result.trace]
    ET.SubElement(case, "system-out").text = "\n".join(out)


def _dot(line: Line, report: Report) -> Dot:
    """The route's dot: green when every trial passed, amber when some failed but every
    case reached its min_pass, red when a case fell short."""
    short = any(case.route == line.route for case in report.short)
    state: State = "short" if short else ("passed" if line.passed == line.trials else "some failed")
    return Dot(line.route, line.pass_rate, line.cost_usd, line.model_calls, state)


def _html_failed(report: Report) -> str:
    """The failed trials, each with why, its runs and the end of its trace."""
    if not report.failed:
        return ""
    items = []
    for result in report.failed:
        trial = result.trial
        head = f"{trial.case.name} #{trial.repeat} on {_route_name(result)}: {result.verdict.kind}"
        why = "".join(f"<li>{html.escape(line)}</li>" for line in result.verdict.why)
        runs = html.escape(report.runs_of(result))
        trace = ""
        if result.trace:
            lines = html.escape("\n".join(result.trace))
            trace = f"<details><summary>the end of its trace</summary><pre>{lines}</pre></details>"
        items.append(
            f"<li><b>{html.escape(head)}</b><ul>{why}</ul><small>{runs}</small>{trace}</li>"
        )
    return "<h2>Failed trials</h2><ul>" + "".join(items) + "</ul>"


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
{failed}
</body></html>
"""
