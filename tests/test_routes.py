"""Model routes: reading them, and the router against real servers and a real Redis.

The servers are ModelServers on loopback; the limits live in a private Redis; the
clock is the real one, except where a test passes its own.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import pytest

from agent_core.steps import ModelRequest
from tests.support.model_server import ModelServer, Reply, refusing_url, scripted
from tests.support.redis_server import RedisServer
from workers import ModelRoute, Settings
from workers.errors import ModelCallError, SettingsError
from workers.loop import run_blocking
from workers.model.endpoints import load_routes, routes_from
from workers.model.limits import RouteLimits
from workers.model.router import MOMENT_MS, ModelRouter, Requeue
from workers.model.transport import ModelClient
from workers.settings import ModelSettings, now_ms
from workers.store.runs import RunStore

REQUEST = ModelRequest(system="You are terse.", prompt="Say hi.")


# --- reading routes -------------------------------------------------------------------------


def test_routes_load_from_json_and_toml(tmp_path: Path) -> None:
    listed = [
        {"name": "primary", "url": "https://a.example/v1", "model": "big", "rpm": 600},
        {"name": "backup", "url": "http://127.0.0.1:8000/v1", "model": "small", "tpm": 9000},
    ]
    as_json = tmp_path / "models.json"
    as_json.write_text(json.dumps({"routes": listed}))
    as_toml = tmp_path / "models.toml"
    as_toml.write_text(
        '[[routes]]\nname = "primary"\nurl = "https://a.example/v1"\nmodel = "big"\nrpm = 600\n'
        '[[routes]]\nname = "backup"\nurl = "http://127.0.0.1:8000/v1"\nmodel = "small"\n'
        "tpm = 9000\n"
    )
    for path in (as_json, as_toml):
        routes = load_routes(path)
        assert [r.name for r in routes] == ["primary", "backup"]
        assert routes[0].rpm == 600
        assert routes[1].tpm == 9000
        assert routes[0].url == "https://a.example/v1/chat/completions"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("not json", "cannot read"),
        ("[]", "lists no routes"),
        ('{"routes": {"name": "x"}}', "lists no routes"),
        ('["primary"]', "route 1 is not a table"),
        ('[{"url": "http://x/v1", "model": "m"}]', "route 1: name"),
        ('[{"name": "a b", "url": "http://x/v1", "model": "m"}]', "route 1: name"),
        ('[{"name": "a", "url": "http://x/v1", "model": "m", "rpm": 0}]', "route 1: rpm"),
        ('[{"name": "a", "url": "ftp://x/v1", "model": "m"}]', "route 1: url"),
        ('[{"name": "a", "url": "http://x/v1", "model": "m", "colour": 1}]', "route 1: colour"),
        ('[{"name": "a", "url": "http://x/v1", "model": "m", "key_env": "A-B"}]', "key_env"),
    ],
)
def test_a_wrong_routes_file_is_one_clear_error(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "models.json"
    path.write_text(content)
    with pytest.raises(SettingsError, match=message) as caught:
        load_routes(path)
    assert str(path) in str(caught.value)
    assert "\n" not in str(caught.value)


def test_routes_come_from_the_app_then_relay_models_then_the_model_url(tmp_path: Path) -> None:
    path = tmp_path / "models.json"
    path.write_text(json.dumps([{"name": "filed", "url": "http://f/v1", "model": "m"}]))
    settings = Settings.from_env(
        {"RELAY_MODELS": str(path), "RELAY_MODEL_URL": "http://u/v1", "RELAY_MODEL": "u"}
    )
    given = ModelRoute("given", url="http://g/v1", model="m")
    assert [r.name for r in routes_from([given], settings)] == ["given"]
    assert [r.name for r in routes_from(None, settings)] == ["filed"]
    plain = Settings.from_env({"RELAY_MODEL_URL": "http://u/v1", "RELAY_MODEL": "u"})
    (default,) = routes_from(None, plain)
    assert (default.name, default.model) == ("default", "u")
    assert routes_from(None, Settings.from_env({})) == ()
    twice = [given, ModelRoute("given", url="http://h/v1", model="m")]
    with pytest.raises(SettingsError, match="share a name"):
        routes_from(twice, settings)


def test_a_route_reads_its_key_from_its_own_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRIMARY_KEY", "sk-primary-0123456789")
    route = ModelRoute("p", url="http://p/v1", model="m", key_env="PRIMARY_KEY", timeout=7)
    settings = Settings.from_env({"RELAY_MODEL_KEY": "sk-fleet-0123456789"})
    client = route.client_settings(settings)
    assert client.key is not None
    assert client.key.get_secret_value() == "sk-primary-0123456789"
    assert client.read_timeout == 7
    other = ModelRoute("o", url="http://o/v1", model="m").client_settings(settings)
    assert other.key is not None
    assert other.key.get_secret_value() == "sk-fleet-0123456789"


# --- the router -----------------------------------------------------------------------------


_CLIENTS: list[ModelClient] = []


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[RedisServer]:
    with RedisServer(tmp_path) as server:
        yield server
    while _CLIENTS:
        run_blocking(_CLIENTS.pop().aclose())


@pytest.fixture
def limits(redis: RedisServer) -> RouteLimits:
    return RouteLimits(RunStore(redis.url, "t:").connection)


def _router(
    limits: RouteLimits,
    *routes: ModelRoute,
    sleep: bool = True,
    retries: int = 0,
    clock: Callable[[], int] = now_ms,
) -> ModelRouter:
    """A router on `routes`, as one worker has it (its clients closed after the test)."""
    made: dict[str, ModelClient] = {}

    def client(route: ModelRoute) -> ModelClient:
        if route.name not in made:
            settings = ModelSettings(
                url=route.url, model=route.model, retries=retries, backoff_base=0.01
            )
            made[route.name] = ModelClient(settings)
            _CLIENTS.append(made[route.name])
        return made[route.name]

    async def no_sleep(seconds: float) -> None:
        raise AssertionError(f"the router slept {seconds} s")

    return ModelRouter(
        routes, limits, client, key_concurrency=None, lease_ms=10_000, clock=clock,
        **({} if sleep else {"sleep": no_sleep}),
    )  # fmt: skip


def _three_or_more(pieces: list[str]) -> bool:
    return len(pieces) >= 3


def _ask(router: ModelRouter, holder: str = "run|1", key: str = "k") -> str:
    routed = run_blocking(router.complete(REQUEST, key=key, holder=holder, tokens=200))
    return routed.route.name


@pytest.mark.parametrize("status", [429, 500, 503])
def test_a_route_in_trouble_falls_through_to_the_next(limits: RouteLimits, status: int) -> None:
    with (
        ModelServer(scripted(Reply(status=status, headers={"Retry-After": "30"}))) as first,
        ModelServer(scripted("from the backup")) as second,
    ):
        router = _router(
            limits,
            ModelRoute("primary", url=first.url, model="m"),
            ModelRoute("backup", url=second.url, model="m"),
        )
        routed = run_blocking(router.complete(REQUEST, key="k", holder="run|1", tokens=200))
        assert (routed.route.name, routed.reply.text) == ("backup", "from the backup")
        assert len(first.calls) == 1
        assert len(second.calls) == 1
        state = limits.state(router.routes[0], now_ms())
        assert state.error
        assert state.in_flight == 0
        assert (state.paused_until_ms is not None) == (status == 429)


def test_a_refused_connection_falls_through(limits: RouteLimits) -> None:
    with refusing_url() as dead, ModelServer(scripted("alive")) as second:
        router = _router(
            limits,
            ModelRoute("dead", url=dead, model="m"),
            ModelRoute("alive", url=second.url, model="m"),
        )
        assert _ask(router) == "alive"


@pytest.mark.parametrize("status", [400, 401, 404, 422])
def test_a_wrong_request_fails_the_call_without_trying_another_route(
    limits: RouteLimits, status: int
) -> None:
    with ModelServer(scripted(Reply(status=status))) as first, ModelServer(scripted()) as second:
        router = _router(
            limits,
            ModelRoute("primary", url=first.url, model="m"),
            ModelRoute("backup", url=second.url, model="m"),
        )
        with pytest.raises(ModelCallError) as caught:
            _ask(router)
        assert caught.value.status == status
        assert second.calls == []
        assert limits.state(router.routes[0], now_ms()).circuit == "closed"


def test_when_every_route_fails_the_call_fails_with_the_last_error(limits: RouteLimits) -> None:
    failing = (scripted(Reply(status=500)), scripted(Reply(status=502)))
    with ModelServer(failing[0]) as a, ModelServer(failing[1]) as b:
        router = _router(
            limits, ModelRoute("a", url=a.url, model="m"), ModelRoute("b", url=b.url, model="m")
        )
        with pytest.raises(ModelCallError) as caught:
            _ask(router)
        assert caught.value.status == 502


def test_a_429_pauses_the_route_for_every_worker_until_its_retry_after(
    limits: RouteLimits,
) -> None:
    limited = Reply(status=429, headers={"Retry-After": "60"})
    with ModelServer(scripted(limited)) as first, ModelServer(scripted("b1", "b2")) as second:
        routes = (
            ModelRoute("primary", url=first.url, model="m"),
            ModelRoute("backup", url=second.url, model="m"),
        )
        assert _ask(_router(limits, *routes), holder="r|1") == "backup"
        # Another worker (another router on the same Redis) does not try the paused route.
        assert _ask(_router(limits, *routes), holder="r|2") == "backup"
        assert len(first.calls) == 1


def test_a_broken_route_is_probed_once_per_interval_not_per_call(limits: RouteLimits) -> None:
    with (
        ModelServer(lambda _call: Reply(status=500)) as broken,
        ModelServer(lambda _call: "ok") as backup,
    ):
        router = _router(
            limits,
            ModelRoute("broken", url=broken.url, model="m"),
            ModelRoute("backup", url=backup.url, model="m"),
        )
        for n in range(40):
            assert _ask(router, holder=f"r|{n}") == "backup"
        assert len(backup.calls) == 40
        # Five failures open the circuit; within the probe interval, nothing more.
        assert len(broken.calls) == 5
        assert limits.state(router.routes[0], now_ms()).circuit == "open"


def test_a_route_with_a_fallback_is_asked_once_per_call_and_spared_once_open(
    limits: RouteLimits,
) -> None:
    # Its client may retry 4 times; with a backup to fall through to, it is asked once,
    # and once its circuit opens, not at all (within the probe interval).
    with (
        ModelServer(lambda _call: Reply(status=500)) as broken,
        ModelServer(lambda _call: "ok") as backup,
    ):
        router = _router(
            limits,
            ModelRoute("broken", url=broken.url, model="m"),
            ModelRoute("backup", url=backup.url, model="m"),
            retries=4,
        )
        for n in range(20):
            assert _ask(router, holder=f"r|{n}") == "backup"
        assert len(broken.calls) == 5  # 20 calls x 5 attempts without it


def test_a_call_retrying_a_route_stops_when_its_circuit_opens(limits: RouteLimits) -> None:
    # Other calls open the route's circuit while this one is between its retries: it
    # asks the circuit before each retry, and stops.
    routes: list[ModelRoute] = []

    def fail_and_open(_call: object) -> Reply:
        for n in range(5):
            limits.done(routes[0], key="k", holder=f"other{n}", outcome="failed", now_ms=now_ms())
        return Reply(status=500)

    with ModelServer(fail_and_open) as server:
        routes.append(ModelRoute("only", url=server.url, model="m"))
        router = _router(limits, *routes, retries=4)
        with pytest.raises(ModelCallError) as caught:
            _ask(router)
        assert len(server.calls) == 1
        assert "not retried" in caught.value.message


def test_a_call_its_caller_stops_is_no_failure_of_its_route(limits: RouteLimits) -> None:
    # A run cancelled (or a lease lost) mid-reply stops the call: the route did nothing
    # wrong, so its circuit, its last error and the routes after it never hear of it.
    endless = Reply("go on ", endless=True, gap=0.01)
    with ModelServer(lambda _call: endless) as first, ModelServer(scripted()) as second:
        router = _router(
            limits,
            ModelRoute("primary", url=first.url, model="m", tpm=60_000),
            ModelRoute("backup", url=second.url, model="m"),
        )
        for n in range(8):  # more than the failures that open a circuit
            pieces: list[str] = []
            asked = router.complete(
                REQUEST, key="k", holder=f"r|{n}", tokens=200,
                should_stop=partial(_three_or_more, pieces), on_text=pieces.append,
            )  # fmt: skip
            with pytest.raises(ModelCallError) as caught:
                run_blocking(asked)
            assert "told to stop" in caught.value.message
        assert len(first.calls) == 8
        assert second.calls == []
        state = limits.state(router.routes[0], now_ms())
        assert (state.circuit, state.failures, state.error, state.in_flight) == ("closed", 0, "", 0)
        # What the stopped calls were charged came back: the next is not spaced behind them.
        assert limits.admit(
            router.routes[0], key="k", holder="r|next", tokens=200, key_concurrency=None,
            lease_ms=10_000, now_ms=now_ms(),
        ).admitted  # fmt: skip


def test_a_call_whose_turn_is_far_off_is_requeued_not_slept_on(limits: RouteLimits) -> None:
    with ModelServer(scripted("first")) as server:
        route = ModelRoute("slow", url=server.url, model="m", rpm=1)
        router = _router(limits, route, sleep=False)
        assert _ask(router, holder="r|1") == "slow"
        before = now_ms()
        with pytest.raises(Requeue) as caught:
            _ask(router, holder="r|2")
        assert caught.value.at_ms - before > MOMENT_MS
        assert "slow" in caught.value.why
        assert limits.state(route, now_ms()).waiting == 1  # it keeps its place
        # ... under the names workers.store.layout gives the route's keys (which
        # ROUTE_ADMIT spells from the route's hash).
        redis, keys = limits._connection.redis, limits._connection.keys
        assert redis.hget(keys.route("slow", "queue-keys"), "r|2") == b"k"
        assert redis.hget(keys.route("slow", "tags"), "k") == b"1"
        assert redis.zscore(keys.route("slow", "told"), "r|2") == caught.value.at_ms


def test_a_call_served_by_another_route_leaves_the_first_routes_queue(
    limits: RouteLimits,
) -> None:
    with ModelServer(lambda _call: "p") as first, ModelServer(lambda _call: "b") as second:
        primary = ModelRoute("primary", url=first.url, model="m", rpm=1)
        router = _router(limits, primary, ModelRoute("backup", url=second.url, model="m"))
        assert _ask(router, holder="r|1") == "primary"
        assert _ask(router, holder="r|2") == "backup"  # primary's turn is a minute off
        assert limits.state(primary, now_ms()).waiting == 0


def test_a_429_saying_when_on_the_last_route_requeues_the_call_for_then(
    limits: RouteLimits,
) -> None:
    limited = Reply(status=429, headers={"Retry-After": "30"})
    with ModelServer(scripted(limited)) as server:
        router = _router(limits, ModelRoute("only", url=server.url, model="m"), sleep=False)
        before = now_ms()
        with pytest.raises(Requeue) as caught:
            _ask(router)
        assert 29_000 <= caught.value.at_ms - before <= 31_000
        assert len(server.calls) == 1  # the client did not wait it out, holding a worker


@pytest.mark.parametrize(
    ("headers", "wait_s"),
    [
        ({"llm_provider-retry-after": "53.21"}, 53.21),  # LiteLLM: never in retry-after
        ({"Retry-After": "1", "llm_provider-retry-after": "60"}, 60),  # the longest says
        ({"retry-after-ms": "45000"}, 45),
        ({"x-ratelimit-reset-requests": "1m30s", "x-ratelimit-remaining-requests": "0"}, 90),
        ({"x-ratelimit-reset-tokens": "20s", "x-ratelimit-remaining-tokens": "0"}, 20),
    ],
)
def test_every_form_of_a_429s_wait_requeues_the_call_for_then(
    limits: RouteLimits, headers: dict[str, str], wait_s: float
) -> None:
    with ModelServer(scripted(Reply(status=429, headers=headers))) as server:
        route = ModelRoute("only", url=server.url, model="m")
        router = _router(limits, route, sleep=False)
        before = now_ms()
        with pytest.raises(Requeue) as caught:
            _ask(router)
        assert abs(caught.value.at_ms - before - wait_s * 1000) <= 1_000
        assert len(server.calls) == 1  # asked once, not five times within the gateway's minute
        paused = limits.state(route, now_ms()).paused_until_ms
        assert paused is not None
        assert abs(paused - before - wait_s * 1000) <= 1_000


def test_a_route_told_it_has_nothing_left_pauses_without_waiting_for_a_429(
    limits: RouteLimits,
) -> None:
    spent = {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "30s"}
    with (
        ModelServer(scripted(Reply(text="last one", headers=spent))) as first,
        ModelServer(lambda _call: "b") as second,
    ):
        primary = ModelRoute("primary", url=first.url, model="m")
        router = _router(limits, primary, ModelRoute("backup", url=second.url, model="m"))
        before = now_ms()
        assert _ask(router, holder="r|1") == "primary"
        paused = limits.state(primary, now_ms()).paused_until_ms
        assert paused is not None
        assert abs(paused - before - 30_000) <= 1_000
        assert _ask(router, holder="r|2") == "backup"  # the primary is not asked again
        assert len(first.calls) == 1


def test_a_429_without_a_retry_after_fails_the_call(limits: RouteLimits) -> None:
    with ModelServer(scripted(Reply(status=429))) as server:
        router = _router(limits, ModelRoute("only", url=server.url, model="m"))
        with pytest.raises(ModelCallError) as caught:
            _ask(router)
        assert caught.value.status == 429


# --- the router on the event loop ---------------------------------------------------------------


async def _until(condition: Callable[[], bool], what: str, timeout: float = 10) -> None:
    give_up = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < give_up, f"waited {timeout} s for {what}"
        await asyncio.sleep(0.01)


def test_renew_many_keeps_the_slots_of_the_calls_it_names(limits: RouteLimits) -> None:
    clock = [now_ms()]
    with ModelServer(lambda _call: Reply("slow", delay=1.0)) as server:
        route = ModelRoute("only", url=server.url, model="m")
        router = _router(limits, route, clock=lambda: clock[0])

        async def renewed_while_in_flight() -> int:
            asked = (
                router.complete(REQUEST, key="k", holder=f"run|{n}", tokens=200) for n in range(3)
            )
            calls = asyncio.gather(*asked)
            await _until(lambda: len(server.calls) == 3, "three calls in flight")
            admitted_at = clock[0]  # each holds its slot until admitted_at + the lease
            clock[0] += 5_000
            # As the thread that renews leases: two named, one not, one that holds none.
            await asyncio.to_thread(router.renew_many, ["run|0", "run|1", "run|gone"])
            held = limits.state(route, admitted_at + 12_000).in_flight
            await calls
            return held

        assert run_blocking(renewed_while_in_flight()) == 2  # the third's lapsed at 10 s
    assert limits.state(route, clock[0]).in_flight == 0  # and every slot came back


def test_renew_many_is_quiet_when_redis_is_away_and_the_reply_is_kept(
    redis: RedisServer, limits: RouteLimits, caplog: pytest.LogCaptureFixture
) -> None:
    with ModelServer(lambda _call: Reply("kept", delay=0.5)) as server:
        router = _router(limits, ModelRoute("only", url=server.url, model="m"))

        async def renewed_with_redis_away() -> str:
            call = asyncio.ensure_future(
                router.complete(REQUEST, key="k", holder="run|1", tokens=200)
            )
            await _until(lambda: len(server.calls) == 1, "the call in flight")
            redis.kill()
            await asyncio.to_thread(router.renew_many, ["run|1"])  # does not raise
            return (await call).reply.text

        with caplog.at_level(logging.WARNING, logger="workers.model.router"):
            assert run_blocking(renewed_with_redis_away()) == "kept"
    assert "could not renew 1 model route slots" in caplog.text


def test_a_call_cancelled_on_the_loop_gives_its_slot_back(limits: RouteLimits) -> None:
    with ModelServer(lambda _call: Reply("too late", delay=30)) as server:
        route = ModelRoute("only", url=server.url, model="m", max_concurrency=1)
        router = _router(limits, route)

        async def cancelled() -> None:
            call = asyncio.ensure_future(
                router.complete(REQUEST, key="k", holder="run|1", tokens=200)
            )
            await _until(lambda: len(server.calls) == 1, "the call in flight")
            assert limits.state(route, now_ms()).in_flight == 1
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call

        run_blocking(cancelled())
        state = limits.state(route, now_ms())
        # Its slot is back at once (not when its lease lapses), and a cancel is no failure.
        assert (state.in_flight, state.failures, state.circuit, state.error) == (0, 0, "closed", "")


BUSY = """
local began = redis.call('TIME')
repeat
  local now = redis.call('TIME')
until (now[1] - began[1]) * 1000000 + (now[2] - began[2]) >= tonumber(ARGV[1]) * 1000
return 1
"""
"""Holds Redis for ARGV[1] ms: every other client's command waits meanwhile."""


def test_the_routers_redis_work_never_holds_the_loop(
    redis: RedisServer, limits: RouteLimits
) -> None:
    with ModelServer(scripted("ok")) as server:
        router = _router(limits, ModelRoute("only", url=server.url, model="m"))
        busy = threading.Thread(target=lambda: redis.client().eval(BUSY, 0, "400"))

        async def routed_while_redis_is_busy() -> tuple[float, float]:
            gaps: list[float] = []

            async def tick() -> None:
                last = time.monotonic()
                while True:
                    await asyncio.sleep(0.005)
                    gaps.append(time.monotonic() - last)
                    last = time.monotonic()

            ticking = asyncio.ensure_future(tick())
            busy.start()
            await asyncio.sleep(0.05)  # the script holds Redis now
            began = time.monotonic()
            await router.complete(REQUEST, key="k", holder="run|1", tokens=200)
            took = time.monotonic() - began
            ticking.cancel()
            return took, max(gaps)

        took, longest_gap = run_blocking(routed_while_redis_is_busy())
        busy.join(10)
    assert took > 0.25  # the call did wait for Redis ...
    assert longest_gap < 0.15  # ... and the loop went on meanwhile
