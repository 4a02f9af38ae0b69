"""The Relay app the benchmarks run (`relay worker --app bench.app:relay`).

Three tools: `noop` does nothing (its output can be padded, to grow history),
`wait` sleeps (and notes when it ran, for the batch benchmark), `approve_me`
needs a person's yes under the default policy.
"""

from __future__ import annotations

import os
import time
from typing import Any

import redis

from agent_core import Config, Risk
from workers import Relay, Settings, ToolContext

__all__ = ["CONFIG", "build", "relay", "waits_key"]

CONFIG = Config(require_plan=False, max_batch=8, max_calls=10_000)


def noop(n: int, size: int = 0) -> str:
    """Do nothing.

    Args:
        n: The turn number.
        size: Pad the output to this many characters.
    """
    text = f"ok {n}"
    return text + "." * max(0, size - len(text))


def wait(ms: int, i: int, context: ToolContext) -> str:
    """Sleep a while.

    Args:
        ms: Milliseconds to sleep.
        i: The call's number.
    """
    started = time.monotonic()
    time.sleep(ms / 1000)
    _note(waits_key(context.run_id), f"{i} {started!r} {time.monotonic()!r}")
    return f"waited {ms} ms ({i})"


def waits_key(run_id: str) -> str:
    """Where `wait` notes (call number, start, end) for a run, as time.monotonic() values."""
    return f"bench:waits:{run_id}"


_clients: list[Any] = []


def _note(key: str, line: str) -> None:
    if not _clients:
        _clients.append(redis.Redis.from_url(os.environ["RELAY_REDIS_URL"]))
    _clients[0].rpush(key, line)


def approve_me(n: int) -> str:
    """Change something (a person must say yes first).

    Args:
        n: What to change.
    """
    return f"changed {n}"


def build(settings: Settings | None = None) -> Relay:
    """Return the bench Relay (settings from the environment unless given)."""
    app = Relay("bench", config=CONFIG, settings=settings)
    app.tool(risk=Risk.READ)(noop)
    app.tool(risk=Risk.READ)(wait)
    app.tool(risk=Risk.WRITE)(approve_me)
    return app


relay = build()
