"""httpx's AsyncClient without its pool search: one kept connection a request in flight.

`workers.model.connections.KeptConnections` does this for the synchronous client:
httpcore's pool looks through every connection it holds each time a request comes
or goes, so at a thousand streams in flight each request pays for all the others
(`bench.http_clients` measures it). `AsyncShelf` is the same idea for
`httpx.AsyncClient`, kept as small as a bench needs (no keep-alive expiry, no
proxies): a shelf of transports, each holding at most one connection; a request
takes the one put back last and gives it back when its response is closed. It is
here to tell what httpx costs once the pool is out of the way, for issue 53's
choice between httpx and aiohttp; it imports nothing of `workers`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import httpx

__all__ = ["AsyncShelf"]

_ONE = httpx.Limits(max_connections=1, max_keepalive_connections=1)


class _Given(httpx.AsyncByteStream):
    """A response's body; closing it puts its transport back on the shelf (once)."""

    def __init__(self, body: httpx.AsyncByteStream, give_back: Callable[[], None]) -> None:
        self._body = body
        self._give_back: Callable[[], None] | None = give_back

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for part in self._body:
            yield part

    async def aclose(self) -> None:
        try:
            await self._body.aclose()
        finally:
            give_back, self._give_back = self._give_back, None
            if give_back is not None:
                give_back()


class AsyncShelf(httpx.AsyncBaseTransport):
    """A transport of one kept-alive connection per request in flight."""

    def __init__(self) -> None:
        self._shelf: list[httpx.AsyncHTTPTransport] = []
        # One TLS context for all: each transport would load the CA bundle (some 20 ms
        # of CPU and most of a megabyte) for a connection of its own.
        self._tls = httpx.create_ssl_context()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self._shelf:
            transport = self._shelf.pop()
        else:
            transport = httpx.AsyncHTTPTransport(verify=self._tls, limits=_ONE)
        try:
            response = await transport.handle_async_request(request)
        except BaseException:
            self._shelf.append(transport)
            raise
        stream = response.stream
        if not isinstance(stream, httpx.AsyncByteStream):
            self._shelf.append(transport)
            raise TypeError("an async transport answered with a sync body")
        return httpx.Response(
            response.status_code,
            headers=response.headers,
            stream=_Given(stream, lambda: self._shelf.append(transport)),
            extensions=response.extensions,
        )

    async def aclose(self) -> None:
        shelf, self._shelf = self._shelf, []
        for transport in shelf:
            await transport.aclose()
