"""Model routes on real workers: fleet-wide limits, fall-through, fair turns, dead holders.

Real Redis, real `relay worker` processes (two of them, so a limit that held per
process only would show), real HTTP model servers that enforce their own rate
limits and fail when told to. The routes come from a RELAY_MODELS file, as an
operator writes it.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from agent_core import Stop
from tests.support.brain import final
from tests.support.fleet import Fleet, fleet
from tests.support.gateway import Gateway
from tests.support.model_server import ModelServer, Reply
from workers.cli import cli
from workers.model.endpoints import load_routes
from workers.model.limits import FAILURES_TO_OPEN, PROBE_INTERVAL_MS, RouteLimits
from workers.settings import now_ms

WORKER = ("--concurrency", "8", "--pool", "threads")


def _routes(f: Fleet, *routes: dict[str, Any]) -> dict[str, str]:
    """Write a RELAY_MODELS file of `routes`; return the workers' environment for it."""
    path = f.directory / "models.json"
    path.write_text(json.dumps({"routes": list(routes)}))
    return {"RELAY_MODELS": str(path)}


def _answer(f: Fleet, tags: list[str]) -> None:
    for tag in tags:
        f.brain.script(f"{tag}:", {0: final(f"{tag} done")})


def _tag(prompt: str) -> str:
    """The tag of the run a model call came from (its task begins with it)."""
    found = re.search(r"\b([A-Z]+\d*):", prompt)
    assert found is not None, prompt[:200]
    return found.group(1)


def _finish(f: Fleet, run_ids: list[str], timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    for run_id in run_ids:
        outcome = f.relay.wait(run_id, timeout=max(deadline - time.monotonic(), 1))
        assert outcome.stop is Stop.DONE, (run_id, outcome, f.logs())


def test_a_fleet_keeps_to_a_rate_limit_the_server_enforces(tmp_path: Path) -> None:
    """Two workers share one route's rpm: the server, which enforces that rate itself
    (60 calls in any 6 s, as a provider that counts a minute in tenths), refuses at most
    1% of the calls, and the fleet keeps it busy."""
    with fleet(tmp_path) as f:
        f.model.limit_rate(60, per_seconds=6.0)
        env = _routes(f, {"name": "limited", "url": f.model.url, "model": "m", "rpm": 600})
        tags = [f"RATE{n}" for n in range(200)]
        _answer(f, tags)
        # Started before the workers: the server notes each call's arrival in this process,
        # and a loop starting runs here meanwhile would hold it up (arrivals seen bunched).
        run_ids = [f.relay.start(f"{tag}: answer") for tag in tags]
        f.worker(*WORKER, env=env)
        f.worker(*WORKER, env=env)
        _finish(f, run_ids)
        served = [c.at for c in f.model.calls]
        assert f.model.refused <= len(served) // 100, (f.model.refused, len(served))
        rate = (len(served) - 1) / (served[-1] - served[0])
        # 10 calls a second is the limit; a 2-core test machine keeps at least a fifth
        # of it (bench/routes.py measures how close the fleet really gets).
        assert 2.0 <= rate <= 10.5, rate
        status = f.relay.status(run_ids[0])
        assert set(status.usage_by_route) == {"limited"}


def test_a_failing_primary_sends_every_call_to_the_backup_and_is_probed_sparingly(
    tmp_path: Path,
) -> None:
    with fleet(tmp_path) as f, ModelServer(f.brain) as backup:
        f.model.fail_with(500)
        env = _routes(
            f,
            {"name": "primary", "url": f.model.url, "model": "m"},
            {"name": "backup", "url": backup.url, "model": "m"},
        )
        f.worker(*WORKER, env=env)
        f.worker(*WORKER, env=env)
        tags = [f"FAIL{n}" for n in range(60)]
        _answer(f, tags)
        started = time.monotonic()
        run_ids = [f.relay.start(f"{tag}: answer") for tag in tags]
        _finish(f, run_ids)
        took = time.monotonic() - started
        assert len(backup.calls) == len(tags)
        for run_id in run_ids:
            assert set(f.relay.status(run_id).usage_by_route) == {"backup"}
        routed = [e.data.get("route") for e in f.relay.trace(run_ids[0]) if e.kind == "stop"]
        assert routed == ["backup"]  # the trace names the route that served the reply
        # Until the circuit opened, each worker thread's call may have failed there
        # (with its retries: RELAY_MODEL_RETRIES=2); after, one probe per interval.
        retries = int(f.env["RELAY_MODEL_RETRIES"]) + 1
        probes = 1 + int(took * 1000 // PROBE_INTERVAL_MS)
        most = (FAILURES_TO_OPEN + 16 + probes) * retries
        assert 0 < f.model.failed <= most, (f.model.failed, most)

        # The primary comes back: a probe finds it, and the calls go to it again.
        f.model.fail_with(None)
        later = [f"BACK{n}" for n in range(40)]
        _answer(f, later)
        back_ids = []
        deadline = time.monotonic() + 3 * PROBE_INTERVAL_MS / 1000
        for tag in later:
            back_ids.append(f.relay.start(f"{tag}: answer"))
            _finish(f, back_ids[-1:])
            if set(f.relay.status(back_ids[-1]).usage_by_route) == {"primary"}:
                break
            assert time.monotonic() < deadline, "the primary was never probed back"
            time.sleep(0.5)


def test_a_key_with_few_runs_is_not_stuck_behind_a_key_with_many(tmp_path: Path) -> None:
    with fleet(tmp_path) as f:
        env = _routes(f, {"name": "shared", "url": f.model.url, "model": "m", "rpm": 600})
        f.worker(*WORKER, env=env)
        f.worker(*WORKER, env=env)
        big = [f"BIG{n}" for n in range(200)]
        small = [f"SMALL{n}" for n in range(5)]
        _answer(f, big + small)
        big_ids = [f.relay.start(f"{tag}: answer", key="big") for tag in big]
        f.until(lambda: len(f.model.calls) >= 10, what="the big key's calls to queue up")
        small_ids = [f.relay.start(f"{tag}: answer", key="small") for tag in small]
        _finish(f, small_ids, timeout=60)
        order = [_tag(c.prompt) for c in f.model.calls]
        last_small = max(order.index(tag) for tag in small)
        first_small = min(order.index(tag) for tag in small)
        # In turn: about one big call between two small ones, not the big backlog.
        assert last_small - first_small <= 2 * len(small) + 16, order
        assert sum(1 for tag in order if tag.startswith("BIG")) < 120, "the backlog went first"
        _finish(f, big_ids)
        assert f.relay.status(small_ids[0]).key == "small"


def test_a_dead_worker_holding_the_only_slot_gives_it_back_with_its_lease(
    tmp_path: Path,
) -> None:
    with fleet(tmp_path) as f:
        env = _routes(f, {"name": "one", "url": f.model.url, "model": "m", "max_concurrency": 1})
        f.brain.script("HELD:", {0: [Reply(text=final("slow"), delay=60), final("held done")]})
        _answer(f, ["NEXT"])
        first = f.worker(*WORKER, env=env)
        held = f.relay.start("HELD: answer")
        f.until(lambda: any("HELD" in c.prompt for c in f.model.calls), what="the held call")
        waiting = f.relay.start("NEXT: answer")
        time.sleep(1)
        assert not any("NEXT" in c.prompt for c in f.model.calls)  # the slot is taken
        first.kill()
        f.worker(*WORKER, env=env)
        _finish(f, [held, waiting], timeout=60)
        assert f.relay.status(waiting).state == "finished"
        assert [_tag(c.prompt) for c in f.model.calls].count("HELD") == 2


def test_a_token_limit_paces_a_route_by_what_its_calls_use(tmp_path: Path) -> None:
    """tpm 60,000 (a thousand tokens a second) on two workers. Each call may use over 16,384
    tokens (what admission first charges it), but uses about 460: paced by what calls may
    use, 20 runs would take over five minutes; paced by what they use (the unused part
    given back when a call ends, later calls charged what calls use), about 11 s. Either
    way the tokens the server bills never come faster than the limit."""
    with fleet(tmp_path) as f:
        env = _routes(f, {"name": "tokens", "url": f.model.url, "model": "m", "tpm": 60_000})
        env["RELAY_MODEL_MAX_TOKENS"] = "16384"
        f.worker(*WORKER, env=env)
        f.worker(*WORKER, env=env)
        tags = [f"TPM{n}" for n in range(20)]
        _answer(f, tags)
        started = time.monotonic()
        run_ids = [f.relay.start(f"{tag}: answer") for tag in tags]
        _finish(f, run_ids, timeout=240)
        elapsed = time.monotonic() - started
        billed = [p + c for p, c in f.model.billed("TPM")]
        served = [c.at for c in f.model.calls if "TPM" in c.prompt.split("\n\n", 1)[0]]
        assert len(billed) == len(served) >= 20
        reserved_pace = len(served) * 16_384 / 1_000  # seconds, at what calls may use
        assert elapsed < reserved_pace / 4, (elapsed, reserved_pace)
        # The limit held: every call before the last was paid for by the time the last went.
        rate = sum(billed[:-1]) / (served[-1] - served[0])
        assert rate <= 1_000 * 1.25, (rate, billed)


@pytest.mark.timeout(300)
def test_a_gateways_own_429s_are_waited_out_not_retried_into(tmp_path: Path) -> None:
    """LiteLLM's proxy allows 3 calls a minute (it lets 2 through, then counts the 3rd);
    Relay's route knows no limit. Past them, the gateway answers 429 with
    `llm_provider-retry-after: 60`: the route pauses for the fleet for that minute, and
    every run ends done. Before, each call retried within the minute until it failed:
    here, no call meets the gateway's 429 more than once in its minute."""
    with fleet(tmp_path) as f, Gateway(tmp_path, f.model.url, rpm=3) as gw:
        route = {"name": "gateway", "url": gw.url, "model": "m", "key_env": "GATEWAY_KEY"}
        env = {**_routes(f, route), "GATEWAY_KEY": gw.key}
        f.worker(*WORKER, env=env)
        tags = [f"GW{n}" for n in range(4)]
        _answer(f, tags)
        run_ids = [f.relay.start(f"{tag}: answer") for tag in tags]
        _finish(f, run_ids, timeout=240)
        served, refused = gw.answered(200), gw.answered(429)
        assert served == len(tags), gw.output()[-3000:]
        assert 1 <= refused <= len(tags), (refused, gw.output()[-3000:])
        for run_id in run_ids:
            assert set(f.relay.status(run_id).usage_by_route) == {"gateway"}
        assert "model_failed" not in f.logs()


def test_once_its_runs_are_done_relay_routes_shows_the_route_idle_and_closed(
    tmp_path: Path,
) -> None:
    """What an operator sees of a capped route once the fleet's runs on it are done:
    nothing in flight, nothing waiting, the circuit closed and the failures it had before
    set back by the successes after. On a single Redis each success is told by the save
    of its reply, not in a script of its own; a slot the save did not give back would
    show in flight here until its lease lapsed, and hold the next call that long."""
    with fleet(tmp_path) as f:
        env = _routes(f, {"name": "one", "url": f.model.url, "model": "m", "max_concurrency": 1})
        (route,) = load_routes(env["RELAY_MODELS"])
        limits = RouteLimits(f.relay.store.connection)
        for n in range(2):  # two failures in a row, as a worker would have told them
            limits.admit(route, key="k", holder=f"f{n}", tokens=1, key_concurrency=None,
                         lease_ms=60_000, now_ms=now_ms())  # fmt: skip
            limits.done(route, key="k", holder=f"f{n}", outcome="failed", now_ms=now_ms())
        assert limits.state(route, now_ms()).failures == 2
        f.worker(*WORKER, env=env)
        tags = [f"IDLE{n}" for n in range(8)]
        _answer(f, tags)
        started = time.monotonic()
        _finish(f, [f.relay.start(f"{tag}: answer") for tag in tags], timeout=120)
        took = time.monotonic() - started
        shown = CliRunner(env={**f.env, **env, "RELAY_APP": ""}).invoke(cli, ["routes", "--json"])
        assert shown.exit_code == 0, shown.output
        (state,) = json.loads(shown.stdout)
        assert (state["in_flight"], state["waiting"]) == (0, 0), state
        assert (state["circuit"], state["failures"]) == ("closed", 0), state
        # One call at a time, each slot back at once, not when its lease lapses (2 s here:
        # a coarse bound; the in-flight count above is what tells).
        assert took < 60, took
