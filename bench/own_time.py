"""Relay's own time per turn in process, each next step continued in place or each its own
message, the model a function call.

`python -m bench.own_time [--runs 30] [--turns 20]`: on a private Redis, runs `runs` runs
of `turns` turns through the runtime's task bodies (`bench.inprocess`, no Celery, no
HTTP), once continuing each next step in place as a worker that consumes every queue
does (its calls claimed with the save before them) and once with every step a message
of its own, alternating run by run; prints the median and the fastest run's ms a turn
of each. What is left is Relay's own work: the engine, the codec, the scripts' round
trips. Not a test, not in CI.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from statistics import median

from agent_core import Stop
from bench.inprocess import LocalModel, LocalRuntime
from bench.model import Task
from workers import Settings

WAYS = ("continued", "each step a message")


def measure(runs: int, turns: int) -> dict[str, list[float]]:
    """Each way's ms a turn, one figure a run."""
    from tests.support.redis_server import RedisServer  # noqa: PLC0415 - a bench-only import

    with (
        tempfile.TemporaryDirectory() as work,
        RedisServer(Path(work)) as server,
        ExitStack() as stack,  # (the runtimes stop first: their counts reach Redis)
    ):
        # (A slice longer than any run here: every next step is continued.)
        env = {"RELAY_REDIS_URL": server.url, "RELAY_INLINE_MS": "600000"}
        settings = Settings.from_env(env)
        locals_ = {
            way: stack.enter_context(LocalRuntime(settings, LocalModel(), continued=way == WAYS[0]))
            for way in WAYS
        }
        for way, local in locals_.items():
            local.start(Task(f"warm-{_tag(way)}", turns=5))
            local.drain()
        found: dict[str, list[float]] = {way: [] for way in WAYS}
        for n in range(runs):
            for way, local in locals_.items():
                began = time.perf_counter()
                run_id = local.start(Task(f"{_tag(way)}-{n}", turns=turns))
                local.drain()
                found[way].append((time.perf_counter() - began) * 1000 / turns)
                _check_done(local, run_id)
        return found


def _check_done(local: LocalRuntime, run_id: str) -> None:
    """A run timed here must have run to its end (a failing one would be fast)."""
    found = local.relay.store.read(run_id)
    outcome = None if found is None else found[0].outcome
    if outcome is None or outcome.stop is not Stop.DONE:
        raise SystemExit(f"run {run_id} did not finish its turns: {outcome}")


def _tag(way: str) -> str:
    """`way` as a bench task's name takes it (one word)."""
    return way.replace(" ", "-")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.own_time", description=__doc__)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--turns", type=int, default=20)
    args = parser.parse_args(argv)
    for way, times in measure(args.runs, args.turns).items():
        print(f"{way:>20}: {median(times):.3f} ms a turn (median), {min(times):.3f} (fastest)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
