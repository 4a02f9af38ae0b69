"""Model clients in synchronous tests: their calls are coroutines on the process's loop.

A test drives a call with `workers.loop.run_blocking(client.complete(...))`, as a CLI
command does; `opened` closes the client on that same loop (its connections belong to it).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from workers.loop import run_blocking
from workers.model.transport import ModelClient

__all__ = ["opened"]


@contextmanager
def opened(client: ModelClient) -> Iterator[ModelClient]:
    """`client`, closed when the block ends, on the process's loop that made its calls."""
    try:
        yield client
    finally:
        run_blocking(client.aclose())
