"""Fleet-wide route limits against a real private Redis, with the clock passed in."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.redis_server import RedisServer
from workers.model.endpoints import ModelRoute
from workers.model.limits import (
    ABSENT_MS,
    FAILURES_TO_OPEN,
    PROBE_INTERVAL_MS,
    SPACING_MARGIN,
    STALE_MS,
    RouteLimits,
)
from workers.store.runs import RunStore

ROUTE = ModelRoute("r", url="http://127.0.0.1:9/v1", model="m", rpm=60)
STEP = int(1000 * SPACING_MARGIN)  # 60 rpm: one call a second, and the margin


@pytest.fixture
def limits(tmp_path: Path) -> Iterator[RouteLimits]:
    with RedisServer(tmp_path) as server:
        yield RouteLimits(RunStore(server.url, "t:").connection)


def _admit(
    limits: RouteLimits,
    holder: str,
    now: int,
    *,
    key: str = "k",
    route: ModelRoute = ROUTE,
    key_concurrency: int | None = None,
) -> tuple[str, int]:
    answer = limits.admit(
        route, key=key, holder=holder, tokens=100, key_concurrency=key_concurrency,
        lease_ms=5_000, now_ms=now,
    )  # fmt: skip
    return answer.verdict, answer.at_ms


def _admission_order(limits: RouteLimits, asks: dict[str, tuple[str, int]]) -> list[str]:
    """Let every call (holder -> its key, when it first asks) come back when told,
    as a worker would, and return the order the route admitted them in."""
    next_ask = {holder: at for holder, (_, at) in asks.items()}
    order: list[str] = []
    while next_ask:
        holder = min(next_ask, key=lambda h: (next_ask[h], h))
        verdict, at = _admit(limits, holder, next_ask[holder], key=asks[holder][0])
        if verdict == "admitted":
            order.append(holder)
            del next_ask[holder]
        else:
            next_ask[holder] = max(at, next_ask[holder] + 1)
    return order


def test_requests_per_minute_are_spaced_evenly(limits: RouteLimits) -> None:
    assert _admit(limits, "a", 10_000) == ("admitted", 0)
    verdict, at = _admit(limits, "b", 10_000)
    assert verdict == "wait"
    assert at == 10_000 + STEP  # its turn: one step later
    assert _admit(limits, "b", at - 1)[0] == "wait"
    assert _admit(limits, "b", at) == ("admitted", 0)


def test_waiting_keys_take_turns_however_many_calls_one_has(limits: RouteLimits) -> None:
    asks = {f"b{n}": ("big", n) for n in range(1, 9)}  # eight calls of one key, first
    asks |= {"s1": ("small", 20), "s2": ("small", 21)}  # then two of another
    order = _admission_order(limits, asks)
    # The small key's calls are not put behind the big key's backlog: each goes right
    # after the big key's call of the same turn.
    assert order[:6] == ["b1", "b2", "s1", "b3", "s2", "b4"]
    assert sorted(order) == sorted(asks)


def test_a_call_late_for_its_turn_does_not_hold_the_queue(limits: RouteLimits) -> None:
    _admit(limits, "a", 0)
    assert _admit(limits, "late", 0) == ("wait", STEP)
    assert _admit(limits, "next", 0) == ("wait", 2 * STEP)
    # "late" never comes back at its turn; once it is ABSENT_MS late, "next" goes.
    assert _admit(limits, "next", STEP + ABSENT_MS - 1)[0] == "wait"
    assert _admit(limits, "next", STEP + ABSENT_MS + 1)[0] == "admitted"
    # When it does come, it keeps its place at the front.
    assert _admit(limits, "third", 2 * STEP + ABSENT_MS)[0] == "wait"
    assert _admit(limits, "late", 3 * STEP + ABSENT_MS) == ("admitted", 0)


def test_a_waiting_call_that_never_comes_back_leaves_the_queue(limits: RouteLimits) -> None:
    """A waiting call whose run moved on (or died) is forgotten STALE_MS after its turn:
    `relay routes` no longer counts it waiting, and its key's next call is not queued
    behind it."""
    _admit(limits, "a", 0)
    assert _admit(limits, "gone", 0, key="moved-on") == ("wait", STEP)
    assert limits.state(ROUTE, STEP).waiting == 1
    later = STEP + STALE_MS + 1
    assert _admit(limits, "b", later) == ("admitted", 0)
    assert limits.state(ROUTE, later).waiting == 0
    assert _admit(limits, "again", later + STEP, key="moved-on") == ("admitted", 0)


def test_a_429_pauses_the_route_for_everyone(limits: RouteLimits) -> None:
    assert _admit(limits, "a", 0)[0] == "admitted"
    limits.done(ROUTE, key="k", holder="a", outcome="limited", now_ms=10, paused_until_ms=8_000)
    assert _admit(limits, "b", 5_000, key="other") == ("paused", 8_000)
    assert _admit(limits, "b", 8_000, key="other")[0] == "admitted"


def test_a_circuit_opens_after_failures_and_lets_one_probe_through_per_interval(
    limits: RouteLimits,
) -> None:
    route = ModelRoute("c", url="http://127.0.0.1:9/v1", model="m")
    for n in range(FAILURES_TO_OPEN):
        assert _admit(limits, f"f{n}", n, route=route)[0] == "admitted"
        state = limits.done(route, key="k", holder=f"f{n}", outcome="failed", now_ms=n)
    assert state == "open"
    opened = FAILURES_TO_OPEN - 1
    assert _admit(limits, "x", opened + 1, route=route) == ("open", opened + PROBE_INTERVAL_MS)
    probe_at = opened + PROBE_INTERVAL_MS
    assert _admit(limits, "probe", probe_at, route=route) == ("admitted", 1)
    assert _admit(limits, "y", probe_at + 1, route=route)[0] == "open"  # one probe only
    assert limits.done(route, key="k", holder="probe", outcome="ok", now_ms=probe_at) == "closed"
    assert _admit(limits, "z", probe_at + 2, route=route) == ("admitted", 0)


def test_a_wrong_request_neither_opens_the_circuit_nor_pauses(limits: RouteLimits) -> None:
    route = ModelRoute("w", url="http://127.0.0.1:9/v1", model="m")
    for n in range(FAILURES_TO_OPEN + 2):
        _admit(limits, f"f{n}", n, route=route)
        assert limits.done(route, key="k", holder=f"f{n}", outcome="refused", now_ms=n) == "closed"


def test_calls_in_flight_are_capped_per_route_and_per_key_and_come_back_with_the_lease(
    limits: RouteLimits,
) -> None:
    route = ModelRoute("cap", url="http://127.0.0.1:9/v1", model="m", max_concurrency=2)
    assert _admit(limits, "a", 0, route=route)[0] == "admitted"
    assert _admit(limits, "b", 0, route=route, key="other")[0] == "admitted"
    assert _admit(limits, "c", 0, route=route, key="third")[0] == "wait"  # the route is full
    limits.done(route, key="k", holder="a", outcome="ok", now_ms=1)
    assert _admit(limits, "c", 2, route=route, key="third")[0] == "admitted"
    # Per key: one at a time for key "one"; another key is not held back.
    free = ModelRoute("free", url="http://127.0.0.1:9/v1", model="m")
    assert _admit(limits, "k1", 0, route=free, key="one", key_concurrency=1)[0] == "admitted"
    assert _admit(limits, "k2", 0, route=free, key="one", key_concurrency=1)[0] == "wait"
    assert _admit(limits, "k3", 0, route=free, key="two", key_concurrency=1)[0] == "admitted"
    # A worker that died holding k1's slot: the slot comes back when its lease lapses.
    assert _admit(limits, "k2", 5_001, route=free, key="one", key_concurrency=1)[0] == "admitted"


TPM = ModelRoute("t", url="http://127.0.0.1:9/v1", model="m", tpm=60_000)
PER_TOKEN = SPACING_MARGIN  # 60,000 tokens a minute: one a millisecond, and the margin


def _admit_tokens(limits: RouteLimits, holder: str, now: int, tokens: int) -> tuple[str, int, int]:
    answer = limits.admit(
        TPM, key="k", holder=holder, tokens=tokens, key_concurrency=None, lease_ms=60_000,
        now_ms=now,
    )  # fmt: skip
    return answer.verdict, answer.at_ms, answer.charged


def test_tokens_per_minute_space_calls_by_what_they_use_not_what_they_may(
    limits: RouteLimits,
) -> None:
    # The first call is charged all it may use (nothing is known yet): the next waits for it.
    assert _admit_tokens(limits, "a", 0, 5_000) == ("admitted", 0, 5_000)
    assert _admit_tokens(limits, "b", 0, 5_000)[0] == "wait"
    # It used 500: the other 4,500 come back, and "b" may go after 500 tokens' share.
    limits.done(TPM, key="k", holder="a", outcome="ok", now_ms=100, charged=5_000, used=500)
    share = int(500 * PER_TOKEN)
    assert _admit_tokens(limits, "b", share - 1, 5_000)[0] == "wait"
    assert _admit_tokens(limits, "b", share + 1, 5_000) == ("admitted", 0, 500)
    # A waiting call is told to come back by what calls use, not by the 5,000 they may.
    verdict, at, _ = _admit_tokens(limits, "c", share + 1, 5_000)
    assert verdict == "wait"
    assert 2 * share <= at <= 2 * share + 2


def test_a_call_that_used_more_than_it_was_charged_pushes_the_route_on(
    limits: RouteLimits,
) -> None:
    _admit_tokens(limits, "a", 0, 1_000)
    limits.done(TPM, key="k", holder="a", outcome="ok", now_ms=10, charged=1_000, used=200)
    assert _admit_tokens(limits, "b", 1_000, 1_000) == ("admitted", 0, 200)
    # "b" used 3,000 where 200 were charged: the route owes 2,800 tokens' share of a minute.
    limits.done(TPM, key="k", holder="b", outcome="ok", now_ms=1_010, charged=200, used=3_000)
    owed = 1_000 + int(3_000 * PER_TOKEN)
    assert _admit_tokens(limits, "c", owed - 50, 1_000)[0] == "wait"
    assert _admit_tokens(limits, "c", owed + 1, 1_000)[0] == "admitted"


def test_a_failed_call_gives_back_all_it_was_charged(limits: RouteLimits) -> None:
    assert _admit_tokens(limits, "a", 0, 8_000)[0] == "admitted"
    assert _admit_tokens(limits, "b", 0, 8_000)[0] == "wait"
    limits.done(TPM, key="k", holder="a", outcome="limited", now_ms=5, charged=8_000)
    assert _admit_tokens(limits, "b", 6, 8_000)[0] == "admitted"


def test_until_a_call_has_ended_a_waiting_call_asks_again_soon(limits: RouteLimits) -> None:
    # Nothing is known of what calls use: a wait told by what they may use (5 s a call)
    # would leave the queue idle long after the first call ended having used little.
    assert _admit_tokens(limits, "a", 0, 5_000)[0] == "admitted"
    waits = [_admit_tokens(limits, f"w{n}", 0, 5_000) for n in range(5)]
    assert all(verdict == "wait" and at <= 2_000 for verdict, at, _ in waits), waits
    limits.done(TPM, key="k", holder="a", outcome="ok", now_ms=300, charged=5_000, used=400)
    # Once one has ended, waits are told by what calls use: the fifth waits its turn.
    verdict, at, _ = _admit_tokens(limits, "w4", 2_000, 5_000)
    assert verdict == "wait"
    assert 2_000 + 3 * int(400 * PER_TOKEN) < at <= 2_000 + 5 * int(400 * PER_TOKEN) + 5
