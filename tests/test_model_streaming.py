"""Streamed replies: the model client reads server-sent events as they arrive.

Against the loopback server (which streams with gaps between events, and plays
hostile streams byte for byte) and, for the parser alone, any cut of a body.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent_core.steps import ModelRequest
from tests.support.clients import opened
from tests.support.model_server import ModelServer, Reply, scripted
from tests.support.redis_server import RedisServer
from workers import ModelRoute
from workers.errors import ModelCallError
from workers.loop import process_loop, run_blocking
from workers.model import transport
from workers.model.limits import RouteLimits
from workers.model.router import ModelRouter
from workers.model.transport import ModelClient
from workers.model.wire import RESTART, Model, ModelReply, StreamedReply, complete, takes_text
from workers.settings import ModelSettings, now_ms
from workers.store.runs import RunStore

REQUEST = ModelRequest(system="You are terse.", prompt="Say hi.")
ANSWER = '{"final": "Héllo wörld, streamed in pieces ✓"}'


@pytest.fixture
def server() -> Iterator[Callable[..., ModelServer]]:
    servers: list[ModelServer] = []

    def start(*script: Reply | str, **options: Any) -> ModelServer:
        servers.append(ModelServer(scripted(*script), **options).start())
        return servers[-1]

    yield start
    for running in servers:
        running.stop()


class Pieces:
    """An `on_text` that keeps what it was given and when."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.at: list[float] = []

    def __call__(self, piece: str) -> None:
        self.seen.append(piece)
        self.at.append(time.monotonic())

    def last_start(self) -> str:
        """The text since the last RESTART: what a reader shows in the end."""
        after = len(self.seen) - self.seen[::-1].index(RESTART) if RESTART in self.seen else 0
        return "".join(self.seen[after:])


def client(url: str, **settings: Any) -> ModelClient:
    options = {"read_timeout": 5.0, "retries": 2, "backoff_base": 0.01} | settings
    return ModelClient(ModelSettings(url=url, **options))


# --- a stream as it should be ------------------------------------------------------------


def test_pieces_arrive_while_the_server_is_still_writing(
    server: Callable[..., ModelServer],
) -> None:
    model = server(Reply(ANSWER, gap=0.05, piece_chars=6, usage=(20, 9)))
    pieces = Pieces()
    with opened(client(model.url)) as http:
        reply = run_blocking(http.complete(REQUEST, on_text=pieces))
        done = time.monotonic()
    assert "".join(pieces.seen) == reply.text == ANSWER
    assert len(pieces.seen) == -(-len(ANSWER) // 6)
    assert RESTART not in pieces.seen
    # The first piece came long before the last: it was handed over as it arrived.
    assert done - pieces.at[0] > 0.05 * (len(pieces.seen) - 2)
    assert reply.usage.total_tokens == 29
    assert reply.finish_reason == "stop"
    [call] = model.calls
    assert call.body["stream"] is True
    assert call.body["stream_options"] == {"include_usage": True}


def test_while_many_replies_stream_each_is_read_a_few_pieces_at_a_time(
    server: Callable[..., ModelServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    # As if 300 replies streamed at once: one reply's reads wait the longest gap (0.1 s).
    monkeypatch.setattr(transport, "READS_PER_S", 1 / 300)
    text = "x" * 160
    model = server(Reply(text, gap=0.01, piece_chars=4))  # 40 pieces over 0.4 s
    pieces = Pieces()
    with opened(client(model.url)) as http:
        reply = run_blocking(http.complete(REQUEST, on_text=pieces))
    assert "".join(pieces.seen) == reply.text == text
    # Read one by one, they would be 40 hand-overs; read every 0.1 s, about 5 (the first
    # read takes what came at once, each next one what came in its gap).
    assert 2 <= len(pieces.seen) <= 10, pieces.seen
    assert reply.finish_reason == "stop"


def test_without_on_text_the_call_is_plain(server: Callable[..., ModelServer]) -> None:
    model = server(Reply(ANSWER))
    with opened(client(model.url)) as http:
        assert run_blocking(http.complete(REQUEST)).text == ANSWER
    assert "stream" not in model.calls[0].body


def test_streamed_calls_share_one_kept_alive_connection(
    server: Callable[..., ModelServer],
) -> None:
    model = server(Reply(ANSWER), Reply(ANSWER))
    with opened(client(model.url)) as http:
        for _ in range(2):
            run_blocking(http.complete(REQUEST, on_text=Pieces()))
    assert len({call.port for call in model.calls}) == 1


def test_a_server_that_does_not_stream_hands_the_text_over_whole(
    server: Callable[..., ModelServer],
) -> None:
    model = server(Reply(ANSWER), streams=False)
    pieces = Pieces()
    with opened(client(model.url)) as http:
        assert run_blocking(http.complete(REQUEST, on_text=pieces)).text == ANSWER
    assert pieces.seen == [ANSWER]


def test_a_server_that_refuses_streams_is_asked_plainly_from_then_on(
    server: Callable[..., ModelServer],
) -> None:
    model = server(Reply(ANSWER), Reply("second"), refuse_streams=True)
    first, second = Pieces(), Pieces()
    with opened(client(model.url)) as http:
        assert run_blocking(http.complete(REQUEST, on_text=first)).text == ANSWER
        assert run_blocking(http.complete(REQUEST, on_text=second)).text == "second"
    assert [first.seen, second.seen] == [[ANSWER], ["second"]]
    # The refused stream request never reached the script: two replies, two plain calls.
    assert ["stream" in call.body for call in model.calls] == [False, False]


def test_a_retry_after_part_of_a_reply_restarts_it(server: Callable[..., ModelServer]) -> None:
    model = server(Reply("first attempt, cut short", drop_after=2), Reply(ANSWER))
    pieces = Pieces()
    with opened(client(model.url)) as http:
        reply = run_blocking(http.complete(REQUEST, on_text=pieces))
    assert reply.text == ANSWER
    restart = pieces.seen.index(RESTART)
    assert "".join(pieces.seen[:restart]) == "first at"  # the two pieces sent, then RESTART
    assert pieces.last_start() == ANSWER
    assert len(model.calls) == 2


def test_a_reply_cut_by_the_length_limit_says_so(server: Callable[..., ModelServer]) -> None:
    model = server(Reply("x" * 100))
    pieces = Pieces()
    with opened(client(model.url, max_tokens=5)) as http:
        reply = run_blocking(http.complete(REQUEST, on_text=pieces))
    assert reply.finish_reason == "length"
    assert reply.text == "".join(pieces.seen) == "x" * 20


@pytest.mark.parametrize("paced", [False, True], ids=["read-as-it-comes", "reads-held"])
def test_should_stop_ends_a_stream(
    server: Callable[..., ModelServer], monkeypatch: pytest.MonkeyPatch, paced: bool
) -> None:
    if paced:
        monkeypatch.setattr(transport, "READS_PER_S", 1 / 300)
    model = server(Reply(ANSWER * 20, gap=0.05))
    pieces = Pieces()
    stop = threading.Event()

    def on_text(piece: str) -> None:
        pieces(piece)
        if len(pieces.seen) == 3:
            stop.set()

    with opened(client(model.url)) as http, pytest.raises(ModelCallError, match="told to stop"):
        run_blocking(http.complete(REQUEST, should_stop=stop.is_set, on_text=on_text))
    assert len(pieces.seen) == 3


def test_a_call_cancelled_while_its_reading_is_held_ends_and_the_client_goes_on(
    server: Callable[..., ModelServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(transport, "READS_PER_S", 1 / 300)  # each next read waits 0.1 s
    model = server(Reply(ANSWER * 20, gap=0.02), Reply(ANSWER))
    pieces = Pieces()

    async def cancelled(http: ModelClient) -> float:
        call = asyncio.ensure_future(http.complete(REQUEST, on_text=pieces))
        while not pieces.seen:
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.03)  # inside the gap: the connection's reading is held
        call.cancel()
        began = time.monotonic()
        with pytest.raises(asyncio.CancelledError):
            await call
        return time.monotonic() - began

    with opened(client(model.url)) as http:
        assert run_blocking(cancelled(http)) < 1.0  # at once, not after the gap or the reply
        assert len(pieces.seen) == 1
        assert run_blocking(http.complete(REQUEST, on_text=Pieces())).text == ANSWER
    assert len(model.calls) == 2


# --- hostile streams: each gets a stated outcome --------------------------------------------


def _sse(*events: object) -> list[bytes]:
    return [
        b"data: " + (e if isinstance(e, bytes) else json.dumps(e).encode()) + b"\n\n"
        for e in events
    ]


def _delta(text: str, finish: str | None = None) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": finish}]}


def test_a_chunk_cut_inside_a_utf8_character_or_an_escape(
    server: Callable[..., ModelServer],
) -> None:
    raw = b'data: {"choices": [{"delta": {"content": "caf\xc3\xa9 \xe2\x9c\x93 "}}]}\n\n'
    escaped = b'data: {"choices": [{"delta": {"content": "\\u00e9!"}, "finish_reason": "stop"}]}'
    body = raw + escaped + b"\n\ndata: [DONE]\n\n"
    in_utf8 = body.index(b"\xe2\x9c\x93") + 1  # between the bytes of the check mark
    in_escape = body.index(b"\\u00e9") + 3  # between \u0 and 0e9
    chunks = (body[:in_utf8], body[in_utf8:in_escape], body[in_escape:])
    model = server(Reply(sse=chunks, gap=0.02))
    pieces = Pieces()
    with opened(client(model.url)) as http:
        reply = run_blocking(http.complete(REQUEST, on_text=pieces))
    assert reply.text == "caf\u00e9 \u2713 \u00e9!"
    assert pieces.seen == ["caf\u00e9 \u2713 ", "\u00e9!"]


def test_an_event_the_fast_decoder_refuses_is_read_as_the_stdlib_reads_it() -> None:
    # Bytes that are not UTF-8 are replaced and a lone surrogate escape is kept, as before
    # events were decoded with msgspec; JSON that is not JSON is still said to be so.
    events = StreamedReply()
    assert events.feed(b'data: {"choices": [{"delta": {"content": "a\xffb"}}]}\n\n') == ["a\ufffdb"]
    assert events.feed(b'data: {"choices": [{"delta": {"content": "\\ud800!"}}]}\n\n') == [
        "\ud800!"
    ]
    with pytest.raises(ModelCallError, match="a streamed event is not JSON"):
        events.feed(b"data: {not json\n\n")


def test_a_stream_that_never_ends_is_cut_at_the_deadline(
    server: Callable[..., ModelServer],
) -> None:
    model = server(Reply("go on ", endless=True, gap=0.01))
    pieces = Pieces()
    started = time.monotonic()
    with opened(client(model.url, deadline=1.0)) as http, pytest.raises(ModelCallError) as caught:
        run_blocking(http.complete(REQUEST, on_text=pieces))
    assert "passed its deadline of 1 s" in caught.value.message
    assert time.monotonic() - started < 5
    assert len(pieces.seen) > 10


def test_a_stream_that_never_ends_is_cut_at_the_body_cap(
    server: Callable[..., ModelServer],
) -> None:
    model = server(Reply("go on ", endless=True, piece_chars=1_000))
    with (
        opened(client(model.url, max_body_bytes=200_000)) as http,
        pytest.raises(ModelCallError) as caught,
    ):
        run_blocking(http.complete(REQUEST, on_text=Pieces()))
    assert "larger than 200000 bytes" in caught.value.message
    assert not caught.value.retryable


def test_a_ten_megabyte_stream_is_refused_past_the_body_cap(
    server: Callable[..., ModelServer],
) -> None:
    model = server(Reply("y" * 10 * 1024 * 1024, piece_chars=64 * 1024))
    pieces = Pieces()
    with opened(client(model.url, max_tokens=0)) as http, pytest.raises(ModelCallError) as caught:
        run_blocking(http.complete(REQUEST, on_text=pieces))
    assert "larger than 8388608 bytes" in caught.value.message  # RELAY's default cap, 8 MB
    assert not caught.value.retryable
    assert len(model.calls) == 1  # not retried: the same reply would come again
    assert 7 * 1024 * 1024 < sum(map(len, pieces.seen)) <= 8 * 1024 * 1024


def test_a_stream_with_a_finish_reason_but_no_done_is_a_reply(
    server: Callable[..., ModelServer],
) -> None:
    model = server(Reply(ANSWER, done=False))
    with opened(client(model.url)) as http:
        assert run_blocking(http.complete(REQUEST, on_text=Pieces())).text == ANSWER


def test_a_stream_that_ends_without_its_reply_is_retried(
    server: Callable[..., ModelServer],
) -> None:
    cut = Reply(sse=tuple(_sse(_delta("half a rep"))))
    model = server(cut, cut, cut)
    pieces = Pieces()
    with opened(client(model.url)) as http, pytest.raises(ModelCallError) as caught:
        run_blocking(http.complete(REQUEST, on_text=pieces))
    assert "ended before the reply was complete" in caught.value.message
    assert caught.value.retryable
    assert pieces.seen == ["half a rep", RESTART, "half a rep", RESTART, "half a rep"]


def test_a_stream_a_gateway_ends_inside_the_json_object_is_retried_as_a_dropped_stream(
    server: Callable[..., ModelServer],
) -> None:
    # A gateway ending the stream early still claims finish_reason "stop" and sends [DONE];
    # the half object is the transport's failure, not a reply for the model to be told off for.
    cut = Reply(sse=(*_sse(_delta('{"final": "Héllo wö', "stop")), b"data: [DONE]\n\n"))
    model = server(cut, Reply(ANSWER))
    pieces = Pieces()
    with opened(client(model.url)) as http:
        assert run_blocking(http.complete(REQUEST, on_text=pieces)).text == ANSWER
    assert len(model.calls) == 2
    assert pieces.last_start() == ANSWER

    model = server(cut, cut, cut)
    with opened(client(model.url)) as http, pytest.raises(ModelCallError) as caught:
        run_blocking(http.complete(REQUEST, on_text=Pieces()))
    assert "stream ended inside a JSON object (19 characters" in caught.value.message
    assert "finish_reason 'stop'" in caught.value.message
    assert caught.value.retryable  # the core sees a failed call, not an unusable reply
    assert len(model.calls) == 3


def test_a_reply_cut_at_the_length_limit_or_without_an_object_is_not_a_dropped_stream(
    server: Callable[..., ModelServer],
) -> None:
    length = Reply(sse=(*_sse(_delta('{"final": "a long', "length")), b"data: [DONE]\n\n"))
    prose = Reply(sse=(*_sse(_delta("I think {braces} are fine", "stop")), b"data: [DONE]\n\n"))
    model = server(length, prose)
    with opened(client(model.url)) as http:
        cut_reply = run_blocking(http.complete(REQUEST, on_text=Pieces()))
        assert (cut_reply.text, cut_reply.finish_reason) == ('{"final": "a long', "length")
        assert (
            run_blocking(http.complete(REQUEST, on_text=Pieces())).text
            == "I think {braces} are fine"
        )
    assert len(model.calls) == 2


def test_an_error_mid_stream_is_retried(server: Callable[..., ModelServer]) -> None:
    broken = Reply(sse=tuple(_sse(_delta("so far"), {"error": {"message": "overloaded"}})))
    model = server(broken, Reply(ANSWER))
    pieces = Pieces()
    with opened(client(model.url)) as http:
        assert run_blocking(http.complete(REQUEST, on_text=pieces)).text == ANSWER
    assert pieces.seen[:2] == ["so far", RESTART]


def test_an_event_that_is_not_json_is_an_unusable_reply(
    server: Callable[..., ModelServer],
) -> None:
    model = server(Reply(sse=(b"data: {not json\n\n",)))
    with opened(client(model.url)) as http, pytest.raises(ModelCallError) as caught:
        run_blocking(http.complete(REQUEST, on_text=Pieces()))
    assert "a streamed event is not JSON" in caught.value.message
    assert not caught.value.retryable
    assert len(model.calls) == 1


def test_a_stream_without_usage_is_counted_by_its_size(server: Callable[..., ModelServer]) -> None:
    events = (*_sse(_delta("x" * 40, "stop")), b"data: [DONE]\n\n")
    model = server(Reply(sse=events))
    with opened(client(model.url, max_tokens=0)) as http:
        reply = run_blocking(http.complete(REQUEST, on_text=Pieces()))
    assert reply.usage.completion_tokens == 10
    assert reply.usage.prompt_tokens > 0


# --- the parser alone --------------------------------------------------------------------------

BODY = (
    b": keep-alive\r\n\r\n"
    b'data: {"model": "m1", "choices": [{"delta": {"role": "assistant", "content": ""}}]}\r\n\r\n'
    + b"".join(_sse(_delta("h\u00e9"), _delta(" \u2713 \\"), _delta('"q"', "stop")))
    + b'event: ping\ndata: {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4}}'
    + b"\n\ndata: [DONE]\n\nafter the end"
)


def _read(chunks: list[bytes]) -> tuple[list[str], StreamedReply]:
    events = StreamedReply()
    pieces = [p for chunk in chunks for p in events.feed(chunk)]
    return pieces + events.end(), events


@given(st.lists(st.integers(min_value=0, max_value=len(BODY)), max_size=12))
def test_any_cut_of_a_body_reads_the_same(cuts: list[int]) -> None:
    points = [0, *sorted(cuts), len(BODY)]
    pieces, events = _read([BODY[a:b] for a, b in itertools.pairwise(points)])
    assert pieces == ["h\u00e9", " \u2713 \\", '"q"']
    reply = events.reply(100)
    assert reply.text == 'h\u00e9 \u2713 \\"q"'
    assert (reply.model, reply.finish_reason) == ("m1", "stop")
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (3, 4)


def test_a_last_event_without_a_blank_line_is_read_and_one_cut_short_dropped() -> None:
    pieces, events = _read([b'data: {"choices": [{"delta": {"content": "end"}, "finish_reason":'])
    assert pieces == []
    with pytest.raises(ModelCallError, match="ended before"):
        events.reply(0)
    pieces, events = _read([b'data: {"choices": [{"delta": {"content": "end"}}]}'])
    assert pieces == ["end"]
    with pytest.raises(ModelCallError, match="ended before"):
        events.reply(0)


def test_a_long_body_in_one_byte_chunks_is_read_in_linear_time() -> None:
    body = b"data: " + json.dumps(_delta("z" * 200_000, "stop")).encode() + b"\n\n"
    started = time.monotonic()
    pieces, _ = _read([body[i : i + 1] for i in range(len(body))])
    assert pieces == ["z" * 200_000]
    assert time.monotonic() - started < 10  # quadratic would take minutes


def test_models_written_before_streaming_are_told_apart() -> None:
    class Old:
        def complete(self, request: ModelRequest, *, should_stop: object = None) -> None: ...

    class Wide:
        def complete(self, request: ModelRequest, **options: object) -> None: ...

    assert not takes_text(Old())
    assert takes_text(Wide())
    assert takes_text(client("http://127.0.0.1:9/v1"))


# --- through the router ------------------------------------------------------------------------


def test_a_route_that_fails_mid_reply_hands_over_to_the_next_with_a_restart(
    server: Callable[..., ModelServer], tmp_path: Path
) -> None:
    first = server(Reply("the first route's reply, cut", drop_after=2))
    second = server(Reply(ANSWER))
    routes = [ModelRoute("a", url=first.url, model="m"), ModelRoute("b", url=second.url, model="m")]
    clients: dict[str, ModelClient] = {}

    def client_of(route: ModelRoute) -> ModelClient:
        return clients.setdefault(route.name, client(route.url, retries=0))

    pieces = Pieces()
    with RedisServer(tmp_path) as redis:
        limits = RouteLimits(RunStore(redis.url, "t:").connection)
        router = ModelRouter(
            routes, limits, client_of, key_concurrency=None, lease_ms=10_000, clock=now_ms
        )
        routed = run_blocking(
            router.complete(REQUEST, key="k", holder="run|1", tokens=100, on_text=pieces)
        )
    for made in clients.values():
        run_blocking(made.aclose())
    assert routed.route.name == "b"
    restart = pieces.seen.index(RESTART)
    assert "".join(pieces.seen[:restart]) == "the firs"  # the first route's two pieces
    assert pieces.last_start() == ANSWER == routed.reply.text


# --- wire.complete: any model, on the loop -----------------------------------------------------


class SyncModel:
    """A model written without asyncio: it streams from whatever thread runs it."""

    def __init__(self) -> None:
        self.ran_on: threading.Thread | None = None

    def complete(
        self,
        request: ModelRequest,
        *,
        should_stop: Callable[[], bool] | None = None,
        on_text: Callable[[str], None] | None = None,
    ) -> ModelReply:
        del request, should_stop
        self.ran_on = threading.current_thread()
        for piece in ("one ", "two ", "three"):
            assert on_text is not None
            on_text(piece)
        return ModelReply(text="one two three")


class AsyncModel:
    """A model written for the loop: it holds no thread while it waits."""

    def __init__(self) -> None:
        self.ran_on: threading.Thread | None = None

    async def complete(
        self,
        request: ModelRequest,
        *,
        should_stop: Callable[[], bool] | None = None,
        on_text: Callable[[str], None] | None = None,
    ) -> ModelReply:
        del request, should_stop
        self.ran_on = threading.current_thread()
        await asyncio.sleep(0.01)
        assert on_text is not None
        on_text("whole")
        return ModelReply(text="whole")


def _streamed(model: Model) -> tuple[ModelReply, list[tuple[str, threading.Thread]]]:
    """The reply of `model` through `wire.complete` on the process's loop, and each piece
    with the thread `on_text` was called on."""
    seen: list[tuple[str, threading.Thread]] = []

    def on_text(piece: str) -> None:
        seen.append((piece, threading.current_thread()))

    return run_blocking(complete(model, REQUEST, on_text=on_text)), seen


def test_a_sync_model_runs_in_a_thread_and_its_text_reaches_the_loop_thread() -> None:
    model = SyncModel()
    reply, seen = _streamed(model)
    loop_thread = process_loop().thread
    assert model.ran_on is not None
    assert model.ran_on is not loop_thread  # (it would hold every other call meanwhile)
    # Every piece was handed over on the loop, in order, before the reply came back.
    assert seen == [("one ", loop_thread), ("two ", loop_thread), ("three", loop_thread)]
    assert reply.text == "one two three"


def test_an_async_model_is_awaited_on_the_loop_thread() -> None:
    model = AsyncModel()
    reply, seen = _streamed(model)
    loop_thread = process_loop().thread
    assert model.ran_on is loop_thread
    assert seen == [("whole", loop_thread)]
    assert reply.text == "whole"


def test_a_model_written_before_streaming_gets_no_on_text_sync_or_async() -> None:
    class Old:
        def complete(self, request: ModelRequest, *, should_stop: object = None) -> ModelReply:
            del request, should_stop
            return ModelReply(text="old")

    class OldAsync:
        async def complete(
            self, request: ModelRequest, *, should_stop: object = None
        ) -> ModelReply:
            del request, should_stop
            return ModelReply(text="old, async")

    # (Not `Model`s to a type checker, which is why `takes_text` asks at run time.)
    assert _streamed(cast("Model", Old())) == (ModelReply(text="old"), [])
    assert _streamed(cast("Model", OldAsync())) == (ModelReply(text="old, async"), [])


def test_a_sync_models_pieces_after_its_call_was_cancelled_are_dropped() -> None:
    written = threading.Event()
    release = threading.Event()

    class Lingering:
        def complete(
            self,
            request: ModelRequest,
            *,
            should_stop: Callable[[], bool] | None = None,
            on_text: Callable[[str], None] | None = None,
        ) -> ModelReply:
            del request, should_stop
            assert on_text is not None
            on_text("before")
            written.set()
            release.wait(10)  # its call is cancelled meanwhile; the thread goes on
            on_text("after")
            return ModelReply(text="before after")

    seen: list[str] = []

    async def cancelled() -> None:
        call = asyncio.ensure_future(complete(Lingering(), REQUEST, on_text=seen.append))
        await asyncio.to_thread(written.wait, 10)
        await asyncio.sleep(0.05)  # "before" reaches the loop
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        release.set()
        await asyncio.sleep(0.2)  # "after" would have reached the loop by now

    run_blocking(cancelled())
    assert seen == ["before"]
