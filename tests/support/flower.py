"""A real `relay flower` on loopback for a test, and reading tasks back through its HTTP API."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import httpx

from tests.support.redis_server import free_port
from tests.support.worker_process import RelayProcess

__all__ = ["FINAL_STATES", "Flower", "relay_tasks"]

FINAL_STATES = {"SUCCESS", "FAILURE"}


class Flower:
    """`relay flower` behind basic auth on a free port; `client` is logged in."""

    def __init__(self, env: Mapping[str, str], log_path: Path) -> None:
        self.port = free_port()
        self.password = f"flower-{secrets.token_hex(8)}"
        flower_env = {**env, "RELAY_FLOWER_USER": "watcher", "RELAY_FLOWER_PASSWORD": self.password}
        # No --app: as the README starts it, on the RELAY_* settings alone.
        self.process = RelayProcess(
            ["flower", "--port", str(self.port)],
            flower_env,
            log_path,
            ready_text="Visit me at",
        )
        self.url = f"http://127.0.0.1:{self.port}"
        self.client = httpx.Client(base_url=self.url, auth=("watcher", self.password), timeout=10)

    def __enter__(self) -> Flower:
        self.process.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.client.close()
        self.process.stop()

    def tasks(self) -> dict[str, dict[str, Any]]:
        return dict(self.client.get("/api/tasks").raise_for_status().json())


def relay_tasks(
    flower: Flower, run_ids: Iterable[str], *, expected: int, timeout: float = 60
) -> list[dict[str, Any]]:
    """Return Flower's tasks of these runs once at least `expected` are there, all of them in a
    final state (or, after `timeout`, as they are, for the test to say what is wrong)."""
    runs = set(run_ids)
    deadline = time.monotonic() + timeout
    while True:
        mine = [
            task
            for task in flower.tasks().values()
            if str(task.get("args") or "").split(" ")[0].removeprefix("run=") in runs
        ]
        done = all(task.get("state") in FINAL_STATES for task in mine)
        if (done and len(mine) >= expected) or time.monotonic() > deadline:
            return mine
        time.sleep(0.5)
