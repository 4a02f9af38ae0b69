"""The model client, against a real OpenAI-compatible server on loopback."""

from __future__ import annotations

import base64
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from datetime import UTC, datetime
from email.utils import format_datetime
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent_core.steps import Attachment, ModelRequest
from tests.support.clients import opened
from tests.support.model_server import (
    ChatCall,
    ModelServer,
    Reply,
    Responder,
    refusing_url,
    scripted,
)
from workers.engine.records import Usage
from workers.errors import ModelCallError
from workers.loop import run_blocking
from workers.model.transport import ModelClient
from workers.model.wire import (
    ModelReply,
    backoff_seconds,
    exhausted_wait,
    parse_duration,
    parse_retry_after,
)
from workers.settings import ModelSettings, chat_completions_url

KEY = "sk-test-0123456789-secret"
NOW = 1_700_000_000.0
REQUEST = ModelRequest(system="You are terse.", prompt="Say hi.")

Serve = Callable[..., ModelServer]


@pytest.fixture
def serve() -> Iterator[Serve]:
    """Start a ModelServer for a responder (or a script of replies); stop it after the test."""
    servers: list[ModelServer] = []

    def start(*script: Reply | str, responder: Responder | None = None) -> ModelServer:
        server = ModelServer(responder or scripted(*script)).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


class Recorder:
    """A client whose waits are recorded instead of slept; its calls are made on the
    process's loop, as a synchronous caller makes them."""

    def __init__(self, url: str, **settings: Any) -> None:
        self.sleeps: list[float] = []
        settings = {"read_timeout": 2.0, "connect_timeout": 2.0, "retries": 2} | settings
        self.client = ModelClient(
            ModelSettings(url=url, **settings),
            sleep=self.sleep,
            rand=lambda: 0.5,
            now=lambda: NOW,
        )

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)

    def complete(self, request: ModelRequest = REQUEST, **options: Any) -> ModelReply:
        return run_blocking(self.client.complete(request, **options))


@pytest.fixture
def connect() -> Iterator[Callable[..., Recorder]]:
    recorders: list[Recorder] = []

    def make(url: str, **settings: Any) -> Recorder:
        recorders.append(Recorder(url, **settings))
        return recorders[-1]

    yield make
    for recorder in recorders:
        run_blocking(recorder.client.aclose())


def failure(recorder: Recorder, **options: Any) -> ModelCallError:
    with pytest.raises(ModelCallError) as caught:
        recorder.complete(**options)
    return caught.value


# --- a normal call -------------------------------------------------------------


def test_a_reply_comes_back_with_its_usage(serve: Serve, connect: Callable[..., Recorder]) -> None:
    server = serve(Reply("Hi.", usage=(12, 3)))
    reply = connect(server.url, model="tiny").complete()
    assert reply == ModelReply(
        text="Hi.",
        usage=Usage(prompt_tokens=12, completion_tokens=3, total_tokens=15, model_calls=1),
        model="tiny",
        finish_reason="stop",
    )
    [call] = server.calls
    assert call.body == {
        "model": "tiny",
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Say hi."},
        ],
        "max_tokens": 4096,  # the reply's cap, which budgets reserve for
    }
    assert "authorization" not in call.headers
    assert server.usage_total() == (12, 3)


def test_the_key_is_sent_as_a_bearer_token(serve: Serve, connect: Callable[..., Recorder]) -> None:
    server = serve("ok")
    connect(server.chat_url, key=KEY).complete()
    assert server.calls[0].headers["authorization"] == f"Bearer {KEY}"


def test_calls_share_one_kept_alive_connection(
    serve: Serve, connect: Callable[..., Recorder]
) -> None:
    server = serve("one", "two", "three")
    recorder = connect(server.url)
    texts = [recorder.complete().text for _ in range(3)]
    assert texts == ["one", "two", "three"]
    assert len({call.port for call in server.calls}) == 1


def test_a_server_without_usage_counts_zero(serve: Serve, connect: Callable[..., Recorder]) -> None:
    body = b'{"choices": [{"message": {"role": "assistant", "content": "ok"}}]}'
    server = serve(Reply(raw_body=body))
    assert connect(server.url).complete() == ModelReply(text="ok", usage=Usage())


def test_usage_adds_up() -> None:
    total = Usage(prompt_tokens=1, completion_tokens=2, total_tokens=3) + Usage(
        prompt_tokens=10, completion_tokens=20, total_tokens=30
    )
    assert total == Usage(prompt_tokens=11, completion_tokens=22, total_tokens=33)


# --- attachments -----------------------------------------------------------------


def test_an_image_attachment_is_an_image_part(
    serve: Serve, connect: Callable[..., Recorder]
) -> None:
    server = serve("a cat")
    png = b"\x89PNG\r\n\x1a\nfake"
    request = ModelRequest(
        system="s", prompt="What is this?", attachments=(Attachment("cat.png", "image/png", png),)
    )
    assert connect(server.url).complete(request).text == "a cat"
    [call] = server.calls
    parts = call.body["messages"][1]["content"]
    assert parts[0] == {"type": "text", "text": "What is this?"}
    assert call.image_urls == ["data:image/png;base64," + base64.b64encode(png).decode()]
    assert call.prompt == "What is this?"


def test_other_attachments_are_text_parts(serve: Serve, connect: Callable[..., Recorder]) -> None:
    server = serve("ok")
    attachments = (
        Attachment("notes.txt", "text/plain", "café notes".encode()),
        Attachment("blob.bin", "application/octet-stream", b"\xff\xfe\x00"),
        Attachment("long.csv", "text/csv", b"x" * 5000),
    )
    request = ModelRequest(system="s", prompt="Read these.", attachments=attachments)
    connect(server.url, attachment_chars=100).complete(request)
    parts = server.calls[0].body["messages"][1]["content"]
    assert [part["type"] for part in parts] == ["text"] * 4
    assert parts[1]["text"] == "Attached file notes.txt (text/plain):\ncafé notes"
    assert parts[2]["text"] == (
        "Attached file blob.bin (application/octet-stream, 3 bytes): binary, not shown."
    )
    assert parts[3]["text"].startswith("Attached file long.csv (text/csv):\nxxx")
    assert "cut" in parts[3]["text"]
    assert len(parts[3]["text"]) < 200


# --- transient failures: retried -------------------------------------------------


def test_a_500_then_success(serve: Serve, connect: Callable[..., Recorder]) -> None:
    server = serve(Reply(status=500), "recovered")
    recorder = connect(server.url)
    assert recorder.complete().text == "recovered"
    assert len(server.calls) == 2
    assert recorder.sleeps == [backoff_seconds(0, None, 0.5, 30.0, 0.5)]


def test_a_dropped_connection_then_success(serve: Serve, connect: Callable[..., Recorder]) -> None:
    server = serve(Reply(close=True), "recovered")
    assert connect(server.url).complete().text == "recovered"
    assert len(server.calls) == 2


@pytest.mark.parametrize(
    ("retry_after", "waited"),
    [
        ("3", 3.0),
        ("1.5", 1.5),
        (format_datetime(datetime.fromtimestamp(NOW + 7, UTC), usegmt=True), 7.0),
        ("3600", 30.0),  # capped at backoff_cap
        ("soon", 0.25),  # unusable: our own backoff (0.5 * rand 0.5)
    ],
)
def test_a_429_retry_after_is_honoured(
    serve: Serve, connect: Callable[..., Recorder], retry_after: str, waited: float
) -> None:
    server = serve(Reply(status=429, headers={"Retry-After": retry_after}), "ok")
    recorder = connect(server.url)
    assert recorder.complete().text == "ok"
    assert recorder.sleeps == [pytest.approx(waited)]


def test_a_hang_past_the_read_timeout_is_retried_then_fails(
    serve: Serve, connect: Callable[..., Recorder]
) -> None:
    server = serve(responder=lambda _call: Reply(hang=True))
    error = failure(connect(server.url, read_timeout=0.2, retries=1))
    assert error.retryable
    assert error.status is None
    assert "gave up after 2 attempts" in error.message
    assert "ReadTimeout talking to 127.0.0.1:" in error.message
    assert error.message.endswith("(limit 0.2 s)")
    assert len(server.calls) == 2


def test_latency_within_the_timeout_is_fine(serve: Serve, connect: Callable[..., Recorder]) -> None:
    server = serve(Reply("slow", delay=0.3), "fast")
    recorder = connect(server.url, read_timeout=0.1, retries=1)
    assert recorder.complete().text == "fast"  # the slow one timed out and was retried
    recorder = connect(server.url, read_timeout=2.0)
    server.set_responder(lambda _call: Reply("slow", delay=0.3))
    assert recorder.complete().text == "slow"


def test_a_refused_connection_is_retried_then_fails(connect: Callable[..., Recorder]) -> None:
    with refusing_url() as url:
        recorder = connect(url, retries=3)
        error = failure(recorder)
    assert error.retryable
    assert "could not connect to 127.0.0.1:" in error.message
    assert "gave up after 4 attempts" in error.message
    assert len(recorder.sleeps) == 3


def test_5xx_until_the_retries_are_spent(serve: Serve, connect: Callable[..., Recorder]) -> None:
    server = serve(responder=lambda _call: Reply("overloaded, try later", status=503))
    recorder = connect(server.url, retries=2)
    error = failure(recorder)
    assert (error.retryable, error.status) == (True, 503)
    assert error.message == (
        "model call gave up after 3 attempts: "
        "model server answered 503 Service Unavailable: overloaded, try later"
    )
    assert len(server.calls) == 3
    assert len(recorder.sleeps) == 2


def test_should_stop_ends_the_retries(serve: Serve, connect: Callable[..., Recorder]) -> None:
    server = serve(responder=lambda _call: Reply(status=500))
    recorder = connect(server.url, retries=5)
    error = failure(recorder, should_stop=lambda: True)
    assert "stopped after 1 attempt of 6" in error.message
    assert len(server.calls) == 1
    assert recorder.sleeps == []


def test_should_stop_is_asked_again_after_the_wait(
    serve: Serve, connect: Callable[..., Recorder]
) -> None:
    server = serve(responder=lambda _call: Reply(status=500))
    recorder = connect(server.url, retries=5)
    error = failure(recorder, should_stop=lambda: len(recorder.sleeps) > 0)  # stop once it waited
    assert "stopped after 1 attempt of 6" in error.message
    assert len(server.calls) == 1
    assert len(recorder.sleeps) == 1


# --- the deadline of a whole call, and stopping mid-reply --------------------------------

TRICKLE = Reply("x" * 400, trickle=0.05)
"""About 20 s to send, a byte every 50 ms: never silent for long enough to time out."""


def test_a_trickling_reply_is_cut_at_the_deadline(
    serve: Serve, connect: Callable[..., Recorder]
) -> None:
    server = serve(responder=lambda _call: TRICKLE)
    started = time.monotonic()
    error = failure(connect(server.url, read_timeout=5, deadline=0.5))
    took = time.monotonic() - started
    assert error.message == (
        "model call passed its deadline of 0.5 s after 1 attempt: the reply was still coming in"
    )
    assert error.retryable
    assert took < 5, took  # not the 20 s the reply takes
    assert len(server.calls) == 1  # no time left for another attempt


def test_should_stop_is_asked_while_the_reply_comes_in(
    serve: Serve, connect: Callable[..., Recorder]
) -> None:
    server = serve(responder=lambda _call: TRICKLE)
    stop_at = time.monotonic() + 0.3
    error = failure(
        connect(server.url, read_timeout=5), should_stop=lambda: time.monotonic() > stop_at
    )
    took = time.monotonic() - stop_at
    assert error.message == (
        "model call stopped after 1 attempt of 3: told to stop while the reply came in"
    )
    assert not error.retryable
    assert took < 5, took
    assert len(server.calls) == 1


def test_the_deadline_spans_every_attempt(serve: Serve, connect: Callable[..., Recorder]) -> None:
    server = serve(responder=lambda _call: Reply(hang=True))
    started = time.monotonic()
    error = failure(connect(server.url, read_timeout=0.3, retries=30, deadline=1.0))
    took = time.monotonic() - started
    assert error.message.startswith("model call passed its deadline of 1 s after ")
    assert "ReadTimeout talking to 127.0.0.1:" in error.message
    assert took < 5, took  # 31 attempts of 0.3 s would take 9 s
    assert 2 <= len(server.calls) < 31


def test_a_wait_that_would_pass_the_deadline_is_not_waited(
    serve: Serve, connect: Callable[..., Recorder]
) -> None:
    server = serve(Reply(status=429, headers={"Retry-After": "20"}), "too late")
    recorder = connect(server.url, deadline=5)
    error = failure(recorder)
    assert error.message == (
        "model call passed its deadline of 5 s after 1 attempt:"
        " model server answered 429 Too Many Requests"
    )
    assert recorder.sleeps == []
    assert len(server.calls) == 1


# --- permanent failures: not retried ---------------------------------------------


def test_a_400_carries_the_servers_message(serve: Serve, connect: Callable[..., Recorder]) -> None:
    server = serve(Reply("model 'gpt-9' does not exist", status=400))
    recorder = connect(server.url)
    error = failure(recorder)
    assert (error.retryable, error.status) == (False, 400)
    assert error.message == "model server answered 400 Bad Request: model 'gpt-9' does not exist"
    assert len(server.calls) == 1
    assert recorder.sleeps == []


@pytest.mark.parametrize(
    ("body", "said"),
    [
        (b'{"error": "plain string error"}', "plain string error"),
        (b"<html>\n  <b>Forbidden</b>\n</html>", "<html> <b>Forbidden</b> </html>"),
        (b"", ""),
    ],
)
def test_a_4xx_without_an_error_message_shows_the_body(
    serve: Serve, connect: Callable[..., Recorder], body: bytes, said: str
) -> None:
    server = serve(Reply(status=403, raw_body=body))
    error = failure(connect(server.url))
    assert error.message == "model server answered 403 Forbidden" + (f": {said}" if said else "")


def test_a_long_server_message_is_cut(serve: Serve, connect: Callable[..., Recorder]) -> None:
    server = serve(Reply("x" * 5000, status=422))
    error = failure(connect(server.url))
    assert 500 <= len(error.message) < 600


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (b"<html>502 Bad Gateway</html>", "the body is not JSON: '<html>502 Bad Gateway</html>'"),
        (b"\xff\xfe garbage", "the body is not JSON"),
        (b"[1, 2]", "the reply has no choices"),
        (b"[" * 100_000, "the body is not JSON"),
        (b'{"choices": []}', "the reply has no choices"),
        (b'{"choices": ["text"]}', "choices[0].message.content is not text (missing)"),
        (b'{"choices": [{"message": {"content": null}}]}', "content is not text (missing)"),
        (b'{"choices": [{"message": {"content": ["a"]}}]}', "content is not text (list)"),
        (
            b'{"choices": [{"message": {"content": "ok"}}], "usage": {"prompt_tokens": -1}}',
            "the reply's usage is not whole numbers >= 0",
        ),
        (
            b'{"choices": [{"message": {"content": "ok"}}], "usage": {"total_tokens": "9"}}',
            "the reply's usage is not whole numbers >= 0",
        ),
    ],
)
def test_an_unusable_body_is_a_clear_failure(
    serve: Serve, connect: Callable[..., Recorder], body: bytes, problem: str
) -> None:
    server = serve(Reply(raw_body=body))
    recorder = connect(server.url)
    error = failure(recorder)
    assert (error.retryable, error.status) == (False, 200)
    assert error.message.startswith("unusable reply from the model server: ")
    assert problem in error.message
    assert len(server.calls) == 1  # the agent's own retry budget decides whether to re-ask


def test_a_body_past_the_size_cap_is_refused(
    serve: Serve, connect: Callable[..., Recorder]
) -> None:
    server = serve(Reply(raw_body=b'{"choices": "' + b"x" * 5000 + b'"}'))
    error = failure(connect(server.url, max_body_bytes=1000))
    assert error.message == "the model server's reply is larger than 1000 bytes"
    assert not error.retryable


@contextmanager
def unlengthed_body(piece: bytes, pieces: int, gap: float) -> Iterator[tuple[str, list[int]]]:
    """A loopback server that answers one call with a 200 of no declared length (chunked,
    not an event stream): `pieces` pieces, `gap` seconds apart, until the client hangs
    up. Yields its URL and a list that grows by one for each piece sent."""
    sent: list[int] = []
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(10)

    def answer() -> None:
        connection, _ = listener.accept()
        with connection:
            connection.recv(65536)  # (the call; what it asks does not matter)
            head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            connection.sendall(head + b"Transfer-Encoding: chunked\r\n\r\n")
            with suppress(OSError):  # the client hung up
                for _ in range(pieces):
                    connection.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
                    sent.append(1)
                    time.sleep(gap)
                connection.sendall(b"0\r\n\r\n")

    answering = threading.Thread(target=answer)
    answering.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/v1", sent
    finally:
        answering.join(15)
        listener.close()


def test_a_body_of_no_declared_length_past_the_size_cap_is_cut_off() -> None:
    with unlengthed_body(b"x" * 400, 100, 0.05) as (url, sent):
        settings = ModelSettings(url=url, max_body_bytes=1000, retries=0)
        with opened(ModelClient(settings)) as client, pytest.raises(ModelCallError) as caught:
            run_blocking(client.complete(REQUEST))
    assert "larger than 1000 bytes" in caught.value.message
    assert len(sent) < 50  # it stopped reading, and hung up, long before the body's end


# --- the key stays secret ------------------------------------------------------------


@pytest.mark.parametrize(
    "reply",
    [
        Reply(f"Incorrect API key provided: {KEY}", status=401),
        Reply(f"upstream rejected {KEY}", status=500),
        Reply(raw_body=f"<html>bad key {KEY}</html>".encode()),
    ],
)
def test_the_key_is_in_no_error_or_log(
    serve: Serve,
    connect: Callable[..., Recorder],
    caplog: pytest.LogCaptureFixture,
    reply: Reply,
) -> None:
    server = serve(responder=lambda _call: reply)
    with caplog.at_level(logging.DEBUG):
        error = failure(connect(server.url, key=KEY, retries=1))
    assert "***" in error.message
    for text in (str(error), repr(error), error.message, repr(error.args), caplog.text):
        assert KEY not in text


def test_secrets_in_the_urls_query_are_in_no_error(
    serve: Serve, connect: Callable[..., Recorder], caplog: pytest.LogCaptureFixture
) -> None:
    sent = "hunter2%2Fquery%2Bkey"
    said = f"bad api-key hunter2/query+key (sent as {sent})"
    server = serve(responder=lambda _call: Reply(said, status=500))
    with caplog.at_level(logging.DEBUG):
        error = failure(connect(f"{server.url}?api-version=1&api-key={sent}", retries=1))
    assert error.message.endswith("bad api-key *** (sent as ***)")
    for text in (str(error), repr(error), caplog.text):
        assert "hunter2" not in text


def test_the_key_is_not_in_a_connection_failure(connect: Callable[..., Recorder]) -> None:
    with refusing_url() as url:
        error = failure(connect(url, key=KEY, retries=0))
    assert KEY not in str(error)
    assert error.__suppress_context__


def test_model_settings_hide_the_key() -> None:
    settings = ModelSettings(url="http://h/v1", key=KEY)
    assert KEY not in repr(settings)
    assert KEY not in str(settings)


# --- pure parts ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "endpoint"),
    [
        ("http://localhost:11434/v1", "http://localhost:11434/v1/chat/completions"),
        (
            "http://localhost:11434/v1/chat/completions",
            "http://localhost:11434/v1/chat/completions",
        ),
        ("https://h/openai/v1/?a=1", "https://h/openai/v1/chat/completions?a=1"),
    ],
)
def test_chat_completions_url(url: str, endpoint: str) -> None:
    assert chat_completions_url(url) == endpoint
    assert chat_completions_url(endpoint) == endpoint
    assert ModelSettings(url=url).url == endpoint


@pytest.mark.parametrize(
    "url", ["", "localhost/v1", "unix:///sock", "http:///v1", "http://h:x/v1", "http://u:p@h/v1"]
)
def test_chat_completions_url_refuses(url: str) -> None:
    with pytest.raises(ValueError, match=r"^expected"):
        chat_completions_url(url)


@given(
    attempt=st.integers(min_value=0, max_value=1000),
    base=st.floats(min_value=0.01, max_value=10),
    cap=st.floats(min_value=0.01, max_value=600),
    rand=st.floats(min_value=0, max_value=1, exclude_max=True),
)
def test_backoff_without_retry_after_is_full_jitter(
    attempt: int, base: float, cap: float, rand: float
) -> None:
    delay = backoff_seconds(attempt, None, base, cap, rand)
    ceiling = min(cap, base * 2.0 ** min(attempt, 64))
    assert 0 <= delay <= ceiling
    assert delay == pytest.approx(ceiling * rand)


@given(
    attempt=st.integers(min_value=0, max_value=50),
    retry_after=st.floats(min_value=0, max_value=1e6),
    cap=st.floats(min_value=0.01, max_value=600),
    rand=st.floats(min_value=0, max_value=1, exclude_max=True),
)
def test_backoff_honours_retry_after_up_to_the_cap(
    attempt: int, retry_after: float, cap: float, rand: float
) -> None:
    delay = backoff_seconds(attempt, retry_after, 0.5, cap, rand)
    assert min(retry_after, cap) <= delay <= cap


def test_backoff_grows_then_stops_at_the_cap() -> None:
    ceilings = [backoff_seconds(attempt, None, 0.5, 10.0, 0.999999) for attempt in range(7)]
    assert ceilings == pytest.approx([0.5, 1, 2, 4, 8, 10, 10], rel=1e-3)
    assert backoff_seconds(3, None, 0.5, 10.0, 0.0) == 0.0


@pytest.mark.parametrize(
    ("header", "seconds"),
    [
        (None, None),
        ("0", 0.0),
        ("120", 120.0),
        (" 2.5 ", 2.5),
        ("-1", None),
        ("soon", None),
        ("Wed, 21 Oct 2015 07:28:00 GMT", 0.0),  # in the past: no wait
        (format_datetime(datetime.fromtimestamp(NOW + 90, UTC), usegmt=True), 90.0),
        ("Wed, 21 Oct 2015 07:28:00", None),  # a date without a zone
    ],
)
def test_parse_retry_after(header: str | None, seconds: float | None) -> None:
    assert parse_retry_after(header, NOW) == seconds


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("1m30s", 90.0),
        ("120ms", 0.12),
        ("6s", 6.0),
        ("0.5s", 0.5),
        ("1h2m3.5s", 3723.5),
        ("7", 7.0),
        ("", None),
        ("1m30", None),
        ("ms", None),
        ("-1s", None),
        ("1d", None),
        (None, None),
    ],
)
def test_a_rate_limit_reset_is_read_as_openai_writes_it(
    text: str | None, seconds: float | None
) -> None:
    assert parse_duration(text) == seconds


def test_only_a_spent_limit_pauses_a_route_that_answered() -> None:
    resets = {"x-ratelimit-reset-requests": "1s", "x-ratelimit-reset-tokens": "40s"}
    assert exhausted_wait(resets) is None  # nothing is spent yet
    assert exhausted_wait({**resets, "x-ratelimit-remaining-requests": "12"}) is None
    assert exhausted_wait({**resets, "x-ratelimit-remaining-tokens": "0"}) == 40.0
    assert exhausted_wait({**resets, "x-ratelimit-remaining-requests": "0"}) == 1.0


# --- the server itself stops cleanly -------------------------------------------


def test_the_server_stops_cleanly_with_hanging_calls_and_open_connections() -> None:
    before = set(threading.enumerate())
    server = ModelServer(lambda call: Reply(hang=True) if call.prompt == "hang" else "ok").start()
    kept_open = httpx.Client()  # leaves a kept-alive connection behind
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    assert kept_open.post(server.chat_url, json=body).status_code == 200
    errors: list[BaseException] = []

    def hang() -> None:
        try:
            httpx.post(
                server.chat_url,
                json=body | {"messages": [{"role": "user", "content": "hang"}]},
                timeout=10,
            )
        except httpx.HTTPError as error:
            errors.append(error)

    hanging = threading.Thread(target=hang)
    hanging.start()
    while len(server.calls) < 2:
        threading.Event().wait(0.01)
    server.stop()
    hanging.join(timeout=5)
    kept_open.close()
    assert not hanging.is_alive()
    assert [type(error) for error in errors] == [httpx.RemoteProtocolError]
    assert set(threading.enumerate()) <= before
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", int(server.url.split(":")[2].split("/")[0]))) != 0


def test_the_server_answers_non_200_in_the_openai_error_shape(serve: Serve) -> None:
    server = serve(Reply(status=418))
    response = httpx.post(server.chat_url, json={"messages": [{"role": "user", "content": "x"}]})
    assert response.status_code == 418
    assert response.json() == {"error": {"message": "I'm a Teapot", "type": "scripted"}}
    assert server.calls[0] == ChatCall(
        system="",
        prompt="x",
        body=server.calls[0].body,
        headers=server.calls[0].headers,
        at=server.calls[0].at,
        port=server.calls[0].port,
    )


def test_a_responder_that_fails_is_reported_when_the_block_ends() -> None:
    server = ModelServer(scripted()).start()
    response = httpx.post(server.chat_url, json={"messages": [{"role": "user", "content": "x"}]})
    assert response.status_code == 500
    assert [type(error) for error in server.errors] == [AssertionError]
    with pytest.raises(AssertionError, match="the responder failed"):
        server.__exit__(None, None, None)
