"""A Redis outage longer than the recovery time: the outcomes of the calls that finished
meanwhile are held for as long as it lasts, saved first once Redis is back, and nothing
is reported "unknown" or run again.

Real Redis (a private one with AOF, stopped and started again on the same port), real
`relay worker` processes, a real HTTP model server; tools count their runs in the
ledger file, the model server counts its calls.
"""

from __future__ import annotations

import time
from functools import partial
from pathlib import Path

import pytest

from agent_core import Stop
from tests.support.brain import call, final
from tests.support.fleet import Fleet, fleet
from tests.support.model_server import Reply
from tests.support.redis_server import RedisServer
from tests.support.waiting import calls_for
from tests.support.web import RelayWeb
from tests.test_web_metrics import _scrape, _sum
from workers import StoreUnavailable
from workers.runtime import leases
from workers.store.runs import RunStore

OUTAGE_S = 60.0
"""Four times RELAY_RECOVERY_SECONDS: every lease lapses while Redis is away."""
WRITES = ("HOLD-WRITE-A", "HOLD-WRITE-B", "HOLD-WRITE-C")
READS = ("HOLD-READ-A", "HOLD-READ-B", "HOLD-READ-C")
THINKS = ("HOLD-THINK-A", "HOLD-THINK-B")


def _script(f: Fleet) -> None:
    for marker in WRITES:  # a tool that must not run twice
        label = marker[-1].lower()
        f.brain.script(marker, {0: call("once", label=label, seconds=3), 1: final("wrote")})
    for marker in READS:  # a tool safe to run again, which would be
        f.brain.script(marker, {0: call("sleep", seconds=3), 1: final("slept")})
    for marker in THINKS:  # a model call, which would be paid for twice
        f.brain.script(
            marker, {0: call("read_note", name="a"), 1: Reply(text=final("thought"), delay=3)}
        )


def _all_under_way(f: Fleet) -> bool:
    lines = f.ledger()
    writes = all(f"once start {m[-1].lower()}" in lines for m in WRITES)
    reads = lines.count("sleep start 3") == len(READS)
    thinks = all(len(calls_for(f, m)) == 2 for m in THINKS)
    return writes and reads and thinks


@pytest.mark.timeout(300)
def test_a_60_s_outage_loses_no_finished_outcome_and_runs_nothing_again(tmp_path: Path) -> None:
    # The broker is a Redis of its own, which stays up: the workers take what the tick
    # sends at once (on the same Redis, Celery would reconnect seconds after the holders
    # saved, and the race this test is about would never be run).
    with (
        RedisServer(tmp_path) as broker,
        fleet(
            tmp_path, appendonly=True, recovery=15, extra_env={"RELAY_BROKER_URL": broker.url}
        ) as f,
    ):  # (recovery: Relay's default)
        _script(f)
        f.worker("--concurrency", "8", "--pool", "threads")
        # A worker that asks for the tick every half second: once Redis is back it is the
        # first to tick, so it would send every lapsed call again at once (its pool takes
        # them) unless the tick waits for the holders to save first.
        f.worker(
            "--concurrency", "8", "--pool", "threads",
            name="eager", env={"RELAY_TICK_SECONDS": "0.5"},
        )  # fmt: skip
        runs = {m: f.relay.start(f"{m}: finish while Redis is away") for m in WRITES + READS}
        runs |= {m: f.relay.start(f"{m}: think while Redis is away") for m in THINKS}
        f.until(lambda: _all_under_way(f), 60, what="every call under way")

        f.redis.kill()
        time.sleep(OUTAGE_S)
        lines = f.ledger()
        assert all(f"once end {m[-1].lower()}" in lines for m in WRITES), lines
        assert lines.count("sleep end 3") == len(READS), lines
        f.redis.start()  # same port, same AOF

        outcomes = {m: f.relay.wait(r, timeout=120) for m, r in runs.items()}
        assert {m: o.stop for m, o in outcomes.items()} == dict.fromkeys(runs, Stop.DONE), f.logs()
        # 0 unknown: each tool's outcome is the one it had, not "outcome unknown".
        for marker in WRITES + READS:
            results = [e.status for e in f.relay.trace(runs[marker]) if e.kind == "result"]
            assert results == ["ok"], (marker, f.relay.trace(runs[marker]))
        # 0 re-run: each tool ran once, each model call was made once.
        lines = f.ledger()
        for marker in WRITES:
            assert lines.count(f"once start {marker[-1].lower()}") == 1, lines
        assert lines.count("sleep start 3") == len(READS), lines
        for marker in THINKS + WRITES:
            assert len(calls_for(f, marker)) == 2, marker
        logs = f.full_logs()
        held = len(WRITES + READS + THINKS)
        assert logs.count("Redis is unreachable: holding the outcome of") == held, f.logs()
        assert logs.count("saved the held outcome of") == held, f.logs()
        assert "gave up saving" not in logs

        with RelayWeb(f.env, tmp_path / "web.log") as web:
            samples = _scrape(web)
        assert _sum(samples, "relay_held_outcomes_total", outcome="saved") == held
        assert _sum(samples, "relay_held_outcomes_total", outcome="lost") == 0


def _unreachable() -> None:
    raise StoreUnavailable("Redis at 127.0.0.1:1 is unreachable")


def test_an_outcome_within_the_cap_is_held_past_the_recovery_time() -> None:
    leases.held_tally()  # (what earlier tests left)
    tries = []

    def save() -> str:
        tries.append(time.monotonic())
        if len(tries) < 4:
            _unreachable()
        return "saved"

    def slept(_backoff: float) -> None:
        time.sleep(0.1)  # each retry waits past for_s

    started = time.monotonic()
    assert leases.save_holding(save, "call-1", for_s=0.05, cap=1, sleep=slept) == "saved"
    assert tries[-1] - started > 0.05  # held past for_s, and saved
    assert leases.held_tally() == {"saved": 1}
    assert leases.held() == []


def test_an_outcome_beyond_the_cap_is_given_up_after_the_recovery_time() -> None:
    leases.held_tally()
    with leases._held_lock:  # another call's outcome is held: the cap is reached
        leases._held[0] = "tool call call-9 of run r0"
    try:
        started = time.monotonic()
        with pytest.raises(StoreUnavailable):
            leases.save_holding(_unreachable, "call-1", for_s=0.3, cap=1, sleep=time.sleep)
        assert time.monotonic() - started >= 0.3
        assert leases.held_tally() == {"lost": 1}
        assert leases.held() == ["tool call call-9 of run r0"]  # only its own is let go
    finally:
        with leases._held_lock:
            leases._held.pop(0)


def test_the_first_tick_after_a_gap_waits_for_the_holders(tmp_path: Path) -> None:
    with RedisServer(tmp_path) as server:
        upkeep, lock = RunStore(server.url, "t:").upkeep, "t:tick-lock"
        tick = partial(upkeep.elect_ticker, interval_ms=1_000, settle_ms=3_000)
        assert tick("a", now_ms=1) == 0
        server.client().delete(lock)  # (the interval passed)
        assert tick("b", now_ms=2) == 0  # no gap
        server.client().delete(lock)
        # Two intervals and more without a tick, by Redis's clock (the askers' may differ:
        # their `now` says nothing of it): nobody ticks for the settle time.
        time.sleep(2.5)
        assert tick("a", now_ms=3) == 3_000
        assert 0 < tick("b", now_ms=4) <= 3_000
        assert upkeep.tick_stats() == (2, 2, "b")
        # The settle time passes (by Redis's clock: longer than two intervals, and its
        # own wait is no gap): then the tick comes, and sends the rest.
        time.sleep(3.1)
        assert tick("b", now_ms=5) == 0
        assert upkeep.tick_stats() == (3, 5, "b")
