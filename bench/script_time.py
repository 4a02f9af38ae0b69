"""Redis's time in each of Relay's scripts, a call at a time.

`python -m bench.script_time [--runs 20] [--turns 20]`: runs that many runs in process
(`bench.inprocess`, no Celery, the model a function call) on a private Redis while
recording every command the runtime sends; then replays the recording, in order, on a
second private Redis (emptied before each of two passes, the first a warm-up), and
reads INFO commandstats around each EVALSHA. So each script's time is its own: no
other client, no MONITOR, no slowlog (which would log, and slow, every command a
script runs). Prints µs per call of each script (its commands included) and per turn.
Not a test, not in CI.
"""

from __future__ import annotations

import argparse
import hashlib
import tempfile
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import redis
import redis.connection

from bench.inprocess import LocalModel, LocalRuntime
from bench.model import Task
from workers import Settings
from workers.store import scripts
from workers.store.codec import as_text

_PACKERS = (redis.connection.HiredisRespSerializer, redis.connection.PythonRespSerializer)
"""redis-py packs every command (pipelines included) with one of these: hiredis's when
it is installed, else its own."""


@contextmanager
def _recording() -> Iterator[list[tuple[Any, ...]]]:
    """Every command packed meanwhile, in order."""
    sent: list[tuple[Any, ...]] = []
    packs = [packer.pack for packer in _PACKERS]

    def keeping(pack: Any) -> Any:
        def keep(self: Any, *args: Any) -> Any:
            sent.append(args)
            return pack(self, *args)

        return keep

    for packer, pack in zip(_PACKERS, packs, strict=True):
        packer.pack = keeping(pack)  # type: ignore[method-assign]
    try:
        yield sent
    finally:
        for packer, pack in zip(_PACKERS, packs, strict=True):
            packer.pack = pack  # type: ignore[method-assign]


def _record(url: str, runs: int, turns: int) -> list[tuple[Any, ...]]:
    with LocalRuntime(Settings.from_env({"RELAY_REDIS_URL": url}), LocalModel()) as local:
        local.start(Task("warm", turns=3))
        local.drain()
        with _recording() as sent:
            for n in range(runs):
                local.start(Task(f"timed-{n}", turns=turns))
                local.drain()
    return list(sent)


def _replay(url: str, sent: list[tuple[Any, ...]]) -> tuple[Counter[str], Counter[str]]:
    """(calls, µs) of each script on the second of two passes."""
    every = [path.stem for path in (Path(scripts.__file__).parent / "lua").glob("*.lua")]
    names = {hashlib.sha1(scripts.lua(n).encode()).hexdigest(): n for n in every}
    client = redis.Redis.from_url(url)
    for name in every:
        client.script_load(scripts.lua(name))
    calls: Counter[str] = Counter()
    usec: Counter[str] = Counter()
    for timed in (False, True):
        client.flushall()
        for args in sent:
            name = names.get(as_text(args[1])) if as_text(args[0]).upper() == "EVALSHA" else None
            before = _evalsha_usec(client) if name else 0
            with suppress(redis.ResponseError):  # (as the runtime met it: the replay goes on)
                client.execute_command(*args)
            if name and timed:
                calls[name] += 1
                usec[name] += _evalsha_usec(client) - before
    return calls, usec


def _evalsha_usec(client: redis.Redis) -> int:
    stats = client.info("commandstats").get("cmdstat_evalsha", {})
    return int(stats.get("usec", 0))


def measure(runs: int, turns: int) -> dict[str, Any]:
    from tests.support.redis_server import RedisServer  # noqa: PLC0415 - a bench-only import

    with tempfile.TemporaryDirectory() as work:
        recorded, replayed = Path(work) / "recorded", Path(work) / "replayed"
        recorded.mkdir()
        replayed.mkdir()
        with RedisServer(recorded) as server:
            sent = _record(server.url, runs, turns)
        with RedisServer(replayed) as server:
            calls, usec = _replay(server.url, sent)
    total_turns = runs * turns
    return {
        name: {
            "calls_per_turn": round(calls[name] / total_turns, 2),
            "us_per_call": round(usec[name] / calls[name], 1),
            "us_per_turn": round(usec[name] / total_turns, 1),
        }
        for name in sorted(calls, key=lambda n: -usec[n])
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.script_time", description=__doc__)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--turns", type=int, default=20)
    args = parser.parse_args(argv)
    found = measure(args.runs, args.turns)
    for name, figures in found.items():
        print(
            f"{name:>12}: {figures['us_per_call']:6.1f} µs a call,"
            f" {figures['calls_per_turn']:5.2f} calls and {figures['us_per_turn']:6.1f} µs a turn"
        )
    print(f"{'all':>12}: {sum(f['us_per_turn'] for f in found.values()):6.1f} µs a turn")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
