"""Issue 53's goals, each beside what this run measured and a verdict.

One row per line of the issue's table ("What it must reach"), read from the
figures the other benchmarks put in `results["benchmarks"]` in the same run
(`bench.run` prints it after its own table; `bench.inflight` after its rows). Nothing
here is a figure of its own: a row whose benchmark did not run, failed, or has no such
figure says "not measured" (and why), and a row of two parts is "not met" when a
measured part misses its goal, else "not measured" while a part is missing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["GOALS", "GoalRow", "goal_rows", "goals_table"]

Figures = Mapping[str, Any]
"""`results["benchmarks"]`: each benchmark's figures by its name."""


class _NotMeasured(Exception):
    """A figure this run does not have; its message says why."""


def _figure(benchmarks: Figures, name: str, *path: str) -> Any:
    """The figure at `path` in benchmark `name`'s results, or _NotMeasured."""
    found: Any = benchmarks.get(name)
    if found is None:
        raise _NotMeasured(f"{name} did not run")
    if "error" in found:
        raise _NotMeasured(f"{name} failed")
    for key in path:
        if not isinstance(found, Mapping) or found.get(key) is None:
            raise _NotMeasured(f"{name} has no {'.'.join(path)}")
        found = found[key]
    return found


Part = Callable[[Figures], tuple[str, bool]]
"""Reads one measured part of a row: its text and whether it meets its goal."""


@dataclass(frozen=True)
class Goal:
    measure: str
    goal: str
    parts: tuple[Part, ...]


@dataclass(frozen=True)
class GoalRow:
    measure: str
    goal: str
    measured: str
    verdict: str
    """"met", "not met" or "not measured"."""


def _in_flight(b: Figures) -> tuple[str, bool]:
    loop = _figure(b, "inflight", "loop")
    most, cores = loop["most_in_flight"], loop["worker_cores_busy"]
    pieces, turns = _figure(b, "inflight", "loop_pieces_per_s"), loop["turns"]
    text = f"{most:,} on {cores:.2f} cores ({turns}-turn runs, {pieces:g} pieces/s)"
    return text, most >= 1_000 and cores <= 1.0


def _cpu_per_call(variant: str, most_ms: float) -> Part:
    def read(b: Figures) -> tuple[str, bool]:
        ms = _figure(b, "inflight", variant, "worker_cpu_ms_per_model_call")
        return f"{ms:.2f} ms", ms <= most_ms

    return read


def _loop_lag(b: Figures) -> tuple[str, bool]:
    loop = _figure(b, "inflight", "loop")
    lag = loop.get("loop_lag_p99_ms")
    if lag is None:
        raise _NotMeasured("not exported by the worker")
    return f"{lag:.1f} ms", lag < 20


def _ratio(name: str, key: str, most: float, *, below: bool = False) -> Part:
    def read(b: Figures) -> tuple[str, bool]:
        value = _figure(b, name, key)
        return f"{value:.2f}", value < most if below else value <= most

    return read


def _many(pool: str) -> Part:
    def read(b: Figures) -> tuple[str, bool]:
        pools = _figure(b, "many", "pools")
        named = [p for name, p in pools.items() if name.startswith(pool)]
        if not named:
            raise _NotMeasured(f"many ran no {pool} pool")
        ratio = named[0]["ratio"]
        return f"{ratio:.2f}", ratio >= 0.7

    return read


def _parked(b: Figures) -> tuple[str, bool]:
    found = _figure(b, "waiting", "bytes_per_run")
    return f"{found:,.0f}", found <= 4_096


def _memory(b: Figures) -> tuple[str, bool]:
    kb = _figure(b, "inflight", "loop", "kb_per_call_in_flight")
    return f"{kb:.1f} KB", kb <= 50


GOALS = (
    Goal(
        "model calls in flight per worker process (2 s a reply, >= 30 pieces/s, 5-turn runs)",
        ">= 1,000 on <= 1 core",
        (_in_flight,),
    ),
    Goal(
        "worker CPU per completed model call, 5-turn / 1-turn runs (run start included)",
        "<= 2.0 / <= 3.0 ms",
        (_cpu_per_call("loop", 2.0), _cpu_per_call("loop_1turn", 3.0)),
    ),
    Goal("event-loop lag at that load, p99 (the loop's gauge)", "< 20 ms", (_loop_lag,)),
    Goal(
        "Relay's own ms per turn / the core + HTTP model turn, same run",
        "<= 1.5",
        (_ratio("peers", "own_over_core_http", 1.5),),
    ),
    Goal(
        "per step / LangGraph + Sqlite / + Postgres at durability=sync",
        "<= 1.0 / <= 1.0",
        (
            _ratio("peers", "relay_over_langgraph_sync", 1.0),
            _ratio("peers", "relay_over_langgraph_postgres_sync", 1.0),
        ),
    ),
    Goal(
        "per step / LangGraph default durability (Sqlite) / DBOS Transact",
        "<= 1.5 / < 0.6",
        (
            _ratio("peers", "relay_over_langgraph", 1.5),
            _ratio("peers", "relay_over_dbos", 0.6, below=True),
        ),
    ),
    Goal(
        "many runs (1,000 x 5) steps/s / bare Celery tasks/s, prefork / threads",
        ">= 0.7 / >= 0.7",
        (_many("prefork"), _many("threads")),
    ),
    Goal("a run parked at its first approval, bytes, journal included", "<= 4,096", (_parked,)),
    Goal("memory per call in flight (RSS growth / calls)", "<= 50 KB", (_memory,)),
)


def _row(goal: Goal, benchmarks: Figures) -> GoalRow:
    texts: list[str] = []
    verdicts: list[bool | None] = []
    for part in goal.parts:
        try:
            text, ok = part(benchmarks)
        except _NotMeasured as why:
            texts.append(f"not measured ({why})")
            verdicts.append(None)
            continue
        texts.append(text)
        verdicts.append(ok)
    if False in verdicts:
        verdict = "not met"
    elif None in verdicts:
        verdict = "not measured"
    else:
        verdict = "met"
    return GoalRow(goal.measure, goal.goal, " / ".join(texts), verdict)


def goal_rows(benchmarks: Figures) -> list[GoalRow]:
    """Every goal of issue 53, in the issue's order, read from this run's figures."""
    return [_row(goal, benchmarks) for goal in GOALS]


def goals_table(benchmarks: Figures) -> str:
    rows = goal_rows(benchmarks)
    cells = [("issue 53: measure", "goal", "measured", "verdict")]
    cells += [(r.measure, r.goal, r.measured, r.verdict) for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(4)]
    lines = ["  ".join(c[i].ljust(widths[i]) for i in range(4)).rstrip() for c in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
