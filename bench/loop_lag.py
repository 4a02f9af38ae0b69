"""The event-loop lag a worker exports, read where an operator reads it: relay web's /metrics.

Issue 53 has each worker's loop export its lag as the gauge
`relay_loop_lag_seconds{worker="...",quantile="0.99"}`. `LagReader` starts a
`relay web` on the bench's Redis and reads that gauge for one worker; a worker
(or a Relay) that does not export it reads as None, which the bench prints as
"not exported": a figure the bench cannot see is never made up.
"""

from __future__ import annotations

import re
import secrets
import sys
from collections.abc import Mapping
from pathlib import Path

import httpx

from bench.cluster import Worker
from tests.support.redis_server import free_port

__all__ = ["GAUGE", "LagReader", "p99_of"]

GAUGE = "relay_loop_lag_seconds"
_SAMPLE = re.compile(rf"^{GAUGE}\{{(?P<labels>[^}}]*)\}}\s+(?P<value>\S+)", re.MULTILINE)
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def p99_of(text: str, worker: str) -> float | None:
    """The p99 lag (seconds) that the /metrics `text` gives for the worker whose
    `worker` label contains `worker` (its hostname, `name@host`); None if it has none."""
    found = []
    for sample in _SAMPLE.finditer(text):
        labels = dict(_LABEL.findall(sample["labels"]))
        if labels.get("quantile") == "0.99" and worker in labels.get("worker", ""):
            found.append(float(sample["value"]))
    return max(found) if found else None


class LagReader:
    """A `relay web` for `bench.app:relay` on a free port; `p99(worker)` scrapes it."""

    def __init__(self, env: Mapping[str, str], log: Path) -> None:
        self.port = free_port()
        password = secrets.token_hex(8)
        command = ["-c", "from workers.cli import main; main()", "--app", "bench.app:relay"]
        web_env = {**env, "RELAY_WEB_USER": "bench", "RELAY_WEB_PASSWORD": password}
        self.web = Worker([sys.executable, *command, "web", "--port", str(self.port)], web_env, log)
        self.client = httpx.Client(
            base_url=f"http://127.0.0.1:{self.port}", auth=("bench", password), timeout=10
        )

    def p99(self, worker: str) -> float | None:
        answer = self.client.get("/metrics")
        answer.raise_for_status()
        return p99_of(answer.text, worker)

    def __enter__(self) -> LagReader:
        self.web.start(ready="Uvicorn running on")
        return self

    def __exit__(self, *_: object) -> None:
        self.client.close()
        self.web.stop()
