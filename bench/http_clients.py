"""`python -m bench.http_clients [--streams 1,100,1000] [--rate 60] [--seconds 2]`: httpx's
AsyncClient (with its own pool, and with `bench.async_shelf`) beside aiohttp, streaming
chat completions from `bench.slow_model`.

Each (client, streams) pair runs in a fresh client process of its own (so its CPU,
its memory and its event loop are that client's alone), the pairs interleaved
client by client; the model server runs in another process. In each, `streams`
streamed completions start at once on one event loop, twice: `cold` (the pool
opens every connection) then `warm` (the same client again: the pool now holds
that many idle connections). Every stream reads its server-sent events line by
line and decodes each `data:` line as JSON, the same in both clients, and must
see every piece, the usage chunk and `[DONE]`, or it counts as an error.

Per round: client CPU (user + system, `resource.getrusage`) per stream, peak RSS
growth (`ru_maxrss` less the RSS before the round) per stream, the wall time
against the model's 2 s, each stream's own time (p50/p99), errors, the model
server's cores busy (to see that it is not what limits); for httpx also
the CPU its connection pool spends choosing a connection
(`AsyncConnectionPool._assign_requests_to_connections`, timed by a wrapper): it
walks every connection and every request each time a request comes or goes.

It imports neither `workers` nor anything but httpx and aiohttp, so that it runs
on any Python with those two (`PYTHONPATH` at the repository's root). Not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager, nullcontext
from pathlib import Path
from typing import Any

__all__ = ["CLIENTS", "main", "measure", "slow_model"]

CLIENTS = ("httpx", "httpx-shelf", "aiohttp")
"""httpx with its own pool, httpx with `bench.async_shelf.AsyncShelf` (one connection a
request, no pool search), aiohttp."""
ROUNDS = ("cold", "warm")
BODY = {
    "model": "slow",
    "stream": True,
    "stream_options": {"include_usage": True},
    "messages": [{"role": "user", "content": "Say something long."}],
}


class _Tally:
    """What the streams of one round saw: pieces, usage chunks, ends, errors, times."""

    def __init__(self, pieces: int) -> None:
        self.pieces = pieces
        self.errors: list[str] = []
        self.took: list[float] = []

    def read_line(self, line: str, seen: dict[str, int]) -> None:
        """Count one line of a stream (JSON decoded, as any real client does)."""
        if not line.startswith("data: "):
            return
        data = line[6:].strip()
        if data == "[DONE]":
            seen["done"] += 1
            return
        event = json.loads(data)
        if event.get("usage"):
            seen["usage"] += 1
        for choice in event["choices"]:
            if choice["delta"].get("content"):
                seen["pieces"] += 1

    def check(self, seen: dict[str, int], began: float) -> None:
        if seen != {"pieces": self.pieces, "usage": 1, "done": 1}:
            self.errors.append(f"incomplete stream: {seen}")
            return
        self.took.append(time.monotonic() - began)


async def _httpx_round(url: str, streams: int, tally: _Tally, client: Any) -> None:
    async def one() -> None:
        seen = {"pieces": 0, "usage": 0, "done": 0}
        began = time.monotonic()
        async with client.stream("POST", url, json=BODY) as answer:
            answer.raise_for_status()
            async for line in answer.aiter_lines():
                tally.read_line(line, seen)
        tally.check(seen, began)

    await _all(one, streams, tally)


async def _aiohttp_round(url: str, streams: int, tally: _Tally, session: Any) -> None:
    async def one() -> None:
        seen = {"pieces": 0, "usage": 0, "done": 0}
        began = time.monotonic()
        async with session.post(url, json=BODY) as answer:
            answer.raise_for_status()
            async for line in answer.content:
                tally.read_line(line.decode(), seen)
        tally.check(seen, began)

    await _all(one, streams, tally)


async def _all(one: Callable[[], Awaitable[None]], streams: int, tally: _Tally) -> None:
    async def guarded() -> None:
        try:
            await one()
        except Exception as error:  # noqa: BLE001 - every failure is one stream's error
            tally.errors.append(f"{type(error).__name__}: {error}")

    await asyncio.gather(*(guarded() for _ in range(streams)))


@contextmanager
def _pool_timer() -> Iterator[list[float]]:
    """Time httpcore's connection choice (its only O(connections) step a request)."""
    from httpcore import AsyncConnectionPool  # noqa: PLC0415 - httpx's runs only

    spent = [0.0]
    original = AsyncConnectionPool._assign_requests_to_connections

    def timed(pool: Any) -> Any:
        began = time.process_time()
        try:
            return original(pool)
        finally:
            spent[0] += time.process_time() - began

    AsyncConnectionPool._assign_requests_to_connections = timed  # type: ignore[method-assign,assignment]
    try:
        yield spent
    finally:
        AsyncConnectionPool._assign_requests_to_connections = original  # type: ignore[method-assign]


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _cpu_of(pid: int) -> float:
    """The CPU seconds (user + system) process `pid` has used so far (/proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rss_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS in /proc/self/status")


async def _rounds(
    name: str, url: str, streams: int, pieces: int, server: int
) -> list[dict[str, Any]]:
    """Run the cold and the warm round on one client; return each one's figures."""
    found = []
    timer = _pool_timer() if name.startswith("httpx") else nullcontext([0.0])
    async with _client(name) as client:
        with timer as pool:
            for label in ROUNDS:
                tally = _Tally(pieces)
                pool[0] = 0.0
                rss_before, cpu_before, served_before = _rss_kb(), _cpu_s(), _cpu_of(server)
                peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
                began = time.monotonic()
                round_ = _aiohttp_round if name == "aiohttp" else _httpx_round
                await round_(url, streams, tally, client)
                wall = time.monotonic() - began
                cpu = _cpu_s() - cpu_before
                served = _cpu_of(server) - served_before
                peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
                # (ru_maxrss only grows: a round that stays below the last peak grew by
                # no more than the current RSS shows.)
                grown = (peak - rss_before) if peak > peak_before else (_rss_kb() - rss_before)
                found.append(
                    _figures(
                        name,
                        label,
                        streams,
                        wall=wall,
                        cpu=cpu,
                        grown_kb=grown,
                        tally=tally,
                        pool_s=pool[0],
                        server_s=served,
                    )
                )
    return found


def _figures(
    name: str,
    label: str,
    streams: int,
    *,
    wall: float,
    cpu: float,
    grown_kb: int,
    tally: _Tally,
    pool_s: float,
    server_s: float,
) -> dict[str, Any]:
    took = sorted(tally.took)

    def nth(q: float) -> float:
        return round(took[min(len(took) - 1, int(q * len(took)))], 3) if took else float("nan")

    return {
        "client": name,
        "round": label,
        "streams": streams,
        "wall_s": round(wall, 3),
        "stream_s_p50": nth(0.5),
        "stream_s_p99": nth(0.99),
        "cpu_ms_per_stream": round(cpu * 1000 / streams, 3),
        "cores_busy": round(cpu / wall, 2),
        "rss_kb_per_stream": round(max(grown_kb, 0) / streams, 1),
        "pool_ms_per_stream": None if name == "aiohttp" else round(pool_s * 1000 / streams, 3),
        "server_cores": round(server_s / wall, 2),
        "errors": len(tally.errors),
        "first_error": tally.errors[0] if tally.errors else None,
    }


@asynccontextmanager
async def _client(name: str) -> AsyncIterator[Any]:
    """The client under test, configured for thousands of connections at once."""
    if name == "httpx-shelf":
        import httpx  # noqa: PLC0415 - each client process imports its own only

        from bench.async_shelf import AsyncShelf  # noqa: PLC0415

        shelf = AsyncShelf()
        async with httpx.AsyncClient(transport=shelf, timeout=httpx.Timeout(120.0)) as client:
            yield client
        return
    if name == "httpx":
        import httpx  # noqa: PLC0415

        # No cap on connections (the default 100 would queue the rest), all kept
        # alive for the warm round, and a read timeout past the model's reply time.
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(120.0)) as client:
            yield client
        return
    import aiohttp  # noqa: PLC0415

    connector = aiohttp.TCPConnector(limit=0)  # no cap (the default is 100)
    timeout = aiohttp.ClientTimeout(total=None, sock_read=120.0)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        yield session


def measure(name: str, url: str, streams: int, pieces: int, server: int) -> list[dict[str, Any]]:
    """Run one client's rounds in a fresh process; return its figures (`server`: the
    model server's pid, whose CPU each round reads too)."""
    command = [sys.executable, "-m", "bench.http_clients", "--one", name, "--url", url]
    command += ["--streams", str(streams), "--pieces", str(pieces), "--server", str(server)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{name} at {streams} streams failed:\n{done.stderr[-2000:]}")
    figures: list[dict[str, Any]] = json.loads(done.stdout)
    return figures


@contextmanager
def slow_model(seconds: float, rate: float) -> Iterator[tuple[str, int]]:
    """Start `bench.slow_model` in a process of its own; yield its completions URL and pid."""
    import socket  # noqa: PLC0415

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    command = [sys.executable, "-m", "bench.slow_model", "--port", str(port)]
    command += ["--seconds", str(seconds), "--rate", str(rate)]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert server.stdout is not None
        server.stdout.readline()  # "listening on ...": it is up
        yield f"http://127.0.0.1:{port}/v1/chat/completions", server.pid
    finally:
        server.terminate()
        server.wait(30)


def compare(streams: list[int], seconds: float, rate: float) -> list[dict[str, Any]]:
    """Every client at every size, interleaved; the model server started once."""
    pieces = max(1, round(rate * seconds))
    rows: list[dict[str, Any]] = []
    with slow_model(seconds, rate) as (url, server):
        for count in streams:
            for name in CLIENTS:
                print(f"-- {name}, {count} streams ...", file=sys.stderr, flush=True)
                rows += measure(name, url, count, pieces, server)
    return rows


COLUMNS = (
    ("client", "client", "{}"),
    ("round", "round", "{}"),
    ("streams", "streams", "{}"),
    ("wall_s", "wall s", "{:.2f}"),
    ("stream_s_p50", "p50 s", "{:.2f}"),
    ("stream_s_p99", "p99 s", "{:.2f}"),
    ("cpu_ms_per_stream", "CPU ms/stream", "{:.2f}"),
    ("cores_busy", "cores", "{:.2f}"),
    ("rss_kb_per_stream", "RSS KB/stream", "{:.1f}"),
    ("pool_ms_per_stream", "pool ms/stream", "{:.3f}"),
    ("server_cores", "server cores", "{:.2f}"),
    ("errors", "errors", "{}"),
)


def table(rows: list[dict[str, Any]], seconds: float) -> str:
    """The figures, one row per (client, round, streams), and httpx ÷ aiohttp per size."""
    lines = [" | ".join(title for _, title, _ in COLUMNS)]
    for row in rows:
        cells = [("-" if row[k] is None else fmt.format(row[k])) for k, _, fmt in COLUMNS]
        lines.append(" | ".join(cells))
    lines += [
        f"  first error ({r['client']}, {r['streams']}): {r['first_error']}"
        for r in rows
        if r["errors"]
    ]
    lines.append(f"\n÷ aiohttp's, same size and round (the ideal wall time is {seconds:g} s):")
    keyed = {(r["client"], r["round"], r["streams"]): r for r in rows}
    for (client, label, count), row in keyed.items():
        other = keyed.get(("aiohttp", label, count))
        if client == "aiohttp" or other is None:
            continue
        cpu = row["cpu_ms_per_stream"] / max(other["cpu_ms_per_stream"], 1e-9)
        wall = row["wall_s"] / max(other["wall_s"], 1e-9)
        lines.append(
            f"  {client:>11}, {count:>5} streams, {label}: CPU {cpu:.2f}x, wall {wall:.2f}x"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.http_clients", description=__doc__)
    parser.add_argument("--streams", default="1,100,1000", help="comma-separated sizes")
    parser.add_argument("--seconds", type=float, default=2.0, help="the model's reply time")
    parser.add_argument("--rate", type=float, default=60.0, help="pieces a second")
    parser.add_argument("--out", type=Path, help="also write the figures here (JSON)")
    parser.add_argument("--one", choices=CLIENTS, help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--pieces", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--server", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:  # a client process: its figures as JSON on stdout
        one = _rounds(args.one, args.url, int(args.streams), args.pieces, args.server)
        rows = asyncio.run(one)
        print(json.dumps(rows))
        return 0
    sizes = [int(n) for n in args.streams.split(",")]
    rows = compare(sizes, args.seconds, args.rate)
    print(f"Python {sys.version.split()[0]}, {os.cpu_count()} cores")
    print(table(rows, args.seconds))
    if args.out:
        args.out.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
