"""A real OpenAI-compatible chat completions server on loopback, for tests and benchmarks.

It plays scripted replies, latency and faults:

    with ModelServer(scripted(Reply(status=500), "hello")) as server:
        client = ModelClient(ModelSettings(url=server.url))
        ...
        assert len(server.calls) == 2

A call that asks for a stream (`"stream": true`) gets one, as server-sent events
over a chunked body: the text in pieces of `Reply.piece_chars`, `Reply.gap`
seconds apart, then the finish reason, the usage (if asked for) and `[DONE]`.
`Reply.sse` sends raw event bytes instead, chunk by chunk (a chunk cut inside a
UTF-8 character or an escape, a stream with no `[DONE]`); `Reply.endless`
streams until the client goes away. `ModelServer(..., streams=False)` answers
every call with a plain body (a server that cannot stream), `refuse_streams=True`
answers a stream request with a 400 (one that refuses the parameter), and
`refuse_fields=("tools",)` answers a request carrying any of those fields with a 400
(or `refuse_status`) naming it (a server without JSON schemas or function calling).
`Reply.tool_calls` answers with function calls (`message.tool_calls`; streamed, each
call's name first, then its arguments in pieces of `piece_chars`).

The server runs in a background thread of the test process (one handler thread
per connection, HTTP/1.1 keep-alive), binds only 127.0.0.1 on a free port, and
on `stop()` releases handlers that hang or wait, closes every connection and
joins every thread. A responder that raises answers 500 and the error is raised
again when the `with` block ends, so a broken script cannot pass for a server fault.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import json
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

__all__ = ["ChatCall", "ModelServer", "Reply", "Responder", "refusing_url", "scripted"]

CHAT_PATH = "/v1/chat/completions"


@dataclass(frozen=True)
class ChatCall:
    """One chat completions request the server received."""

    system: str
    prompt: str
    """The user message's text (its text parts joined by newlines)."""
    body: dict[str, Any]
    headers: dict[str, str]
    """Request headers, names lower-cased."""
    at: float
    """time.monotonic() when it arrived."""
    port: int = 0
    """The client's port: calls on one kept-alive connection share it."""

    @property
    def image_urls(self) -> list[str]:
        """The `image_url.url` of every image part of the user message."""
        return [
            part["image_url"]["url"]
            for part in _user_parts(self.body)
            if part.get("type") == "image_url"
        ]


@dataclass(frozen=True)
class Reply:
    """What to answer one call with.

    `usage` defaults to counts that follow from the lengths of the texts.
    `hang` never answers (until the server stops); `close` drops the connection
    without an answer; `raw_body` is sent as is instead of the JSON the server builds;
    `trickle` sends the body one byte at a time, that many seconds apart (the
    headers, with the whole length, go at once). Streamed (when the call asks for a
    stream): `piece_chars` characters an event, `gap` seconds between events;
    `sse` raw event bytes sent as given, one chunk each; `endless` more text until
    the client hangs up; `done=False` leaves out `[DONE]`; `drop_after` ends the
    body after that many text events (no finish reason, no `[DONE]`).
    """

    text: str = ""
    status: int = 200
    delay: float = 0.0
    headers: dict[str, str] = field(default_factory=dict)
    raw_body: bytes | None = None
    usage: tuple[int, int] | None = None
    hang: bool = False
    close: bool = False
    cached: int = 0
    """Prompt tokens reported as served from the server's cache."""
    model: str = ""
    """The model name the reply reports (default: the one asked for)."""
    trickle: float = 0.0
    piece_chars: int = 4
    gap: float = 0.0
    sse: tuple[bytes, ...] | None = None
    endless: bool = False
    done: bool = True
    drop_after: int | None = None
    tool_calls: Any = None
    """`message.tool_calls` as sent (None: none); a list of well-formed calls is streamed
    in pieces, anything else in one delta as it is."""


Responder = Callable[[ChatCall], "Reply | str"]


def scripted(*replies: Reply | str) -> Responder:
    """Return a responder that plays `replies` in order, one per call, and fails after them."""
    script = iter(replies)
    lock = threading.Lock()

    def respond(call: ChatCall) -> Reply | str:
        with lock:
            reply = next(script, None)
        if reply is None:
            raise AssertionError(f"the script had {len(replies)} replies; another call came")
        return reply

    return respond


@contextmanager
def refusing_url() -> Iterator[str]:
    """Yield a base URL on loopback whose port refuses connections while the block runs.

    The port is bound but not listening, so nobody else can take it meanwhile.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/v1"


class ModelServer:
    """An OpenAI-compatible server on 127.0.0.1; use it as a context manager."""

    def __init__(
        self,
        responder: Responder,
        *,
        streams: bool = True,
        refuse_streams: bool = False,
        refuse_fields: tuple[str, ...] = (),
        refuse_status: int = 400,
    ) -> None:
        self._responder = responder
        self.streams = streams
        """Whether a call that asks for a stream gets one."""
        self.refuse_streams = refuse_streams
        """Whether a call that asks for a stream is refused with a 400."""
        self.refuse_fields = refuse_fields
        """Body fields a call is refused for (with `refuse_status`, the field named)."""
        self.refuse_status = refuse_status
        self._first_events: list[float] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._calls: list[ChatCall] = []
        self._errors: list[BaseException] = []
        self._usage = (0, 0)
        self._billed: list[tuple[str, int, int]] = []
        self._connections: set[socket.socket] = set()
        self._accepted = 0
        self._ids = itertools.count(1)
        self._rate: tuple[int, float] | None = None
        self._served: collections.deque[float] = collections.deque()
        self._failing: int | None = None
        self.refused = 0
        """Calls answered 429 because they passed the server's own rate limit."""
        self.failed = 0
        """Calls answered with the status of `fail_with`."""
        self.delaying = 0
        """Calls waiting out their reply's `delay` now."""
        self.most_delaying = 0
        """The most calls that waited out their `delay` at once (calls in flight)."""
        self._httpd = _Server(("127.0.0.1", 0), _Handler)
        self._httpd.owner = self
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.01},
            name="model-server",
            daemon=True,
        )
        port = self._httpd.server_address[1]
        self.url = f"http://127.0.0.1:{port}/v1"
        self.chat_url = f"http://127.0.0.1:{port}{CHAT_PATH}"

    # --- life cycle ---

    def start(self) -> ModelServer:
        """Start serving in a background thread; return self."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Release waiting handlers, close every connection, join every thread."""
        with self._lock:
            self._stopping.set()
            connections = list(self._connections)
        if self._thread.is_alive():
            self._httpd.shutdown()
            self._thread.join()
        for connection in connections:
            _drop(connection)  # wakes handlers blocked reading a kept-alive connection
        self._httpd.server_close()  # closes the listening socket and joins handler threads

    def __enter__(self) -> ModelServer:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
        if error is None and self._errors:
            raise AssertionError("the responder failed") from self._errors[0]

    def _delay(self, seconds: float) -> bool:
        """Wait out a reply's delay, counted among the calls in flight; True if the server
        is stopping."""
        with self._lock:
            self.delaying += 1
            self.most_delaying = max(self.most_delaying, self.delaying)
        try:
            return self._stopping.wait(seconds)
        finally:
            with self._lock:
                self.delaying -= 1

    # --- limits and faults a test turns on ---

    def limit_rate(self, calls: int | None, per_seconds: float = 60.0) -> None:
        """Answer 429 (with Retry-After) to a call past `calls` in any `per_seconds`, as
        a provider does (None: no limit)."""
        with self._lock:
            self._rate = None if calls is None else (calls, per_seconds)

    def fail_with(self, status: int | None) -> None:
        """Answer every call with `status` (None: answer again as scripted)."""
        with self._lock:
            self._failing = status

    def _unsupported(self, call: ChatCall) -> tuple[int, str] | None:
        """The status and message refusing a call that asks for what this server does not
        take (a stream, a field), or None."""
        if call.body.get("stream") is True and self.refuse_streams:
            return 400, "stream is not supported by this server"
        named = next((name for name in self.refuse_fields if name in call.body), None)
        if named is None:
            return None
        with self._lock:
            self._calls.append(call)  # what it was sent is what a test looks at
        return self.refuse_status, f"{named} is not supported by this server"

    def _refusal(self) -> tuple[int, dict[str, str]] | None:
        """The status (and headers) a call gets before its script is asked, or None."""
        now = time.monotonic()
        with self._lock:
            if self._failing is not None:
                self.failed += 1
                return self._failing, {}
            if self._rate is None:
                return None
            calls, window = self._rate
            while self._served and self._served[0] <= now - window:
                self._served.popleft()
            if len(self._served) >= calls:
                self.refused += 1
                wait = max(self._served[0] + window - now, 0.05)
                return 429, {"Retry-After": f"{wait:.2f}"}
            self._served.append(now)
        return None

    # --- what tests look at ---

    @property
    def calls(self) -> list[ChatCall]:
        """A copy of the calls received so far, in order of arrival."""
        with self._lock:
            return list(self._calls)

    @property
    def errors(self) -> list[BaseException]:
        """Exceptions the responder raised (each answered with a 500)."""
        with self._lock:
            return list(self._errors)

    @property
    def open_connections(self) -> int:
        """Connections a client holds open now (a reply being streamed, or kept alive)."""
        with self._lock:
            return len(self._connections)

    @property
    def accepted_connections(self) -> int:
        """Connections a client has opened to the server so far (reused ones count once)."""
        with self._lock:
            return self._accepted

    def billed(self, marker: str = "") -> list[tuple[int, int]]:
        """(prompt, completion) tokens of every completed call whose task (the prompt's
        first section) holds `marker`, in order."""
        with self._lock:
            billed = list(self._billed)
        return [(p, c) for prompt, p, c in billed if marker in prompt.split("\n\n", 1)[0]]

    def usage_total(self) -> tuple[int, int]:
        """(prompt, completion) tokens summed over the 200 replies the server built."""
        with self._lock:
            return self._usage

    @property
    def first_events(self) -> list[float]:
        """time.monotonic() just before the first text event of each streamed reply was
        written, in order."""
        with self._lock:
            return list(self._first_events)

    def set_responder(self, responder: Responder) -> None:
        """Answer the calls from now on with `responder`."""
        with self._lock:
            self._responder = responder

    # --- used by the handler threads ---

    def _track(self, connection: socket.socket) -> None:
        with self._lock:
            if self._stopping.is_set():
                _drop(connection)
            else:
                self._connections.add(connection)
                self._accepted += 1

    def _untrack(self, connection: socket.socket) -> None:
        with self._lock:
            self._connections.discard(connection)

    def _reply_to(self, call: ChatCall) -> Reply:
        with self._lock:
            self._calls.append(call)
            responder = self._responder
        try:
            reply = responder(call)
        except Exception as error:  # noqa: BLE001 - reported when the block ends
            with self._lock:
                self._errors.append(error)
            return Reply(text=f"responder failed: {error!r}", status=500)
        return Reply(text=reply) if isinstance(reply, str) else reply

    def _settle(self, call: ChatCall, reply: Reply) -> tuple[str, str, tuple[int, int]]:
        """The reply's text, finish reason and usage, as billed."""
        text, finish = reply.text, "stop"
        usage = reply.usage or (len(call.system + call.prompt) // 4 + 1, len(text) // 4 + 1)
        cap = call.body.get("max_tokens")
        if isinstance(cap, int) and cap > 0 and usage[1] > cap:
            # As a real server does: the reply is cut at max_tokens.
            text, finish, usage = text[: cap * 4], "length", (usage[0], cap)
        with self._lock:
            self._usage = (self._usage[0] + usage[0], self._usage[1] + usage[1])
            self._billed.append((call.prompt, usage[0], usage[1]))
        return text, finish, usage

    def _usage_json(self, reply: Reply, usage: tuple[int, int]) -> dict[str, Any]:
        details = {"prompt_tokens_details": {"cached_tokens": reply.cached}} if reply.cached else {}
        return {
            "prompt_tokens": usage[0],
            "completion_tokens": usage[1],
            "total_tokens": usage[0] + usage[1],
            **details,
        }

    def _completion(self, call: ChatCall, reply: Reply) -> bytes:
        text, finish, usage = self._settle(call, reply)
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if reply.tool_calls is not None:
            message = message | {"content": text or None, "tool_calls": reply.tool_calls}
            finish = "tool_calls" if finish == "stop" else finish
        return _json(
            {
                "id": f"chatcmpl-{next(self._ids)}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": reply.model or call.body.get("model", ""),
                "choices": [
                    {
                        "index": 0,
                        "message": message,
                        "finish_reason": finish,
                    }
                ],
                "usage": self._usage_json(reply, usage),
            }
        )

    def _events(self, call: ChatCall, reply: Reply) -> Iterator[bytes]:
        """The server-sent events of a streamed reply, one at a time."""
        if reply.sse is not None:
            yield from reply.sse
            return
        text, finish, usage = self._settle(call, reply)
        head = {
            "id": f"chatcmpl-{next(self._ids)}",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": reply.model or call.body.get("model", ""),
        }

        def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
            choice = {"index": 0, "delta": delta, "finish_reason": finish}
            return _event(head | {"choices": [choice]})

        yield chunk({"role": "assistant", "content": ""})
        size = max(1, reply.piece_chars)
        pieces: Iterator[str] = (text[i : i + size] for i in range(0, len(text), size))
        if reply.endless:
            pieces = itertools.chain(pieces, itertools.repeat("more "))
        for index, piece in enumerate(pieces):
            if index == reply.drop_after:
                return
            if index == 0:
                with self._lock:
                    self._first_events.append(time.monotonic())
            yield chunk({"content": piece})
        if reply.tool_calls is not None:
            yield from (chunk({"tool_calls": delta}) for delta in _call_deltas(reply))
            finish = "tool_calls" if finish == "stop" else finish
        yield chunk({}, finish)
        options = call.body.get("stream_options")
        if isinstance(options, dict) and options.get("include_usage"):
            yield _event(head | {"choices": [], "usage": self._usage_json(reply, usage)})
        if reply.done:
            yield b"data: [DONE]\n\n"


class _Server(ThreadingHTTPServer):
    owner: ModelServer
    # server_close() joins handler threads, but only those that are not daemons;
    # stop() wakes every handler first, so joining them cannot hang.
    daemon_threads = False
    block_on_close = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Stay quiet when a client went away first (it timed out, or the server stopped)."""
        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as a real server
    disable_nagle_algorithm = True  # headers and body go out in two writes
    server: _Server

    def setup(self) -> None:
        super().setup()
        self.server.owner._track(self.connection)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.owner._untrack(self.connection)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
        """Keep the test output quiet."""

    def do_GET(self) -> None:
        self._send(404, _error_body("not found"))

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path.partition("?")[0].rstrip("/") != CHAT_PATH:  # a query (?api-key=) is fine
            self._send(404, _error_body(f"no route for {self.path}"))
            return
        call = _parse_call(raw, self.headers.items(), self.client_address[1])
        if call is None:
            self._send(400, _error_body("the body is not a chat completions request"))
            return
        owner = self.server.owner
        asks_stream = call.body.get("stream") is True
        unsupported = owner._unsupported(call)
        if unsupported is not None:
            self._send(unsupported[0], _error_body(unsupported[1]))
            return
        refused = owner._refusal()
        if refused is not None:
            with owner._lock:
                owner._calls.append(call)
            self._send(refused[0], _error_body(_phrase(refused[0])), refused[1])
            return
        reply = owner._reply_to(call)
        stopped = owner._delay(reply.delay) if reply.delay > 0 else False
        if reply.hang:
            stopped = owner._stopping.wait()
        if stopped or reply.close:
            self.close_connection = True  # the handler ends; the socket closes unanswered
            return
        if reply.sse is not None or (
            asks_stream and owner.streams and reply.status == 200 and reply.raw_body is None
        ):
            self._stream(owner._events(call, reply), reply.gap)
            return
        if reply.raw_body is not None:
            body = reply.raw_body
        elif reply.status == 200:
            body = owner._completion(call, reply)
        else:
            body = _error_body(reply.text or _phrase(reply.status))
        self._send(reply.status, body, reply.headers, trickle=reply.trickle)

    def _send(
        self,
        status: int,
        body: bytes,
        headers: dict[str, str] | None = None,
        *,
        trickle: float = 0.0,
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        if trickle <= 0:
            self.wfile.write(body)
            return
        stopping = self.server.owner._stopping
        for index in range(len(body)):
            if index and stopping.wait(trickle):
                self.close_connection = True
                return
            self.wfile.write(body[index : index + 1])  # an OSError: the client hung up

    def _stream(self, events: Iterator[bytes], gap: float) -> None:
        """Send `events` as a chunked text/event-stream body, `gap` seconds apart."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        stopping = self.server.owner._stopping
        try:
            for index in itertools.count():
                if (index and gap > 0 and stopping.wait(gap)) or stopping.is_set():
                    self.close_connection = True
                    return
                event = next(events, None)  # made now, after the gap: its time is when it goes
                if event is None:
                    break
                if event:  # an empty chunk would end the body
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
            self.wfile.write(b"0\r\n\r\n")
        except OSError:  # the client hung up (it had enough, or it stopped)
            self.close_connection = True


def _call_deltas(reply: Reply) -> Iterator[list[Any]]:
    """The `delta.tool_calls` of a streamed reply's function calls: each call's name, then
    its arguments in pieces; calls that are not well formed, as they are, at once."""
    calls = reply.tool_calls
    well_formed = isinstance(calls, list) and all(
        isinstance(c, dict) and isinstance(c.get("function"), dict) for c in calls
    )
    if not well_formed:
        yield calls
        return
    size = max(1, reply.piece_chars)
    for index, entry in enumerate(calls):
        function = entry["function"]
        named = {"name": function.get("name"), "arguments": ""}
        yield [{"index": index, "id": f"call_{index}", "type": "function", "function": named}]
        arguments = str(function.get("arguments") or "")
        for start in range(0, len(arguments), size):
            piece = {"arguments": arguments[start : start + size]}
            yield [{"index": index, "function": piece}]


def _event(value: object) -> bytes:
    return b"data: " + _json(value) + b"\n\n"


def _parse_call(raw: bytes, headers: Any, port: int) -> ChatCall | None:
    try:
        body = json.loads(raw)
        messages = body["messages"]
        system = next((m["content"] for m in messages if m["role"] == "system"), "")
        parts = _user_parts(body)
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    prompt = "\n".join(part["text"] for part in parts if part.get("type") == "text")
    return ChatCall(
        system=system,
        prompt=prompt,
        body=body,
        headers={name.lower(): value for name, value in headers},
        at=time.monotonic(),
        port=port,
    )


def _user_parts(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The user message's content as a list of parts (a plain string is one text part)."""
    user = next(m for m in body["messages"] if m["role"] == "user")
    content = user["content"]
    return [{"type": "text", "text": content}] if isinstance(content, str) else list(content)


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return f"status {status}"


def _error_body(message: str) -> bytes:
    return _json({"error": {"message": message, "type": "scripted"}})


def _json(value: object) -> bytes:
    return json.dumps(value).encode("utf-8")


def _drop(connection: socket.socket) -> None:
    with contextlib.suppress(OSError):  # already closed by the other side
        connection.shutdown(socket.SHUT_RDWR)
