"""The model client's connections: kept alive between calls, one for each call in flight
with no pool cap, closed when a call is cancelled or cut short and when the client is,
and no thread for any call.

Against real servers on loopback: `ModelServer` (a thread per connection, in this
process) and, where this process's threads are counted, `bench.slow_model` (asyncio,
in a process of its own)."""

from __future__ import annotations

import asyncio
import base64
import http.server
import json
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import ClassVar

import pytest

from agent_core.steps import ModelRequest
from bench.slow_model import reply_text as slow_model_reply
from tests.support.clients import opened
from tests.support.model_server import ModelServer, Reply, refusing_url
from tests.support.redis_server import free_port, wait_for_port
from workers.errors import ModelCallError
from workers.loop import run_blocking
from workers.model.transport import ModelClient, shared_tls
from workers.settings import ModelSettings

REQUEST = ModelRequest(system="You are terse.", prompt="Say hi.")
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def server() -> Iterator[ModelServer]:
    with ModelServer(lambda _call: Reply(text="hi there", delay=0.3)) as running:
        yield running


def wait_until(condition: Callable[[], bool], timeout: float, *, what: str) -> None:
    give_up = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < give_up, f"waited {timeout} s for {what}"
        time.sleep(0.02)


def _client(url: str, **settings: object) -> ModelClient:
    options: dict[str, object] = {"read_timeout": 10.0, "retries": 0} | settings
    return ModelClient(ModelSettings(url=url, **options))


def _at_once(client: ModelClient, calls: int, *, streamed: bool = False) -> list[str]:
    """Make `calls` calls at once on the process's loop; return their texts."""
    on_text = (lambda _piece: None) if streamed else None

    async def all_of_them() -> list[str]:
        asked = (client.complete(REQUEST, on_text=on_text) for _ in range(calls))
        return [reply.text for reply in await asyncio.gather(*asked)]

    return run_blocking(all_of_them())


def test_calls_one_after_another_reuse_one_connection(server: ModelServer) -> None:
    with opened(_client(server.url)) as client:
        for streamed in (False, True, False, True):
            on_text = (lambda _piece: None) if streamed else None
            run_blocking(client.complete(REQUEST, on_text=on_text))
        assert server.accepted_connections == 1


@pytest.mark.parametrize("streamed", [False, True], ids=["plain", "streamed"])
def test_calls_at_once_each_have_a_connection_and_the_next_ones_reuse_them(
    server: ModelServer, streamed: bool
) -> None:
    with opened(_client(server.url)) as client:
        assert _at_once(client, 12, streamed=streamed) == ["hi there"] * 12
        assert server.accepted_connections == 12  # none waited for another's connection
        assert _at_once(client, 12, streamed=streamed) == ["hi there"] * 12
        assert _at_once(client, 5, streamed=streamed) == ["hi there"] * 5
        assert server.accepted_connections == 12  # every later call had one kept for it


def test_a_call_that_fails_leaves_the_next_ones_working() -> None:
    with refusing_url() as url, opened(_client(url)) as client:
        for _ in range(3):
            with pytest.raises(ModelCallError, match="could not connect"):
                run_blocking(client.complete(REQUEST))


def test_a_reply_cut_short_closes_its_connection_and_is_not_reused() -> None:
    big = Reply(text="x" * 5_000)
    endless = Reply(text="go on ", endless=True, gap=0.01)
    replies = iter([big, big, endless, Reply(text="fine")])
    lock = threading.Lock()

    def respond(call: object) -> Reply:
        with lock:
            return next(replies)

    with (
        ModelServer(respond) as server,
        opened(_client(server.url, max_body_bytes=1_000)) as client,
    ):
        with pytest.raises(ModelCallError, match="larger than 1000 bytes"):
            run_blocking(client.complete(REQUEST))  # plain
        with pytest.raises(ModelCallError, match="larger than 1000 bytes"):
            run_blocking(client.complete(REQUEST, on_text=lambda _piece: None))  # streamed
        stop = threading.Event()
        stopping = client.complete(
            REQUEST, on_text=lambda _piece: stop.set(), should_stop=stop.is_set
        )
        with pytest.raises(ModelCallError, match="stopped"):
            run_blocking(stopping)
        # A body left unread closes its connection: the next call opens one anew.
        wait_until(lambda: server.open_connections == 0, 10, what="the cut connections closed")
        assert run_blocking(client.complete(REQUEST)).text == "fine"


def test_cancelling_a_call_mid_stream_ends_it_at_once_and_closes_its_connection() -> None:
    endless = Reply(text="go on ", endless=True, gap=0.01)
    pieces: list[str] = []

    async def cancelled_mid_stream(client: ModelClient) -> float:
        streaming = asyncio.Event()

        def on_text(piece: str) -> None:
            pieces.append(piece)
            streaming.set()

        call = asyncio.ensure_future(client.complete(REQUEST, on_text=on_text))
        await asyncio.wait_for(streaming.wait(), 10)
        began = time.monotonic()
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        return time.monotonic() - began

    with (
        ModelServer(lambda _call: endless) as server,
        opened(_client(server.url, read_timeout=30.0)) as client,
    ):
        took = run_blocking(cancelled_mid_stream(client))
        assert took < 0.5  # at its next await, not at a timeout
        wait_until(lambda: server.open_connections == 0, 5, what="the server to see it closed")
        assert pieces, "it was streaming when it was cancelled"
        assert server.accepted_connections == 1


def test_closing_the_client_closes_every_kept_connection(server: ModelServer) -> None:
    client = _client(server.url)
    _at_once(client, 6)
    wait_until(lambda: server.open_connections == 6, 10, what="six kept connections")
    run_blocking(client.aclose())
    wait_until(lambda: server.open_connections == 0, 10, what="every connection closed")
    with pytest.raises(RuntimeError, match="closed"):
        run_blocking(client.complete(REQUEST))


def _stats(port: int) -> dict[str, int]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats", timeout=10) as answer:
        found: dict[str, int] = json.loads(answer.read())
        return found


@pytest.fixture
def slow_model() -> Iterator[int]:
    """`bench.slow_model` in a process of its own, its port: a streamed reply in 3 s, so
    that 200 calls overlap even on a busy machine."""
    port = free_port()
    command = [sys.executable, "-m", "bench.slow_model", "--port", str(port), "--seconds", "3"]
    command += ["--chars", "0"]  # (the shortest answer: `slow_model_reply(0, 1, 0)`)
    model = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL)
    try:
        wait_for_port(port, 30)
        yield port
    finally:
        model.terminate()
        model.wait(30)


def test_two_hundred_streamed_calls_at_once_take_no_thread(slow_model: int) -> None:
    url = f"http://127.0.0.1:{slow_model}/v1"
    pieces: list[str] = []
    with opened(_client(url, read_timeout=30.0)) as client:
        run_blocking(client.complete(REQUEST))  # the loop, and everything it starts, is up
        before = threading.active_count()
        during: list[int] = []

        async def two_hundred() -> list[str]:
            asked = [client.complete(REQUEST, on_text=pieces.append) for _ in range(200)]
            calls = asyncio.gather(*asked)
            while not calls.done():  # (counted while they are in flight, not only after)
                during.append(threading.active_count())
                await asyncio.wait([calls], timeout=0.1)
            return [reply.text for reply in calls.result()]

        texts = run_blocking(two_hundred())
        after = threading.active_count()
    assert texts == [slow_model_reply(0, 1, 0)] * 200
    assert len(pieces) >= 200 * 2  # streamed, in pieces
    assert _stats(slow_model)["most"] == 200  # all of them were in flight at once
    assert max(during) <= before + 2
    assert after <= before + 2


FIRST_CALL = """
import sys
import tests.apps.notes  # what a prefork worker's parent imports
from tests.support.model_server import ModelServer, Reply
from workers.loop import run_blocking
from workers.model.transport import ModelClient
from workers.settings import ModelSettings
from agent_core.steps import ModelRequest

loaded = set(sys.modules)
with ModelServer(lambda _call: Reply(text="hi")) as server:
    client = ModelClient(ModelSettings(url=server.url))
    asked = ModelRequest(system="s", prompt="p")
    run_blocking(client.complete(asked, on_text=lambda _piece: None))
    run_blocking(client.aclose())
stack = ("aiohttp", "aiohappyeyeballs", "aiosignal", "frozenlist", "multidict", "propcache", "yarl")
print(*sorted(m for m in set(sys.modules) - loaded if m.partition(".")[0] in stack))
"""


def test_a_worker_loads_the_http_stack_before_its_pool_forks() -> None:
    # A prefork worker's parent imports the app; each child makes its first model call
    # later. Loaded with the app, aiohttp and what it stands on are shared by every
    # child, not imported again by each at its first call (CPU each child would pay).
    found = subprocess.run(
        [sys.executable, "-c", FIRST_CALL], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert found.stdout.split() == [], found.stdout


def test_a_worker_makes_the_tls_context_before_its_pool_forks() -> None:
    # Loading the CA bundle costs some 20 ms of CPU: made as the worker starts (its
    # parent, before a prefork pool forks), it is each child's, and every client's.
    from celery.signals import worker_init  # noqa: PLC0415 - only this test sends it

    from tests.apps.notes import relay  # noqa: PLC0415 - its app, as a worker loads it

    shared_tls.cache_clear()

    class Worker:  # (what of a WorkController the signal's receivers read)
        app, pool_cls, concurrency = relay.celery, "prefork", 2

    worker_init.send(sender=Worker())
    made = shared_tls.cache_info()
    assert (made.misses, made.currsize) == (1, 1)
    run_blocking(_client("https://model.test/v1").aclose())
    taken = shared_tls.cache_info()
    assert (taken.misses, taken.hits) == (1, made.hits + 1)  # the client took the worker's


class _Proxy(http.server.BaseHTTPRequestHandler):
    """An HTTP proxy on loopback that answers every call itself, and writes down what
    it was asked (the absolute URL a client sends a proxy, and its login)."""

    asked: ClassVar[list[tuple[str, str]]] = []

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.asked.append((self.path, self.headers.get("Proxy-Authorization", "")))
        body = json.dumps({"choices": [{"message": {"content": "via the proxy"}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args: object) -> None:
        pass


@pytest.fixture
def proxy(monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    for name in ("http_proxy", "https_proxy", "no_proxy", "all_proxy", "NETRC"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    _Proxy.asked.clear()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Proxy)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def test_the_environments_proxy_is_used_and_no_proxy_is_honoured(
    proxy: int, server: ModelServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HTTP_PROXY", f"http://relay:s3cret@127.0.0.1:{proxy}")
    with refusing_url() as nowhere, opened(_client(nowhere)) as client:
        # Through the proxy, which answers: the server at the URL refuses connections.
        assert [run_blocking(client.complete(REQUEST)).text for _ in range(2)] == [
            "via the proxy"
        ] * 2
    target = f"{nowhere}/chat/completions"
    login = "Basic " + base64.b64encode(b"relay:s3cret").decode()
    assert _Proxy.asked == [(target, login)] * 2
    # NO_PROXY names the model's host: straight to it, the proxy asked nothing more.
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    with opened(_client(server.url)) as client:
        assert run_blocking(client.complete(REQUEST)).text == "hi there"
    assert len(_Proxy.asked) == 2


def test_netrc_logs_in_to_a_model_server_without_a_key(
    proxy: int, server: ModelServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    netrc = tmp_path / "netrc"
    netrc.write_text("machine 127.0.0.1 login relay password n3trc\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))
    with opened(_client(server.url)) as client:
        assert run_blocking(client.complete(REQUEST)).text == "hi there"
    with opened(ModelClient(ModelSettings(url=server.url, key="sk-its-own", retries=0))) as keyed:
        run_blocking(keyed.complete(REQUEST))  # a key of its own wins over .netrc
    sent = [call.headers.get("authorization") for call in server.calls]
    assert sent == ["Basic " + base64.b64encode(b"relay:n3trc").decode(), "Bearer sk-its-own"]
    assert _Proxy.asked == []  # (no proxy named: none asked)
