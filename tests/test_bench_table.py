"""The table `python -m bench.run` prints judges each of issue 31's rows against issue
31's own goal: a row printed against an older goal said "met" where the issue said missed
(DBOS at 0.70 against "< 1"), and rows printed without a verdict said nothing at all."""

from __future__ import annotations

from typing import Any

import pytest

from bench.report import Row, _peers, _turns


class _Figures(dict[str, Any]):
    """A benchmark's figures: any not given is 1.0 (what these tests do not look at)."""

    def __missing__(self, key: str) -> float:
        return 1.0


def _verdict(rows: list[Row], what: str) -> tuple[str, str]:
    found = [row for row in rows if row.what.strip() == what]
    assert len(found) == 1, [row.what for row in rows]
    return found[0].goal, found[0].verdict


def _turn_rows(**summary: float) -> list[Row]:
    figures = _Figures(
        bytes_by_part_per_turn={"store": 1}, solo_turn_split_ms={"celery_hops": 0.0}, **summary
    )
    return _turns({"summary": figures, "timing": _Figures(agents=2)})


@pytest.mark.parametrize(("written", "verdict"), [(4_096, "met"), (4_097, "MISSED")])
def test_bytes_a_turn_are_judged_against_4096(written: int, verdict: str) -> None:
    goal, said = _verdict(_turn_rows(bytes_in_per_turn=written), "bytes written to Redis per turn")
    assert goal.startswith("<= 4,096")
    assert said == verdict


@pytest.mark.parametrize(("usec", "verdict"), [(150.0, "met"), (151.0, "MISSED")])
def test_redis_time_a_step_is_judged_against_150_us(usec: float, verdict: str) -> None:
    what = "Redis server time per step (us, commandstats, idle workers' share out)"
    goal, said = _verdict(_turn_rows(redis_usec_per_step=usec), what)
    assert goal.startswith("<= 150")
    assert said == verdict


def _peer_rows(**ratios: float) -> list[Row]:
    figures: dict[str, Any] = {
        "core_turn_ms": 0.1,
        "core_http_turn_ms": 1.0,
        "langgraph": {"skipped": "not measured here"},
        "own_turn_ms": 1.0,
        "own_turn_ms_sent": 1.0,
        **ratios,
    }
    return _peers(figures)


@pytest.mark.parametrize(
    ("key", "what", "goal", "met", "missed"),
    [
        ("relay_over_dbos", "DBOS Transact", "< 0.6", 0.59, 0.6),
        ("relay_over_langgraph", "LangGraph + SqliteSaver", "<= 1.5", 1.5, 1.51),
        ("relay_over_langgraph_postgres", "LangGraph + PostgresSaver", "<= 1.5", 1.5, 1.51),
        (
            "relay_over_langgraph_sync",
            "LangGraph + SqliteSaver, durability=sync",
            "<= 1",
            1.0,
            1.01,
        ),
        (
            "relay_over_langgraph_postgres_sync",
            "LangGraph + PostgresSaver, durability=sync",
            "<= 1",
            1.0,
            1.01,
        ),
    ],
)
def test_each_peer_is_judged_against_issue_31s_bound(
    key: str, what: str, goal: str, met: float, missed: float
) -> None:
    for ratio, verdict in ((met, "met"), (missed, "MISSED")):
        said_goal, said = _verdict(_peer_rows(**{key: ratio}), f"Relay per step / {what}")
        assert (said_goal, said) == (goal, verdict), ratio


@pytest.mark.parametrize(("ratio", "verdict"), [(1.5, "met"), (1.51, "MISSED")])
def test_relays_own_time_over_the_core_and_its_model_call_is_judged_against_1_5(
    ratio: float, verdict: str
) -> None:
    rows = _peer_rows(own_over_core_http=ratio)
    goal, said = _verdict(rows, "Relay's own ms per turn / core + HTTP model turn")
    assert goal.startswith("<= 1.5")
    assert said == verdict
