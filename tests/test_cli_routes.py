"""`relay routes`: what an operator sees of the model routes the fleet shares.

A private Redis holds the routes' state, put there the way workers put it (a 429,
five failures in a row, calls in flight and waiting); the routes come from a
RELAY_MODELS file.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.support.redis_server import RedisServer
from workers.cli import cli
from workers.model.endpoints import load_routes
from workers.model.limits import FAILURES_TO_OPEN, RouteLimits
from workers.settings import now_ms
from workers.store.runs import RunStore

ROUTES = [
    {"name": "primary", "url": "http://127.0.0.1:9/v1", "model": "big", "rpm": 600,
     "tpm": 400_000},
    {"name": "backup", "url": "http://127.0.0.1:9/v1", "model": "small", "max_concurrency": 4},
    {"name": "spare", "url": "http://127.0.0.1:9/v1", "model": "tiny"},
]  # fmt: skip


@pytest.fixture
def env(tmp_path: Path) -> Iterator[dict[str, str]]:
    path = tmp_path / "models.json"
    path.write_text(json.dumps(ROUTES))
    with RedisServer(tmp_path) as server:
        yield {"RELAY_REDIS_URL": server.url, "RELAY_MODELS": str(path), "RELAY_APP": ""}


def _routes(env: dict[str, str], *args: str) -> str:
    result = CliRunner(env={**env, "COLUMNS": "200"}).invoke(
        cli, ["routes", *args], catch_exceptions=False
    )
    assert result.exit_code == 0, result.output
    return result.stdout


def _lines(out: str) -> dict[str, str]:
    return {line.split()[0]: line for line in out.splitlines() if line.strip()}


def test_routes_shows_each_route_with_its_limits_and_a_quiet_fleet(env: dict[str, str]) -> None:
    lines = _lines(_routes(env))
    assert "600 rpm, 400k tpm" in lines["primary"]
    assert "4 at once" in lines["backup"]
    assert "none" in lines["spare"]
    for name in ("primary", "backup", "spare"):
        assert "closed" in lines[name]


def test_routes_shows_open_circuits_pauses_calls_and_the_last_error(
    env: dict[str, str],
) -> None:
    primary, backup, spare = load_routes(env["RELAY_MODELS"])
    limits = RouteLimits(RunStore(env["RELAY_REDIS_URL"], "relay:").connection)
    now = now_ms()
    for n in range(FAILURES_TO_OPEN):
        limits.admit(backup, key="k", holder=f"f{n}", tokens=1, key_concurrency=None,
                     lease_ms=60_000, now_ms=now)  # fmt: skip
        limits.done(backup, key="k", holder=f"f{n}", outcome="failed", now_ms=now,
                    error="HTTP 503: overloaded")  # fmt: skip
    limits.admit(primary, key="k", holder="busy", tokens=1, key_concurrency=None,
                 lease_ms=60_000, now_ms=now)  # fmt: skip
    limits.admit(primary, key="k", holder="queued", tokens=1, key_concurrency=None,
                 lease_ms=60_000, now_ms=now)  # fmt: skip
    limits.admit(primary, key="k", holder="x", tokens=1, key_concurrency=None,
                 lease_ms=60_000, now_ms=now)  # fmt: skip
    limits.done(primary, key="k", holder="busy", outcome="limited", now_ms=now,
                paused_until_ms=now + 90_000, error="HTTP 429: slow down")  # fmt: skip
    limits.admit(spare, key="k", holder="long", tokens=1, key_concurrency=None,
                 lease_ms=60_000, now_ms=now)  # fmt: skip

    lines = _lines(_routes(env))
    assert f"open ({FAILURES_TO_OPEN} failures), probe in" in lines["backup"]
    assert "HTTP 503: overloaded" in lines["backup"]
    assert "paused (429) for 1m" in lines["primary"]
    assert "HTTP 429: slow down" in lines["primary"]
    assert "closed" in lines["spare"]

    shown = {state["name"]: state for state in json.loads(_routes(env, "--json"))}
    assert shown["backup"]["circuit"] == "open"
    assert shown["backup"]["failures"] == FAILURES_TO_OPEN
    assert shown["backup"]["next_probe_ms"] > now
    assert shown["primary"]["paused_until_ms"] == now + 90_000
    assert shown["primary"]["waiting"] == 2
    assert shown["spare"]["error"] == ""
    assert shown["spare"]["in_flight"] == 1


def test_routes_without_any_route_says_how_to_set_one(tmp_path: Path) -> None:
    with RedisServer(tmp_path) as server:
        env = {"RELAY_REDIS_URL": server.url, "RELAY_MODEL_URL": "", "RELAY_MODELS": "",
               "RELAY_APP": ""}  # fmt: skip
        assert "No model routes: set RELAY_MODEL_URL" in _routes(env)
