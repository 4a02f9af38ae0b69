"""The model client: one OpenAI-compatible chat completions call, with retries.

A call is a coroutine, made on the process's event loop (`workers.loop`, DESIGN
§10.1): one `ModelClient` per worker process holds one `aiohttp.ClientSession`, made
on that loop at its first call, which keeps the TCP (and TLS) connections alive
between calls, one per call in flight and no cap on them (the process's capacity
bounds its calls). A synchronous caller hands the coroutine to the loop and waits
(`workers.loop.run_blocking`). A call is `POST {url}` with a system and a user
message; image attachments go beside the prompt as image parts, other files as
text parts.

Given `on_text`, a call asks for a stream and hands over its text as it arrives
(`wire.StreamedReply`), what one read brought in one piece; while many replies
stream at once, each reply's reads are spaced (`_Reads`), so a read brings several
pieces. A plain answer is handed over whole, a server that refuses `stream` (400,
422) is asked plainly from then on, and a retry after text was handed over says
`RESTART` first.

A route's protocol (`workers.model.protocols`) adds its fields to a request that
says what reply it allows, and a reply of function calls becomes the object they
stand for. A server that refuses those fields (a 400 or 422 naming them) is asked
again at once in text, not counted as a failed attempt, and spoken to in text for
the rest of the process's life (`protocol_fallback` says why; the router records it
for `relay routes`).

A whole call, retries included, ends by `ModelSettings.deadline`
(RELAY_MODEL_DEADLINE): a server that trickles its reply a byte at a time
cannot hold a worker past it; and the caller's `should_stop` is asked while
the reply comes in, not only between attempts. Cancelling the call's task ends it
at its next await: the response is closed, and its connection with it (a reply
half read cannot be reused), so nothing leaks.

Failures end as one exception, `ModelCallError`, whose `retryable` says whether
the failure was transient (429, 5xx, a timeout, a refused or dropped
connection) and was retried until the budget ran out, or permanent (another
4xx, an unusable body, a bad URL). aiohttp's own exceptions are translated in one
place, `_translating_errors`. The key, and secret values in the URL's query
string (`?api-key=...`), never appear in an error or a log line.

Why aiohttp, not httpx (DESIGN §10.1: "unless a well-kept alternative, measured side
by side in bench/, is needed to reach the goal"): reading streamed replies was some
58% of a worker's CPU with 300 calls in flight, and issue 53 asks for 2-3 ms of worker
CPU a model call in all. At 1,000 streams at once httpx's pool took 30 ms of client
CPU a stream, 24 of them searching its connections (httpcore looks through every one
it holds as each request comes and goes); our shelf of one-connection transports cut
that to 3.7 ms; aiohttp's connector, which keeps idle connections in a queue per host
and searches nothing, takes 1.8 ms (`bench.http_clients`, bench/RESULTS.md "Issue 53's
ground"). So the shelf went with httpx.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import random
import ssl
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import contextmanager, suppress
from types import TracebackType
from typing import TYPE_CHECKING, Any

import aiohttp
import httpx
from aiohttp.helpers import basicauth_from_netrc, get_env_proxy_for_url, netrc_from_env
from yarl import URL

from agent_core.steps import ModelRequest, ReplyShape
from workers.errors import ModelCallError
from workers.model.protocols import protocol_fields, refuses, reply_text
from workers.model.wire import (
    RESTART,
    Model,
    ModelReply,
    StreamedReply,
    awaited,
    backoff_seconds,
    chat_body,
    error_for_status,
    exhausted_wait,
    one_line,
    parse_reply,
    streaming,
)
from workers.redact import hide_secrets_in_httpx_logs, url_secrets
from workers.settings import ModelSettings, Settings

if TYPE_CHECKING:
    from workers.model.endpoints import ModelRoute

__all__ = ["KEEPALIVE_S", "ModelClient", "ModelSource", "shared_tls"]

log = logging.getLogger(__name__)

DRAIN_BYTES = 64 * 1024  # what a stream may send after [DONE] before it is dropped unread
KEEPALIVE_S = 5.0
"""How long an idle connection is kept (httpx's default keep-alive expiry, kept)."""
READS_PER_S = 3_000
"""How often a client reads its streamed replies, all of them together, once many stream
at once (`ModelClient._read_gap`)."""
MIN_READ_GAP_S = 0.005
"""A wait shorter than this between reads saves nothing: a reply is read as it comes."""
READ_GAP_S = 0.1
"""The longest a streamed reply's next read waits: what its live text and its end may lag."""


@functools.cache
def shared_tls() -> ssl.SSLContext:
    """This process's TLS context for model connections: SSL_CERT_FILE's (or
    SSL_CERT_DIR's) CAs if set, else certifi's bundle, as httpx chose (httpx makes it).
    Loading the CA bundle takes some 20 ms of CPU, so it is made once, and a worker
    makes it as it starts (`celery_app.tasks`): a prefork pool's children inherit it
    rather than each paying at its first model call."""
    return httpx.create_ssl_context()


# --- the I/O seam ----------------------------------------------------------------


@contextmanager
def _translating_errors(where: str, timeout: aiohttp.ClientTimeout) -> Iterator[None]:
    """Turn every aiohttp exception into a ModelCallError; the one place that knows aiohttp's.

    The messages keep the shapes they had with httpx (ConnectTimeout, ReadTimeout):
    users' alerts and runs' summaries read them."""
    try:
        yield
    except aiohttp.ConnectionTimeoutError:
        message = f"ConnectTimeout talking to {where} (limit {timeout.connect} s)"
        raise ModelCallError(message, retryable=True) from None
    except (aiohttp.ServerTimeoutError, TimeoutError):  # SocketTimeoutError: sock_read
        message = f"ReadTimeout talking to {where} (limit {timeout.sock_read} s)"
        raise ModelCallError(message, retryable=True) from None
    except aiohttp.ClientConnectorError as error:
        raise ModelCallError(f"could not connect to {where}: {error}", retryable=True) from None
    except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as error:
        # A dropped connection: often a kept-alive one the server had already closed.
        message = f"connection to {where} failed: {type(error).__name__}: {error}"
        raise ModelCallError(message, retryable=True) from None
    except aiohttp.ClientError as error:
        # A bad URL (InvalidURL), a reply aiohttp cannot parse: trying again won't help.
        message = f"request to {where} failed: {type(error).__name__}: {error}"
        raise ModelCallError(message, retryable=False) from None


async def _read_capped(
    response: aiohttp.ClientResponse, limit: int, check: Callable[[], None]
) -> bytes:
    """Return the whole (decoded) body; raise ModelCallError once it passes `limit` bytes.

    The size is checked while the body streams in, so a runaway (or decompressed)
    body never sits in memory whole; `check` is called before the body and after
    each piece of it, and raises to end the read (a deadline, a cancel).
    """
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise _too_big(response, limit)
    chunks: list[bytes] = []
    size = 0
    check()
    async for chunk in response.content.iter_any():
        check()
        size += len(chunk)
        if size > limit:
            raise _too_big(response, limit)
        chunks.append(chunk)
    return b"".join(chunks)


class _Reads:
    """A streamed body, read as it has come: each read takes every byte that arrived.

    While many replies stream at once (`gap` > 0), a read waits `gap` seconds after the
    one before with its connection's reading paused, so the pieces sent meanwhile wait
    in the socket and come in one read: one wake-up of the loop, one parse and one
    hand-over for several pieces, not one each (at 60 pieces a second and 300 streams,
    reading every piece alone was the loop's busiest work). The first read, and any
    read while `gap` is 0, waits for nothing."""

    __slots__ = ("_content", "_gap", "_read", "_transport")

    def __init__(self, response: aiohttp.ClientResponse, gap: Callable[[], float]) -> None:
        self._content = response.content
        connection = response.connection
        self._transport = connection.transport if connection is not None else None
        self._gap = gap
        self._read = False

    def unpaced(self) -> None:
        """Read the rest as it comes (the reply is whole: what follows is its end)."""
        self._gap = _no_gap

    def __aiter__(self) -> _Reads:
        return self

    async def __anext__(self) -> bytes:
        if self._read:
            await self._wait()
        self._read = True
        data = await self._content.readany()
        if not data:  # the body's end
            raise StopAsyncIteration
        return data

    async def _wait(self) -> None:
        """Hold the connection's reading for the gap (if any), so what the server sends
        meanwhile waits in the socket; a body that has ended is not held."""
        gap, transport = self._gap(), self._transport
        if gap <= 0 or transport is None or self._content.is_eof():
            return
        if not transport.is_reading():  # (aiohttp holds it, for a full buffer: its own)
            return
        transport.pause_reading()
        try:
            await asyncio.sleep(gap)
        finally:
            if not transport.is_closing():
                transport.resume_reading()


def _no_gap() -> float:
    return 0.0


async def _drain(chunks: AsyncIterator[bytes], call: _Call) -> None:
    """Read the body's end after `[DONE]`, up to DRAIN_BYTES, to keep the connection.

    A body that says more is left unread: releasing it then closes its connection."""
    with suppress(aiohttp.ClientError, ModelCallError):
        size = 0
        async for chunk in chunks:
            size += len(chunk)
            if size > DRAIN_BYTES:
                return  # it says nothing: the connection is dropped instead
            call.check()


def _spent(reply: ModelReply, spent_for: float | None) -> ModelReply:
    """`reply`, saying the route is spent for `spent_for` seconds (if it is)."""
    return reply if spent_for is None else reply.model_copy(update={"spent_for_s": spent_for})


def _calls_read(reply: ModelReply, shape: ReplyShape | None, call: _Call) -> ModelReply:
    """`reply`, its function calls (if any) written as the reply object they stand for,
    which the caller gets in place of any text that came before them."""
    if not reply.tool_calls:
        return reply
    text = reply_text(shape, reply.tool_calls, cut=reply.finish_reason == "length")
    if call.streamed:
        call.text(RESTART)  # what came as content (thinking, say) is not the reply
    call.text(text)
    return reply.model_copy(update={"text": text})


def _too_big(response: aiohttp.ClientResponse, limit: int) -> ModelCallError:
    message = f"the model server's reply is larger than {limit} bytes"
    return ModelCallError(message, retryable=False, status=response.status)


def _env_proxy(url: URL) -> tuple[URL | None, dict[str, str] | None]:
    """The proxy the environment names for `url` (HTTP_PROXY, HTTPS_PROXY, NO_PROXY,
    and .netrc for its credentials), as aiohttp's `trust_env` finds it, and the header
    that logs in to it; (None, None) for none."""
    try:
        proxy, auth = get_env_proxy_for_url(url)
    except LookupError:
        return None, None
    return proxy, ({"Proxy-Authorization": auth.encode()} if auth is not None else None)


def _netrc_auth(url: URL) -> str | None:
    """The Authorization header .netrc (or $NETRC) gives `url`'s host, if any."""
    if url.host is None:
        return None
    try:
        return basicauth_from_netrc(netrc_from_env(), url.host).encode()
    except LookupError:
        return None


class ModelClient:
    """Calls one OpenAI-compatible chat completions endpoint; one per process.

    `sleep` (awaited), `rand` and `now` (Unix seconds, for Retry-After dates) are
    injectable so the retry waits can be observed without waiting. Its calls are made
    on one event loop (the process's): its aiohttp session is made on that loop at the
    first call, and binds to it.
    """

    def __init__(
        self,
        settings: ModelSettings,
        *,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        rand: Callable[[], float] = random.random,
        now: Callable[[], float] = time.time,
    ) -> None:
        self._settings = settings
        self._sleep = sleep
        self._rand = rand
        self._now = now
        self._key = settings.key.get_secret_value() if settings.key else None
        self._headers = {"Accept": "application/json", "Content-Type": "application/json"}
        if self._key:
            self._headers["Authorization"] = f"Bearer {self._key}"
        url = URL(settings.url)
        self._proxy, self._proxy_headers = _env_proxy(url)
        if self._proxy_headers and url.scheme == "http":
            # A plain request goes to the proxy itself, which reads its login there;
            # proxy_headers go only to an https tunnel's CONNECT.
            self._headers |= self._proxy_headers
            self._proxy_headers = None
        netrc_auth = None if self._key else _netrc_auth(url)
        if netrc_auth is not None:
            self._headers["Authorization"] = netrc_auth
        self._tls = shared_tls()  # (taken now: a worker made it before its pool forked)
        self._http: aiohttp.ClientSession | None = None  # made at the first call, on its loop
        self._closed = False
        # What no error may show: the key, and the secrets in the URL's query string.
        # (A value of a few characters would garble every message, and hides nothing.)
        secrets = [s for s in url_secrets(settings.url) if len(s) >= 4]
        secrets += [self._key] if self._key else []
        self._secrets = sorted(secrets, key=len, reverse=True)
        self._where = f"{url.host}:{url.port or (443 if url.scheme == 'https' else 80)}"
        self._streams = True  # ask for streamed replies (until the server refuses one)
        self._streaming = 0  # streamed replies being read (on the client's loop)
        self._protocol = settings.protocol  # until the server refuses it: then text
        self._fallback: str | None = None
        # The model calls no longer go through httpx, but MCP's HTTP sessions in this
        # process still do, and their request lines must not show a URL's secrets.
        hide_secrets_in_httpx_logs()

    def _session(self) -> aiohttp.ClientSession:
        """This client's session, made on the running loop at the first call.

        No cap on connections, kept or in use: a thousand calls in flight on one loop
        must not queue for the pool (the process's capacity bounds its calls; idle ones
        expire after KEEPALIVE_S). HTTP(S)_PROXY, NO_PROXY and .netrc are honoured as
        httpx did, read once when the client is made (aiohttp's `trust_env` reads them
        again in a thread for every request: a tenth of a worker's CPU at 50 ms a
        reply); redirects are not followed (nor were they): a 3xx is the server's answer."""
        if self._http is None:
            if self._closed:
                raise RuntimeError("the model client is closed")
            connector = aiohttp.TCPConnector(limit=0, ssl=self._tls, keepalive_timeout=KEEPALIVE_S)
            self._http = aiohttp.ClientSession(
                connector=connector,
                headers=self._headers,
                timeout=aiohttp.ClientTimeout(total=None),  # each request gives its own
                trust_env=False,  # (the proxy and .netrc are this client's: `_env_proxy`)
                auto_decompress=True,
                cookie_jar=aiohttp.DummyCookieJar(),  # (a model server's cookies mean nothing)
            )
        return self._http

    @property
    def protocol_fallback(self) -> str | None:
        """Why this client speaks text instead of its route's protocol (the server's
        refusal), or None while it speaks the route's own."""
        return self._fallback

    async def complete(
        self,
        request: ModelRequest,
        *,
        should_stop: Callable[[], bool] | None = None,
        on_text: Callable[[str], None] | None = None,
        longest_wait: float | None = None,
        longest_retry_after: float | None = None,
        most_attempts: int | None = None,
        may_retry: Callable[[], bool | Awaitable[bool]] | None = None,
        max_tokens: int | None = None,
    ) -> ModelReply:
        """Return the model's reply to `request`, retrying transient failures.

        A retry that would have to wait longer than `longest_wait` seconds is not
        waited for: the failure is raised, so the caller can try another route.
        Nor is one whose server asked (Retry-After) for longer than
        `longest_retry_after`: the caller can come back then without holding a worker.
        `most_attempts` caps the attempts below the settings' (a route with a fallback
        is asked once); `may_retry` is asked (and awaited, if it returns an awaitable)
        before every retry (a route whose circuit opened meanwhile is asked no more):
        False raises the failure. `max_tokens` caps
        the reply below the settings' cap (what a run's budget has left).

        The whole call (every attempt, its reads, the waits between them) ends by
        the settings' `deadline`: each attempt's timeouts are cut to what is left,
        and the body is checked as it comes in, so a server trickling a byte now
        and then cannot hold it longer. `should_stop` is asked as the body comes
        in and before and after every wait between attempts, so a cancelled run
        stops; `on_text` gets the text as it comes, on the loop's thread, so it must be
        cheap (`workers.model.wire.Model`). Cancelling the task ends the call at its next
        await, its response closed. Raises ModelCallError: the permanent failure at once,
        the last transient one when the retries are spent, or why it ended early.
        """
        settings = self._settings
        body = self._body(request, max_tokens)
        attempts = settings.retries + 1
        if most_attempts is not None:
            attempts = max(1, min(attempts, most_attempts))
        call = _Call(settings.deadline, attempts, should_stop, on_text)
        call.longest_wait = longest_wait
        call.longest_retry_after = longest_retry_after
        for attempt in range(call.attempts):
            call.attempt = attempt
            try:
                return await self._spoken(request, body, call)
            except _CallEnded:
                raise
            except ModelCallError as error:
                await self._before_retry(error, call, may_retry)
        raise AssertionError("unreachable: the last attempt returns or raises")

    async def _before_retry(
        self,
        error: ModelCallError,
        call: _Call,
        may_retry: Callable[[], bool | Awaitable[bool]] | None,
    ) -> None:
        """Wait for the next attempt after `error`, or raise why there is none."""
        if not error.retryable:
            raise error
        if call.left() <= 0:
            raise call.past_deadline(error) from None
        if call.attempt + 1 == call.attempts:
            raise _again(error, f"gave up after {_attempts(call.attempts)}") from None
        if may_retry is not None and not await awaited(may_retry()):
            raise _again(error, f"not retried ({self._where} is not to be asked now)") from None
        await self._pause(error, call)

    def _body(self, request: ModelRequest, max_tokens: int | None) -> dict[str, Any]:
        """The request's body, its reply capped at the smaller of the settings' cap and
        `max_tokens`."""
        settings = self._settings
        cap = settings.max_tokens
        if max_tokens is not None and max_tokens > 0:
            cap = min(cap, max_tokens) if cap else max_tokens
        chars = settings.attachment_chars
        return chat_body(settings.model, request, attachment_chars=chars, max_tokens=cap)

    async def _spoken(
        self, request: ModelRequest, plain: dict[str, Any], call: _Call
    ) -> ModelReply:
        """Make one attempt in the route's protocol (`plain`: the body in text). A server
        that refuses the protocol is asked again at once in text, from now on."""
        protocol = self._protocol
        fields = protocol_fields(protocol, request.reply)
        if not fields:
            return await self._attempt(plain, call)
        try:
            reply = await self._attempt(plain | fields, call)
        except ModelCallError as error:
            if isinstance(error, _CallEnded) or not refuses(protocol, error.status, error.message):
                raise
            refusal = self._fall_back(protocol, error)
            reply = await self._attempt(plain, call)
            return reply.model_copy(update={"protocol_fallback": refusal})
        return _calls_read(reply, request.reply, call)

    def _fall_back(self, protocol: str, error: ModelCallError) -> str:
        """Speak text from now on; return the refusal (the first one, if calls raced)."""
        refusal = one_line(error.message, 300)
        first, self._protocol = self._fallback is None, "text"
        self._fallback = self._fallback or refusal
        if first:
            log.warning(
                "%s does not take the %s protocol; speaking text from now on: %s",
                self._where,
                protocol,
                refusal,
            )
        return self._fallback or refusal

    async def _pause(self, error: ModelCallError, call: _Call) -> None:
        """Wait before the next attempt; raise ModelCallError if told to stop or out of time."""
        if call.stopped():
            raise call.stop(error)
        base, cap = self._settings.backoff_base, self._settings.backoff_cap
        delay = backoff_seconds(call.attempt, error.retry_after, base, cap, self._rand())
        if delay >= call.left():
            raise call.past_deadline(error)  # waiting only to fail helps nobody
        if call.longest_wait is not None and delay > call.longest_wait:
            raise error  # the caller would rather not wait that long here
        asked, longest = error.retry_after, call.longest_retry_after
        if asked is not None and longest is not None and asked > longest:
            raise error  # the caller comes back when the server said
        log.warning(
            "model call attempt %d of %d failed, retrying in %.2f s: %s",
            call.attempt + 1,
            call.attempts,
            delay,
            error.message,
        )
        await self._sleep(delay)
        if call.stopped():
            raise call.stop(error)

    async def _attempt(self, body: dict[str, Any], call: _Call) -> ModelReply:
        """Make one attempt: streamed when the caller takes text and the server may stream."""
        if call.streamed:
            call.text(RESTART)
        if call.on_text is None or not self._streams:
            return await self._request(body, call, streamed=False)
        try:
            return await self._request(body, call, streamed=True)
        except ModelCallError as error:
            # Only a refusal that names the parameter means "cannot stream": an unknown
            # model or a missing key is a 400 or 401 too, and asking again won't help.
            if error.status not in (400, 422) or "stream" not in error.message.lower():
                raise
        reply = await self._request(body, call, streamed=False)  # the server refused `stream`
        self._streams = False
        log.info("%s refused a streamed reply; asking it plainly from now on", self._where)
        return reply

    async def _request(self, body: dict[str, Any], call: _Call, *, streamed: bool) -> ModelReply:
        """Make one HTTP request; raise ModelCallError (with the key scrubbed) if it fails.

        Leaving the response's block releases it: a body read to its end gives its
        connection back to be kept, one cut short (a cancel, the size cap, a stop) closes
        it, for a reply half read cannot be reused."""
        left = call.left()
        if left <= 0:
            raise call.past_deadline()
        settings = self._settings
        connect, read = min(settings.connect_timeout, left), min(settings.read_timeout, left)
        timeout = aiohttp.ClientTimeout(total=None, connect=connect, sock_read=read)
        content = json.dumps(streaming(body) if streamed else body).encode("utf-8")
        post = self._session().post
        try:
            with _translating_errors(self._where, timeout):
                async with post(
                    settings.url,
                    data=content,
                    timeout=timeout,
                    allow_redirects=False,
                    proxy=self._proxy,
                    proxy_headers=self._proxy_headers,
                ) as response:
                    kind = response.headers.get("content-type", "")
                    spent_for = exhausted_wait(response.headers)
                    if response.status == 200 and kind.startswith("text/event-stream"):
                        events = await self._read_events(response, call, len(content))
                        return _spent(events, spent_for)
                    data = await _read_capped(response, settings.max_body_bytes, call.check)
            if response.status != 200:
                raise error_for_status(response.status, response.headers, data, self._now())
            reply = parse_reply(data)
        except ModelCallError as error:
            raise self._scrubbed(error) from None
        if reply.text:
            call.text(reply.text)  # a reply that came whole is handed over whole
        return _spent(reply, spent_for)

    async def _read_events(
        self, response: aiohttp.ClientResponse, call: _Call, sent: int
    ) -> ModelReply:
        """Read a streamed reply, handing the text over as it arrives: what one read
        completed goes in one piece (a piece that came before a failing event goes
        too, before the failure ends the attempt)."""
        events = StreamedReply()
        limit, size = self._settings.max_body_bytes, 0
        call.check()
        reads = _Reads(response, self._read_gap)
        self._streaming += 1
        try:
            async for chunk in reads:
                call.check()
                size += len(chunk)
                if size > limit:
                    raise _too_big(response, limit)
                pieces: list[str] = []
                try:
                    events.feed(chunk, pieces)
                finally:
                    if pieces:
                        call.text("".join(pieces))
                if events.done:
                    reads.unpaced()
                    await _drain(reads, call)
                    break
        finally:
            self._streaming -= 1
        for piece in events.end():
            call.text(piece)
        return events.reply(sent)

    def _read_gap(self) -> float:
        """How long a streamed reply's next read waits (`_Reads`): none while few stream,
        so a lone reply's pieces come as they are sent; growing with the replies this
        client reads at once, so that all of them together are read about READS_PER_S
        times a second, up to READ_GAP_S (and well inside the read timeout, which a held
        connection must not seem to pass)."""
        gap = min(self._streaming / READS_PER_S, READ_GAP_S, self._settings.read_timeout / 4)
        return 0.0 if gap < MIN_READ_GAP_S else gap

    def _scrubbed(self, error: ModelCallError) -> ModelCallError:
        """Return `error` without the key or the URL's secrets, in case a server echoed them."""
        message = error.message
        for secret in self._secrets:
            message = message.replace(secret, "***")
        if message == error.message:
            return error
        return type(error)(
            message, retryable=error.retryable, status=error.status, retry_after=error.retry_after
        )

    async def aclose(self) -> None:
        """Close the kept-alive connections (on the loop that made the calls); a call
        made after raises RuntimeError."""
        self._closed = True
        if self._http is not None:
            await self._http.close()

    async def __aenter__(self) -> ModelClient:
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()


class _CallEnded(ModelCallError):
    """Raised when a call must end now, whatever its retries: it was told to stop, or
    its deadline passed."""


class _Call:
    """One call's limits: when it must end, how many attempts it may make, who may stop it."""

    def __init__(
        self,
        deadline: float,
        attempts: int,
        should_stop: Callable[[], bool] | None,
        on_text: Callable[[str], None] | None = None,
    ) -> None:
        self.deadline = deadline
        self.ends_at = time.monotonic() + deadline
        self.attempts = attempts
        self.should_stop = should_stop
        self.on_text = on_text
        self.streamed = False  # text was handed over since the reply last (re)started
        self.attempt = 0
        """The attempt under way (0 for the first)."""
        self.longest_wait: float | None = None
        self.longest_retry_after: float | None = None
        """Seconds the call would wait before a retry at most (None: as long as it takes)."""

    def text(self, piece: str) -> None:
        """Hand a piece of the reply (or RESTART) to the caller, if it takes text."""
        if self.on_text is not None:
            self.streamed = piece != RESTART
            self.on_text(piece)

    def left(self) -> float:
        return self.ends_at - time.monotonic()

    def stopped(self) -> bool:
        return self.should_stop is not None and self.should_stop()

    def check(self) -> None:
        """Raise `_CallEnded` if the caller said stop or the deadline passed."""
        if self.stopped():
            raise self.stop()
        if self.left() <= 0:
            raise self.past_deadline()

    def stop(self, last: ModelCallError | None = None) -> _CallEnded:
        said = last.message if last else "told to stop while the reply came in"
        done = f"{_attempts(self.attempt + 1)} of {self.attempts}"
        retryable = last.retryable if last else False
        return _CallEnded(f"model call stopped after {done}: {said}", retryable=retryable)

    def past_deadline(self, last: ModelCallError | None = None) -> _CallEnded:
        said = last.message if last else "the reply was still coming in"
        done = _attempts(self.attempt + 1)
        message = f"model call passed its deadline of {self.deadline:g} s after {done}: {said}"
        return _CallEnded(message, retryable=True, status=last.status if last else None)


def _attempts(count: int) -> str:
    return f"{count} attempt" if count == 1 else f"{count} attempts"


def _again(error: ModelCallError, what: str) -> ModelCallError:
    return ModelCallError(
        f"model call {what}: {error.message}",
        retryable=error.retryable,
        status=error.status,
        retry_after=error.retry_after,
    )


class _NoModel:
    """Stands in when no model is configured: every call fails with a clear reason."""

    async def complete(
        self,
        request: ModelRequest,
        *,
        should_stop: Callable[[], bool] | None = None,
        on_text: Callable[[str], None] | None = None,
    ) -> ModelReply:
        del request, should_stop, on_text
        raise ModelCallError("no model is configured: set RELAY_MODEL_URL", retryable=False)


class ModelSource:
    """Hands out a process's model: the one given, or one HTTP client per process.

    A client is made in the process that uses it (after a prefork worker forks),
    and kept for every later call on its loop, so its connections are reused.
    """

    def __init__(self, settings: Settings, model: Model | None = None) -> None:
        self._settings = settings
        self._model = model
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._clients: dict[str, ModelClient] = {}

    @property
    def given(self) -> Model | None:
        """The model the app gave (`Relay(model=...)`), which takes no routes."""
        return self._model

    def get(self) -> Model:
        if self._model is not None:
            return self._model
        if self._settings.model_url is None:
            return _NoModel()
        return self._client("", self._settings.model_settings)

    def for_route(self, route: ModelRoute) -> ModelClient:
        """This process's client of a route."""
        return self._client(route.name, lambda: route.client_settings(self._settings))

    def _client(self, name: str, settings: Callable[[], ModelSettings]) -> ModelClient:
        pid = os.getpid()
        with self._lock:
            if self._pid != pid:  # a forked child: clients are not shared across processes
                self._pid, self._clients = pid, {}
            client = self._clients.get(name)
            if client is None:
                client = self._clients[name] = ModelClient(settings())
        return client
