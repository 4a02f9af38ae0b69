"""What a carried model call costs a worker's CPU, piece by piece, side by side.

`python -m bench.call_costs [--calls 1000] [--at-once 200]`: not a test, not in CI.

1. The HTTP client at many calls in flight: `--calls` calls, `--at-once` at a time,
   against `bench.slow_model` in a process of its own replying in 2 s (10 streamed
   pieces); this process's CPU a call, plain and streamed, with httpx's sync client (each
   call on a thread, as the carrier made them) and with its AsyncClient on one event
   loop (as the model client made them before it moved to aiohttp, issue 53).
2. A Celery task that raises `Ignore` against one that returns (what a carried call's
   task did before `NoFinalEvent`, and does now): Celery's tracer run in process, CPU a
   task.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
from celery import Celery
from celery.app.trace import build_tracer
from celery.exceptions import Ignore

from tests.support.redis_server import free_port, wait_for_port

__all__ = ["main"]

LIMITS = httpx.Limits(max_connections=None, max_keepalive_connections=None, keepalive_expiry=5.0)
"""No cap on connections, kept or in use: how the model client held httpx's pool before it
moved to aiohttp (issue 53)."""

BODY = {"model": "bench", "messages": [{"role": "user", "content": "hello"}]}


def _calls(client: httpx.Client, *, streamed: bool) -> Callable[[], None]:
    def plain() -> None:
        client.post("/chat/completions", json=BODY).raise_for_status()

    def stream() -> None:
        with client.stream("POST", "/chat/completions", json=BODY | {"stream": True}) as reply:
            for _ in reply.iter_lines():
                pass

    return stream if streamed else plain


def _cpu_ms_a_call(call: Callable[[], None], calls: int, at_once: int) -> float:
    with ThreadPoolExecutor(at_once) as pool:
        list(pool.map(lambda _: call(), range(at_once)))  # every connection opened first
        began = time.process_time()
        list(pool.map(lambda _: call(), range(calls)))
        return (time.process_time() - began) * 1000 / calls


SLOW_MODEL = (sys.executable, "-m", "bench.slow_model")


def _async_cpu_ms_a_call(url: str, calls: int, at_once: int, *, streamed: bool) -> float:
    async def run() -> float:
        async with httpx.AsyncClient(base_url=url, timeout=30, limits=LIMITS) as client:

            async def call() -> None:
                if not streamed:
                    (await client.post("/chat/completions", json=BODY)).raise_for_status()
                    return
                body = BODY | {"stream": True}
                async with client.stream("POST", "/chat/completions", json=body) as reply:
                    async for _ in reply.aiter_lines():
                        pass

            async def some(count: int) -> None:
                turns = asyncio.Semaphore(at_once)

                async def one() -> None:
                    async with turns:
                        await call()

                await asyncio.gather(*(one() for _ in range(count)))

            await some(at_once)  # every connection opened first
            began = time.process_time()
            await some(calls)
            return (time.process_time() - began) * 1000 / calls

    return asyncio.run(run())


def http_client(calls: int, at_once: int) -> dict[str, float]:
    """This process's CPU ms a call, by client and kind of reply."""
    port = free_port()
    model = subprocess.Popen(  # (its own process: its CPU is not counted here)
        [*SLOW_MODEL, "--port", str(port), "--seconds", "2", "--pieces", "10", "--chars", "0"],
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_for_port(port, 30)
        url = f"http://127.0.0.1:{port}/v1"
        found = {}
        with httpx.Client(base_url=url, timeout=30, limits=LIMITS) as client:
            for streamed in (False, True):
                kind = "streamed" if streamed else "plain"
                call = _calls(client, streamed=streamed)
                found[f"threads, {kind}"] = _cpu_ms_a_call(call, calls, at_once)
        for streamed in (False, True):
            kind = "streamed" if streamed else "plain"
            ms = _async_cpu_ms_a_call(url, calls, at_once, streamed=streamed)
            found[f"one loop, {kind}"] = ms
        return found
    finally:
        model.terminate()
        model.wait(30)


def task_ends(tasks: int = 2_000) -> dict[str, float]:
    """CPU ms a task through Celery's tracer: one that raises Ignore, one that returns."""
    app = Celery("bench-ends", broker="memory://")
    app.conf.task_ignore_result = True

    @app.task(bind=True, shared=False)
    def ignores(_task: Any) -> str:
        raise Ignore("m1: carried by this worker")

    @app.task(bind=True, shared=False)
    def returns(_task: Any) -> str:
        return "m1: carried by this worker"

    found = {}
    for name, task in (("raises Ignore", ignores), ("returns", returns)):
        trace = build_tracer(task.name, task, app=app, hostname="bench", eager=False)
        for _ in range(50):
            trace(str(uuid.uuid4()), [], {}, {"hostname": "bench"})
        began = time.process_time()
        for _ in range(tasks):
            trace(str(uuid.uuid4()), [], {}, {"hostname": "bench"})
        found[name] = (time.process_time() - began) * 1000 / tasks
    return found


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.call_costs", description=__doc__)
    parser.add_argument("--calls", type=int, default=1_000)
    parser.add_argument("--at-once", type=int, default=200)
    args = parser.parse_args()
    print(f"HTTP client, {args.calls} calls, {args.at_once} at once, 2 s a reply: CPU a call")
    for name, ms in http_client(args.calls, args.at_once).items():
        print(f"  {name:28s} {ms:6.2f} ms")
    print("A Celery task's end, in process: CPU a task")
    for name, ms in task_ends().items():
        print(f"  {name:28s} {ms:6.3f} ms")


if __name__ == "__main__":
    main()
