"""Bare Celery on the same broker and settings as Relay: chains of no-op hops.

`celery -A bench.bare:app worker -Q bare` runs it. Each `bare.hop` sends the
next hop of its chain (as a Relay task sends the next step) until none are
left; the last one pushes "chain time.monotonic()" onto `<queue>:done`, so the
driver can time whole chains (CLOCK_MONOTONIC is shared by every process of
the machine).

BENCH_BROKER_URL names the broker, BENCH_QUEUE the queue (default `bare`), and
BENCH_EVENTS=0 turns task events off (Relay turns them on: `-E` and
`task_send_sent_event`), to show what events cost.
"""

from __future__ import annotations

import os
import time
from typing import Any

import redis
from celery import Celery

from workers.celery_app.app import delivery_settings, visibility_timeout
from workers.settings import Settings

__all__ = ["app", "build_app", "done_key", "send_hop"]


def done_key(queue: str) -> str:
    return f"{queue}:done"


def build_app(broker_url: str, *, events: bool, queue: str = "bare") -> Celery:
    """Return a plain Celery app configured as `workers.celery_app.app.build_celery` does."""
    celery = Celery("bare", broker=broker_url, set_as_current=False)
    timeout = visibility_timeout(Settings.from_env({}))
    celery.conf.update(**delivery_settings(timeout, events=events), task_default_queue=queue)
    return celery


def send_hop(celery: Celery, chain: str, left: int) -> None:
    """Send one hop of `chain` with `left` hops after it (a deterministic id, as Relay's)."""
    celery.send_task(
        "bare.hop",
        args=[chain, left],
        task_id=f"{chain}:{left}",
        argsrepr=f"chain={chain} left={left}",
        queue=celery.conf.task_default_queue,
    )


_BROKER = os.environ.get("BENCH_BROKER_URL", "redis://127.0.0.1:6379/0")
_QUEUE = os.environ.get("BENCH_QUEUE", "bare")
app = build_app(_BROKER, events=os.environ.get("BENCH_EVENTS", "1") != "0", queue=_QUEUE)
_done: list[Any] = []


@app.task(name="bare.hop")
def hop(chain: str, left: int) -> None:
    if left > 0:
        send_hop(app, chain, left - 1)
        return
    if not _done:
        _done.append(redis.Redis.from_url(_BROKER))
    _done[0].rpush(done_key(_QUEUE), f"{chain} {time.monotonic()!r}")
