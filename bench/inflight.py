"""Calls in flight per worker: runs whose model takes 2 s a reply, thousands at once.

`python -m bench.inflight [--variants loop,loop-1turn] [--runs 200]` runs the chosen
variants alone (a private Redis of its own); `python -m bench.run --only inflight`
runs them all. The model is `bench.slow_model` (asyncio, in a process of its own).
Each worker is measured alone on the same load:

- `carried`: `relay worker --pool prefork -c 2` with `RELAY_MODEL_CARRIED` high:
  each model task claims its call and ends; the process carries the call.
- `slots`: `--pool threads -c 64` with `RELAY_MODEL_CARRIED=0`: each call holds a
  slot for its 2 s.
- `threads carried`: the compose file's model worker as it is, `--pool threads
  -c 64` with carrying at its default.
- `solo carried`: `--pool solo`, carrying: one process, the issue's unit (calls in
  flight per model worker process).
- `carried tokens`: as `carried`, the model sending its reply a token at a time
  (TOKENS pieces over SECONDS), as hosted models do: what the live stream costs.
  These five get `{"final": "done"}` in 10 pieces (the tokens variant: 100), one
  model call a run.
- `loop` and `loop-1turn`: issue 53's load on one `--pool solo` process: every reply
  streamed at RATE pieces a second (4 characters each) with its usage at the end;
  `loop` runs make LOOP_TURNS model calls (`bench.slow_model --turns`: the agent's
  own `remember` tool, no tool step), `loop-1turn` runs one. Enough runs at once
  to hold 1,000 calls in flight, started 100 at a time (`Relay.start_many`: a
  message of 100 runs). The figures are the issue's: the most calls in
  flight the model saw, the worker's cores, its CPU per completed model call (run
  starts included), its memory per call in flight, its threads at the peak, and
  the event-loop lag p99 the worker exports (`bench.loop_lag`).

For each: the most calls the model saw at once, how long the runs took against
what the model allows (runs x model calls / most in flight x 2 s), the worker's
CPU (all its processes, from /proc) per wall second and per completed model call,
its memory per call in flight (RSS at the peak less before), its threads (all its
processes' /proc/PID/task) when the most calls were in flight, and Redis server
time per step (INFO commandstats; a run's steps counted as its advance and one a
model call).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.cluster import Counters, Worker, cpu_seconds, relay_worker, session_pids
from bench.context import Bench, bench
from bench.goals import goals_table
from bench.loop_lag import LagReader
from bench.report import machine, table
from tests.support.redis_server import free_port, wait_for_port

__all__ = ["LOOP_TURNS", "RATE", "SECONDS", "VARIANTS", "main", "run"]

SECONDS = 2.0
TOKENS = 100
"""The `carried-tokens` variant's reply: 400 characters in 100 pieces over SECONDS, a
model sending a token at a time (50 a second)."""
RATE = 60.0
"""Pieces a second of the `loop` variants' replies (issue 53: at least 30)."""
LOOP_TURNS = 5
"""Model calls a `loop` run makes (issue 53's 5-turn runs)."""
POLL_S = 0.2
LAG_EVERY = 5
"""Read the loop lag every this many polls (a /metrics scrape reads the whole fleet)."""
OUT = Path(__file__).resolve().parent / "out"


@dataclass(frozen=True)
class Shape:
    """How the model answers a variant's runs: pieces (or a rate) a reply, characters,
    model calls a run (`bench.slow_model`'s options)."""

    pieces: int = 10
    chars: int = 0
    rate: float | None = None
    turns: int = 1

    def serve_args(self) -> list[str]:
        args = ["--seconds", str(SECONDS), "--turns", str(self.turns)]
        if self.rate is not None:
            return [*args, "--rate", str(self.rate)]  # (4 characters a piece)
        return [*args, "--pieces", str(self.pieces), "--chars", str(self.chars)]


@dataclass(frozen=True)
class Variant:
    args: tuple[str, ...]
    carried: str | None
    """RELAY_MODEL_CARRIED: "runs" (as many as the runs), "0", or None (the default)."""
    runs: tuple[int, int]
    """Runs at once, full and quick."""
    shape: Shape = Shape()
    lag: bool = False
    """Read the loop lag the worker exports (relay web's /metrics)."""


PREFORK = ("--pool", "prefork", "-c", "2")
THREADS = ("--pool", "threads", "-c", "64")
SOLO = ("--pool", "solo")
LOOP_SHAPE = Shape(rate=RATE, turns=LOOP_TURNS)
VARIANTS: dict[str, Variant] = {
    "carried": Variant(PREFORK, "runs", (2_000, 300)),
    "slots": Variant(THREADS, "0", (640, 192)),
    "threads-carried": Variant(THREADS, "runs", (2_000, 300)),
    "solo-carried": Variant(SOLO, "runs", (2_000, 300)),
    "carried-tokens": Variant(PREFORK, "runs", (1_000, 200), Shape(TOKENS, TOKENS * 4)),
    # Issue 53's unit: one process. Each run holds one call at a time, so as many runs
    # as calls wanted in flight, and some more for those between two calls.
    "loop": Variant(SOLO, "runs", (1_200, 200), LOOP_SHAPE, lag=True),
    "loop-1turn": Variant(SOLO, "runs", (1_200, 200), Shape(rate=RATE), lag=True),
}


def _rss_mb(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1])
    return total / 1024


def _threads(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            total += len(os.listdir(f"/proc/{pid}/task"))
        except OSError:
            continue
    return total


def _stats(url: str) -> dict[str, int]:
    with urllib.request.urlopen(f"{url}/stats", timeout=10) as answer:
        found: dict[str, int] = json.loads(answer.read())
    return found


@dataclass
class _Peak:
    """The worker at its busiest, from samples taken while the runs go on."""

    worker: Worker
    hostname: str
    stats_url: str
    rss_mb: float
    lag: LagReader | None
    polls: int = 0
    most_seen: int = 0
    """The most calls in flight a sample saw (the server counts the exact most)."""
    threads_at_peak: int = 0
    threads_most: int = 0
    lag_p99_s: float | None = None

    def sample(self) -> None:
        pids = session_pids(self.worker.pid)
        now = _stats(self.stats_url)["in_flight"]
        threads = _threads(pids)
        self.rss_mb = max(self.rss_mb, _rss_mb(pids))
        self.threads_most = max(self.threads_most, threads)
        if now >= self.most_seen:
            self.most_seen, self.threads_at_peak = now, threads
        if self.lag is not None and self.polls % LAG_EVERY == 0:
            lag = self.lag.p99(self.hostname)
            if lag is not None:
                self.lag_p99_s = max(lag, self.lag_p99_s or 0.0)
        self.polls += 1


START_MANY = 100
"""Runs started together (`Relay.start_many`): their first steps go as one message, so a
solo worker takes a hundred runs in one delivery, not one run a message."""


def _start(b: Bench, runs: int, marker: str, turns: int) -> float:
    """Start `runs` runs, START_MANY at a time; return the seconds it took. Runs of several
    turns can `remember` (`notes=[]`): the model's way to ask for another turn with no tool."""
    began = time.monotonic()
    tasks = [f"{marker} {n}: answer" for n in range(runs)]
    options: dict[str, Any] = {"notes": []} if turns > 1 else {}
    for first in range(0, runs, START_MANY):
        b.relay.start_many(tasks[first : first + START_MANY], **options)
    return time.monotonic() - began


def _load(
    b: Bench, worker: Worker, stats_url: str, runs: int, marker: str, *, turns: int,
    lag: LagReader | None,
) -> dict[str, Any]:  # fmt: skip
    """Start `runs` runs at once; follow them to the end; return the figures."""
    pids = session_pids(worker.pid)
    time.sleep(1.0)  # the worker settles: its RSS before any call
    rss_before, cpu_before = _rss_mb(pids), cpu_seconds(pids)
    answered_before = _stats(stats_url)["answered"]
    redis_before = Counters.read(b.redis)
    peak = _Peak(worker, f"{marker}@", stats_url, rss_before, lag)
    began = time.monotonic()
    started_s = _start(b, runs, marker, turns)
    while b.relay.count_runs("done") < runs:
        if time.monotonic() - began > 900:
            raise TimeoutError(f"{marker}: {b.relay.count_runs('done')} of {runs} runs done")
        peak.sample()
        time.sleep(POLL_S)
    took = time.monotonic() - began
    cpu = cpu_seconds(session_pids(worker.pid)) - cpu_before
    redis = Counters.read(b.redis).since(redis_before)
    stats = _stats(stats_url)
    most, calls = stats["most"], stats["answered"] - answered_before
    steps = runs * (1 + turns)
    allowed = runs * turns / max(most, 1) * SECONDS
    return {
        "runs": runs,
        "turns": turns,
        "model_calls": calls,
        "start_s": round(started_s, 2),
        "most_in_flight": most,
        "took_s": round(took, 2),
        "model_allows_s": round(allowed, 2),
        "took_over_allowed": round(took / allowed, 2),
        "runs_per_s": round(runs / took, 1),
        "worker_cores_busy": round(cpu / took, 2),
        "worker_cpu_ms_per_run": round(cpu * 1000 / runs, 2),
        "worker_cpu_ms_per_model_call": round(cpu * 1000 / max(calls, 1), 2),
        "rss_mb_before": round(rss_before, 1),
        "rss_mb_peak": round(peak.rss_mb, 1),
        "kb_per_call_in_flight": round((peak.rss_mb - rss_before) * 1024 / max(most, 1), 1),
        "threads_at_peak": peak.threads_at_peak,
        "threads_most": peak.threads_most,
        "loop_lag_p99_ms": None if peak.lag_p99_s is None else round(peak.lag_p99_s * 1000, 2),
        # (INFO commandstats, summed: a script's commands count twice, in their own lines
        # and in its EVALSHA; the main thread's CPU is what the Redis server spent.)
        "redis_us_per_step": round(redis.total_usec / steps, 1),
        "stream_events_per_run": round(redis.calls.get("xadd", 0) / runs, 1),
        "redis_cpu_us_per_step": round(redis.cpu_usec / steps, 1),
    }


def _variant(b: Bench, name: str, runs: int) -> Any:
    variant = VARIANTS[name]
    port = free_port()
    serve = ["--port", str(port), *variant.shape.serve_args()]
    model = subprocess.Popen(  # its own process: its CPU is not the worker's or ours
        [sys.executable, "-m", "bench.slow_model", *serve],
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )
    carried = {"runs": str(runs), "0": "0", None: None}[variant.carried]
    try:
        wait_for_port(port, 30)
        url = f"http://127.0.0.1:{port}"
        worker_env = {**b.env, "RELAY_MODEL_URL": f"{url}/v1"}
        if carried is not None:
            worker_env["RELAY_MODEL_CARRIED"] = carried
        log = b.directory / f"inflight-{name}.log"
        worker = relay_worker(worker_env, log, f"inflight-{name}", *variant.args).start()
        with ExitStack() as stack:
            stack.callback(worker.stop)
            lag = None
            if variant.lag:
                lag = stack.enter_context(LagReader(b.env, b.directory / f"web-{name}.log"))
            turns = variant.shape.turns
            return _load(b, worker, url, runs, f"inflight-{name}", turns=turns, lag=lag)
    finally:
        model.terminate()
        model.wait(30)
        b.clear()


def run(b: Bench, names: list[str] | None = None, runs: int | None = None) -> dict[str, Any]:
    """Calls in flight per model worker process: every variant in `names` (default: all)."""
    found: dict[str, Any] = {"seconds_per_reply": SECONDS, "tokens_per_reply": TOKENS}
    found |= {"loop_pieces_per_s": RATE, "loop_turns": LOOP_TURNS}
    for name in names or list(VARIANTS):
        count = runs or b.pick(*VARIANTS[name].runs)
        found[name.replace("-", "_")] = _variant(b, name, count)
    if "carried" in found and "slots" in found:
        ratio = found["carried"]["most_in_flight"] / max(found["slots"]["most_in_flight"], 1)
        found["in_flight_ratio"] = round(ratio, 1)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.inflight", description=__doc__)
    parser.add_argument("--variants", default="loop,loop-1turn", help=", ".join(VARIANTS))
    parser.add_argument("--runs", type=int, help="runs at once (default: each variant's)")
    parser.add_argument("--quick", action="store_true", help="the variants' quick sizes")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.variants.split(",")]
    unknown = sorted(set(names) - set(VARIANTS))
    if unknown:
        parser.error(f"unknown variants: {', '.join(unknown)}")
    work = OUT / "work-inflight"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    with bench(work, quick=args.quick) as b:
        found = run(b, names, args.runs)
        results = {"machine": machine(), "quick": args.quick, "benchmarks": {"inflight": found}}
        results["inline_ms"] = os.environ.get("RELAY_INLINE_MS") or "250 (default)"
        results["machine"]["redis"] = b.redis.info("server")["redis_version"]
    (OUT / "inflight.json").write_text(json.dumps(results, indent=2) + "\n")
    print(table(results))
    print()
    print(goals_table(results["benchmarks"]))
    print(f"\nfull figures: {OUT / 'inflight.json'}  (logs: {work})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
