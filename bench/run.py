"""`python -m bench.run [--quick] [--only turns,batch,...] [--inline 250,0]`: every benchmark.

Starts a private Redis, a loopback model server and worker processes (each
stopped by its own process group when its benchmark ends), runs the chosen
benchmarks in one go, prints a table of figures and ratios against the goals
and issue 53's goals table (`bench.goals`), and writes everything to
bench/out/results.json. Not a test; not run in CI.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench import (
    admission,
    batch,
    evals,
    growth,
    inflight,
    journal,
    live,
    many,
    outage,
    peers,
    recovery,
    routes,
    stored_bytes,
    turns,
    waiting,
)
from bench.context import Bench, bench
from bench.goals import goal_rows, goals_table
from bench.report import machine, table

__all__ = ["main"]

OUT = Path(__file__).resolve().parent / "out"

BENCHMARKS: dict[str, Callable[..., dict[str, Any]]] = {
    "turns": turns.run,
    "batch": batch.run,
    "many": many.run,
    "waiting": waiting.run,
    "growth": growth.run,
    "peers": peers.run,
    "recovery": recovery.run,
    "outage": outage.run,
    "admission": admission.run,
    "routes": routes.run,
    "live": live.run,
    "journal": journal.run,
    "evals": evals.run,
    "inflight": inflight.run,
    "stored": stored_bytes.run,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smaller sizes (about 3 minutes)")
    parser.add_argument("--only", help=f"comma-separated subset of: {', '.join(BENCHMARKS)}")
    parser.add_argument("--out", type=Path, default=OUT / "results.json")
    parser.add_argument(
        "--inline",
        help="comma-separated RELAY_INLINE_MS values (e.g. 250,0): the benchmarks run once"
        " per value, each printed (default: the environment's, else Relay's 250)",
    )
    args = parser.parse_args(argv)
    chosen = [n.strip() for n in args.only.split(",")] if args.only else list(BENCHMARKS)
    unknown = sorted(set(chosen) - set(BENCHMARKS))
    if unknown:
        parser.error(f"unknown benchmarks: {', '.join(unknown)}")
    inlines = [v.strip() for v in args.inline.split(",")] if args.inline else [None]
    if not all(v is None or v.isdigit() for v in inlines):
        parser.error("--inline takes whole numbers of milliseconds, like 250,0")
    for inline in inlines:
        out = args.out if len(inlines) == 1 else args.out.with_suffix(f".inline{inline}.json")
        _pass(chosen, args.quick, inline, out)
    return 0


def _pass(chosen: list[str], quick: bool, inline: str | None, out: Path) -> None:
    """Run the chosen benchmarks once, with RELAY_INLINE_MS `inline` (None: as set)."""
    if inline is not None:  # the workers started below inherit it
        os.environ["RELAY_INLINE_MS"] = inline
    work = OUT / "work"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    started = time.monotonic()
    results: dict[str, Any] = {"machine": machine(), "quick": quick, "benchmarks": {}}
    results["inline_ms"] = os.environ.get("RELAY_INLINE_MS") or "250 (default)"
    with bench(work, quick=quick) as b:
        results["machine"]["redis"] = b.redis.info("server")["redis_version"]
        for name in chosen:
            results["benchmarks"][name] = _one(b, name)
            results["seconds"] = round(time.monotonic() - started, 1)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(results, indent=2, default=str) + "\n")
    # Issue 53's goals, read from the figures of this same run.
    results["goals"] = [asdict(row) for row in goal_rows(results["benchmarks"])]
    out.write_text(json.dumps(results, indent=2, default=str) + "\n")
    print(table(results))
    print()
    print(goals_table(results["benchmarks"]))
    print(f"\nfull figures: {out}  (logs and samples: {work})")


def _one(b: Bench, name: str) -> dict[str, Any]:
    """Run one benchmark; a failure is recorded (with its traceback) and the rest go on."""
    began = time.monotonic()
    print(f"-- {name} ...", file=sys.stderr, flush=True)
    b.clear()
    try:
        found = BENCHMARKS[name](b)
    except Exception as error:  # noqa: BLE001 - one broken benchmark must not lose the others
        traceback.print_exc()
        found = {"error": f"{type(error).__name__}: {error}"}
    found["seconds"] = round(time.monotonic() - began, 1)
    b.results[name] = found
    print(f"   {name}: {found['seconds']} s", file=sys.stderr, flush=True)
    return found


if __name__ == "__main__":
    sys.exit(main())
