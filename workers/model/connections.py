"""Kept-alive connections for many model calls at once: each call has one to itself.

httpx's own pool (httpcore's) looks through every connection it holds, twice a
request, to find one to use and to drop the expired ones. A process that carries
hundreds of model calls holds hundreds of connections, so each call paid for all the
others: at 200 calls in flight (a loopback server replying in 2 s, the client's own
CPU a call) 4.7 ms for a plain reply and 7.9 ms for a streamed one, against 0.7 and
1.0 ms for one call alone; at a thousand, more than the call itself.

`KeptConnections` is the client's transport instead. It keeps a shelf of httpx
transports, each holding at most one connection: a request takes the one used last
(its connection most likely still open), and puts it back when its response is
closed. So a request's pool has one connection to look at however many calls are in
flight, and the process still holds one connection per call in flight and reuses
them, as before. A transport left on the shelf longer than the connections' keep-alive
expiry is closed as a later request passes: after a burst, the shelf shrinks back.

The transports share one TLS context (loading the CA bundle costs milliseconds), and
each gives its connection httpx's keep-alive expiry, timeouts (the request's), and
everything else httpx does. Proxies from the environment are httpx's mounts, as
before: they take precedence over this transport.
"""

from __future__ import annotations

import functools
import ssl
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator

import httpcore  # noqa: F401 - imported here, not at the first request (see below)
import httpx

# httpx imports httpcore (and h11) when its first transport is made. The transports here
# are made at a process's first request, so a prefork worker's every child imported
# them at its first model call: a third of a second of CPU each (py-spy, bench many).
# Imported with this module instead, they are loaded once, before the pool forks.

__all__ = ["KEEPALIVE_S", "KeptConnections", "shared_tls"]

KEEPALIVE_S = 5.0
"""How long an idle connection is kept (httpx's default keep-alive expiry)."""


class _Given(httpx.SyncByteStream):
    """A response's body; closing it puts its transport back on the shelf (once)."""

    def __init__(self, body: httpx.SyncByteStream, give_back: Callable[[], None]) -> None:
        self._body = body
        self._give_back: Callable[[], None] | None = give_back

    def __iter__(self) -> Iterator[bytes]:
        yield from self._body

    def close(self) -> None:
        try:
            self._body.close()
        finally:
            give_back, self._give_back = self._give_back, None
            if give_back is not None:
                give_back()


@functools.cache
def shared_tls() -> ssl.SSLContext:
    """This process's TLS context for model connections (httpx's default: it honours
    SSL_CERT_FILE). Loading the CA bundle takes some 20 ms of CPU, so it is made once,
    and a worker makes it as it starts (`celery_app.tasks`): a prefork pool's children
    inherit it rather than each paying at its first model call."""
    return httpx.create_ssl_context()


class KeptConnections(httpx.BaseTransport):
    """A transport of one kept-alive connection per request in flight (see the module).

    `clock` (monotonic seconds) is injectable so that a test can age the shelf."""

    def __init__(
        self,
        *,
        keepalive_s: float = KEEPALIVE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._keepalive_s = keepalive_s
        self._clock = clock
        self._tls = shared_tls()
        self._limits = httpx.Limits(
            max_connections=1, max_keepalive_connections=1, keepalive_expiry=keepalive_s
        )
        self._lock = threading.Lock()
        self._shelf: deque[tuple[float, httpx.HTTPTransport]] = deque()
        """Transports not in use, each with when it was put back: the last used on top."""
        self._lent = 0
        self._closed = False

    @property
    def kept(self) -> int:
        """Transports on the shelf (each holds at most one idle connection)."""
        with self._lock:
            return len(self._shelf)

    @property
    def lent(self) -> int:
        """Transports in use by a request whose response is not closed yet."""
        with self._lock:
            return self._lent

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        transport = self._take()
        try:
            response = transport.handle_request(request)
        except BaseException:
            self._put_back(transport)
            raise
        stream = response.stream
        if not isinstance(stream, httpx.SyncByteStream):  # (httpx's sync transport's own)
            self._put_back(transport)
            raise TypeError("a sync transport answered with an async body")
        body = _Given(stream, lambda: self._put_back(transport))
        return httpx.Response(
            response.status_code,
            headers=response.headers,
            stream=body,
            extensions=response.extensions,
        )

    def _take(self) -> httpx.HTTPTransport:
        stale: httpx.HTTPTransport | None = None
        with self._lock:
            if self._closed:
                raise RuntimeError("the model client's connections are closed")
            self._lent += 1
            taken = self._shelf.pop()[1] if self._shelf else None
            # The bottom of the shelf waited longest: closed once its connection expired.
            if self._shelf and self._clock() - self._shelf[0][0] > self._keepalive_s:
                stale = self._shelf.popleft()[1]
        if stale is not None:
            stale.close()
        if taken is not None:
            return taken
        return httpx.HTTPTransport(verify=self._tls, limits=self._limits, trust_env=False)

    def _put_back(self, transport: httpx.HTTPTransport) -> None:
        with self._lock:
            self._lent -= 1
            if not self._closed:
                self._shelf.append((self._clock(), transport))
                return
        transport.close()

    def close(self) -> None:
        """Close every kept connection; a response still being read closes its own."""
        with self._lock:
            self._closed = True
            shelf, self._shelf = self._shelf, deque()
        for _, transport in shelf:
            transport.close()
