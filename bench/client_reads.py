"""`python -m bench.client_reads [--streams 300,1000] [--rounds 3]`: Relay's model client
alone, its reads of many streamed replies spaced (as it ships) beside read as they come.

`ModelClient` spaces each streamed reply's reads while many stream at once
(`workers.model.transport._Reads`): the connection's reading is paused for a gap, so
the pieces sent meanwhile come in one read. This measures what that saves, and what
it costs in time. Each (variant, size, round) runs in a fresh client process of its
own, the variants interleaved; the model server (`bench.slow_model`, 60 pieces a
second for 2 s, usage at the end) runs in another process. In each, `streams` calls
start at once on one event loop, after a warm-up of 20: the figures are the client
process's CPU (user + system) a call, the wall time of the whole batch against the
model's 2 s, and the hand-overs of text a call (`on_text` calls; a reply is 120
pieces). `as they come` is the same client with the gap set to 0.

Not a test; not run by `bench.run` (the worker-level figures are `bench.inflight`'s).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from typing import Any

from bench.http_clients import slow_model

__all__ = ["main"]

VARIANTS = ("spaced", "as they come")
SECONDS, RATE = 2.0, 60.0


async def _one(url: str, streams: int) -> dict[str, Any]:
    """In a client process: `streams` calls at once; the figures."""
    from agent_core.steps import ModelRequest  # noqa: PLC0415 - the client process only
    from workers.model.transport import ModelClient  # noqa: PLC0415
    from workers.settings import ModelSettings  # noqa: PLC0415

    settings = ModelSettings(url=url, model="slow", deadline=120, read_timeout=60)
    request = ModelRequest(system="You are terse.", prompt="Say something long.")
    handed = 0

    def on_text(_piece: str) -> None:
        nonlocal handed
        handed += 1

    async with ModelClient(settings) as client:
        await asyncio.gather(*(client.complete(request, on_text=on_text) for _ in range(20)))
        handed = 0
        before, began = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
        replies = await asyncio.gather(
            *(client.complete(request, on_text=on_text) for _ in range(streams))
        )
        after, wall = resource.getrusage(resource.RUSAGE_SELF), time.monotonic() - began
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    whole = sum(1 for reply in replies if reply.usage.completion_tokens > 0)
    return {
        "cpu_ms_per_call": 1000 * cpu / streams,
        "wall_s": wall,
        "handed_per_call": handed / streams,
        "whole": whole,
    }


def _measure(variant: str, url: str, streams: int) -> dict[str, Any]:
    command = [sys.executable, "-m", "bench.client_reads", "--one", variant, "--url", url]
    command += ["--streams", str(streams)]
    done = subprocess.run(command, capture_output=True, text=True, check=True, timeout=600)
    return json.loads(done.stdout.strip().splitlines()[-1]) | {
        "variant": variant,
        "streams": streams,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.client_reads", description=__doc__)
    parser.add_argument("--streams", default="300,1000", help="comma-separated sizes")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each, interleaved")
    parser.add_argument("--one", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:  # a client process: its figures as JSON on stdout
        if args.one == "as they come":
            from workers.model import transport  # noqa: PLC0415

            transport.READ_GAP_S = 0.0
        print(json.dumps(asyncio.run(_one(args.url, int(args.streams)))))
        return 0
    rows: list[dict[str, Any]] = []
    with slow_model(SECONDS, RATE) as (url, _):
        base = url.removesuffix("/chat/completions")
        for streams in (int(n) for n in args.streams.split(",")):
            for _ in range(args.rounds):
                for variant in VARIANTS:
                    print(f"-- {variant}, {streams} streams ...", file=sys.stderr, flush=True)
                    rows.append(_measure(variant, base, streams))
    print(
        f"Python {sys.version.split()[0]}, {os.cpu_count()} cores; {RATE:g} pieces/s, {SECONDS:g} s"
    )
    print("variant | streams | CPU ms a call | wall s | hand-overs a call | whole replies")
    for row in rows:
        print(
            f"{row['variant']} | {row['streams']} | {row['cpu_ms_per_call']:.2f} | "
            f"{row['wall_s']:.2f} | {row['handed_per_call']:.1f} | {row['whole']}"
        )
    for streams in sorted({row["streams"] for row in rows}):
        cpu = {
            v: statistics.median(
                r["cpu_ms_per_call"] for r in rows if r["variant"] == v and r["streams"] == streams
            )
            for v in VARIANTS
        }
        ratio = cpu["spaced"] / max(cpu["as they come"], 1e-9)
        print(f"{streams} streams: spaced ÷ as they come, CPU a call (medians): {ratio:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
