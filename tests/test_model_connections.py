"""The model client's connections (`workers.model.connections.KeptConnections`): one
kept-alive connection for each call in flight, reused by the calls after it, given back
however a call ends, and closed once idle past their expiry or with the client.

Against a real server on loopback, through `ModelClient` as a worker makes its calls."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from agent_core.steps import ModelRequest
from tests.support.model_server import ModelServer, Reply, refusing_url
from workers.errors import ModelCallError
from workers.model.connections import KeptConnections
from workers.model.transport import ModelClient
from workers.settings import ModelSettings

REQUEST = ModelRequest(system="You are terse.", prompt="Say hi.")
KEEPALIVE_S = 60.0
ROOT = Path(__file__).resolve().parents[1]


class Clock:
    """A monotonic clock a test moves by hand."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def server() -> Iterator[ModelServer]:
    with ModelServer(lambda _call: Reply(text="hi there", delay=0.3)) as running:
        yield running


def wait_until(condition: Callable[[], bool], timeout: float, *, what: str) -> None:
    give_up = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < give_up, f"waited {timeout} s for {what}"
        time.sleep(0.02)


def _client(url: str, connections: KeptConnections, **settings: object) -> ModelClient:
    options: dict[str, object] = {"read_timeout": 10.0, "retries": 0} | settings
    return ModelClient(ModelSettings(url=url, **options), transport=connections)


def _at_once(client: ModelClient, calls: int, *, streamed: bool = False) -> list[str]:
    """Make `calls` calls at once (each on a thread of its own); return their texts."""
    on_text = (lambda _piece: None) if streamed else None
    with ThreadPoolExecutor(calls) as pool:
        replies = pool.map(lambda _: client.complete(REQUEST, on_text=on_text), range(calls))
        return [reply.text for reply in replies]


def test_calls_one_after_another_reuse_one_connection(server: ModelServer) -> None:
    connections = KeptConnections()
    with _client(server.url, connections) as client:
        for streamed in (False, True, False, True):
            client.complete(REQUEST, on_text=(lambda _piece: None) if streamed else None)
        assert server.accepted_connections == 1
        assert (connections.kept, connections.lent) == (1, 0)


@pytest.mark.parametrize("streamed", [False, True], ids=["plain", "streamed"])
def test_calls_at_once_each_have_a_connection_and_the_next_ones_reuse_them(
    server: ModelServer, streamed: bool
) -> None:
    connections = KeptConnections()
    with _client(server.url, connections) as client:
        assert _at_once(client, 12, streamed=streamed) == ["hi there"] * 12
        # (A call's connection is back on the shelf as its reply is read, before the
        # server counts it idle: each was in use by one call at a time.)
        assert server.accepted_connections == 12
        assert (connections.kept, connections.lent) == (12, 0)
        assert _at_once(client, 12, streamed=streamed) == ["hi there"] * 12
        assert _at_once(client, 5, streamed=streamed) == ["hi there"] * 5
        assert server.accepted_connections == 12  # every later call had one kept for it
        assert (connections.kept, connections.lent) == (12, 0)


def test_connections_idle_past_their_expiry_are_closed_as_later_calls_pass(
    server: ModelServer,
) -> None:
    clock = Clock()
    # (An expiry of a minute: httpcore's own, on the real clock, never comes within the test.)
    connections = KeptConnections(keepalive_s=KEEPALIVE_S, clock=clock)
    with _client(server.url, connections) as client:
        _at_once(client, 4)
        assert connections.kept == 4
        wait_until(lambda: server.open_connections == 4, 10, what="four kept connections")
        clock.now += KEEPALIVE_S / 2
        client.complete(REQUEST)  # takes the newest; none has waited past the expiry yet
        assert connections.kept == 4
        clock.now += KEEPALIVE_S  # the three the last call did not use have expired now
        client.complete(REQUEST)  # takes the newest and closes the oldest
        assert connections.kept == 3
        wait_until(lambda: server.open_connections == 3, 10, what="the oldest to be closed")
        client.complete(REQUEST)
        client.complete(REQUEST)
        assert connections.kept == 1  # the one in use stays, however old the others were
        wait_until(lambda: server.open_connections == 1, 10, what="the idle ones closed")
        assert server.accepted_connections == 4


def test_a_call_that_fails_gives_its_connection_back() -> None:
    connections = KeptConnections()
    with refusing_url() as url, _client(url, connections) as client:
        for _ in range(3):
            with pytest.raises(ModelCallError):
                client.complete(REQUEST)
        assert connections.lent == 0
        assert connections.kept == 1  # one transport, tried three times


def test_a_reply_cut_short_gives_its_connection_back_and_is_not_reused() -> None:
    big = Reply(text="x" * 5_000)
    endless = Reply(text="go on ", endless=True, gap=0.01)
    replies = iter([big, big, endless, Reply(text="fine")])
    lock = threading.Lock()

    def respond(call: object) -> Reply:
        with lock:
            return next(replies)

    connections = KeptConnections()
    with (
        ModelServer(respond) as server,
        _client(server.url, connections, max_body_bytes=1_000) as client,
    ):
        with pytest.raises(ModelCallError, match="larger than 1000 bytes"):
            client.complete(REQUEST)  # plain
        with pytest.raises(ModelCallError, match="larger than 1000 bytes"):
            client.complete(REQUEST, on_text=lambda _piece: None)  # streamed
        stop = threading.Event()
        with pytest.raises(ModelCallError, match="stopped"):
            client.complete(REQUEST, on_text=lambda _piece: stop.set(), should_stop=stop.is_set)
        assert connections.lent == 0
        # A body left unread closes its connection: the next call opens one anew.
        wait_until(lambda: server.open_connections == 0, 10, what="the cut connections closed")
        assert client.complete(REQUEST).text == "fine"
        assert connections.lent == 0


def test_closing_the_client_closes_every_kept_connection(server: ModelServer) -> None:
    connections = KeptConnections()
    client = _client(server.url, connections)
    _at_once(client, 6)
    wait_until(lambda: server.open_connections == 6, 10, what="six kept connections")
    client.close()
    assert connections.kept == 0
    wait_until(lambda: server.open_connections == 0, 10, what="every connection closed")
    with pytest.raises(RuntimeError):
        client.complete(REQUEST)


def test_a_worker_loads_the_http_stack_before_its_pool_forks() -> None:
    # A prefork worker's parent imports the app; each child makes its first model call
    # later. Loaded with the app, httpcore and h11 are shared by every child, not
    # imported again by each at its first call (a third of a second of CPU each).
    probe = "import sys, tests.apps.notes; print(*sorted({'httpcore', 'h11'} & set(sys.modules)))"
    found = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert found.stdout.split() == ["h11", "httpcore"], found.stderr


def test_a_worker_makes_the_tls_context_before_its_pool_forks(tmp_path: Path) -> None:
    # Loading the CA bundle costs some 20 ms of CPU: made as the worker starts (its
    # parent, before a prefork pool forks), it is each child's, and every connection's.
    from celery.signals import worker_init  # noqa: PLC0415 - only this test sends it

    from tests.apps.notes import relay  # noqa: PLC0415 - its app, as a worker loads it
    from workers.model.connections import shared_tls  # noqa: PLC0415

    shared_tls.cache_clear()

    class Worker:  # (what of a WorkController the signal's receivers read)
        app, pool_cls, concurrency = relay.celery, "prefork", 2

    worker_init.send(sender=Worker())
    made = shared_tls.cache_info()
    assert (made.misses, made.currsize) == (1, 1)
    assert KeptConnections()._tls is shared_tls()
