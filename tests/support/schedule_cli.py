"""`relay schedule ...` through click's runner on a real Relay and a private Redis: the
fixture and the runner the schedule CLI tests share."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner, Result

from tests.apps.notes import build
from tests.support.redis_server import RedisServer
from workers import Relay, Settings
from workers.cli.schedule import schedule

__all__ = ["relay", "run"]


@pytest.fixture
def relay(tmp_path: Path) -> Iterator[Relay]:
    with RedisServer(tmp_path) as server:
        yield build(Settings.from_env({"RELAY_REDIS_URL": server.url}))


def run(relay: Relay, *args: str) -> Result:
    # The `relay` group hands its subcommands an object with a `.relay`; so does this.
    return CliRunner().invoke(schedule, list(args), obj=SimpleNamespace(relay=relay))
