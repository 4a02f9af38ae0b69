"""Calls in flight per worker: runs whose model takes 2 s a reply, thousands at once.

The model is `bench.slow_model` (asyncio, in a process of its own): every reply
streams `{"final": "done"}` in 10 events over `SECONDS`, so each run is one
advance and one model call. Two workers, each measured alone on the same load:

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

For each: the most calls the model saw at once, how long the runs took against
what the model allows (runs / most in flight x 2 s), the worker's CPU (all its
processes, from /proc) per wall second, its memory per call in flight (RSS at
the peak less before), and Redis server time per step (INFO commandstats).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench.cluster import Counters, Worker, cpu_seconds, relay_worker, session_pids
from bench.context import Bench
from tests.support.redis_server import free_port, wait_for_port

__all__ = ["SECONDS", "run"]

SECONDS = 2.0
STEPS_PER_RUN = 2
"""An advance (it asks the model) and the model call (its final answer ends the run)."""
TOKENS = 100
"""The `carried-tokens` variant's reply: 400 characters in 100 pieces over SECONDS, a
model sending a token at a time (50 a second)."""


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


def _stats(url: str) -> dict[str, int]:
    with urllib.request.urlopen(f"{url}/stats", timeout=10) as answer:
        found: dict[str, int] = json.loads(answer.read())
    return found


def _load(b: Bench, worker: Worker, stats_url: str, runs: int, marker: str) -> dict[str, Any]:
    """Start `runs` runs at once; follow them to the end; return the figures."""
    pids = session_pids(worker.pid)
    time.sleep(1.0)  # the worker settles: its RSS before any call
    rss_before, cpu_before = _rss_mb(pids), cpu_seconds(pids)
    redis_before = Counters.read(b.redis)
    began = time.monotonic()
    for n in range(runs):
        b.relay.start(f"{marker} {n}: answer")
    started_s = time.monotonic() - began
    peak_rss, most = rss_before, 0
    while b.relay.count_runs("done") < runs:
        if time.monotonic() - began > 600:
            raise TimeoutError(f"{marker}: {b.relay.count_runs('done')} of {runs} runs done")
        most = max(most, _stats(stats_url)["most"])
        peak_rss = max(peak_rss, _rss_mb(session_pids(worker.pid)))
        time.sleep(0.2)
    took = time.monotonic() - began
    cpu = cpu_seconds(session_pids(worker.pid)) - cpu_before
    redis = Counters.read(b.redis).since(redis_before)
    most = max(most, _stats(stats_url)["most"])
    allowed = runs / max(most, 1) * SECONDS
    return {
        "runs": runs,
        "start_s": round(started_s, 2),
        "most_in_flight": most,
        "took_s": round(took, 2),
        "model_allows_s": round(allowed, 2),
        "took_over_allowed": round(took / allowed, 2),
        "runs_per_s": round(runs / took, 1),
        "worker_cores_busy": round(cpu / took, 2),
        "worker_cpu_ms_per_run": round(cpu * 1000 / runs, 2),
        "rss_mb_before": round(rss_before, 1),
        "rss_mb_peak": round(peak_rss, 1),
        "kb_per_call_in_flight": round((peak_rss - rss_before) * 1024 / max(most, 1), 1),
        # (INFO commandstats, summed: a script's commands count twice, in their own lines
        # and in its EVALSHA; the main thread's CPU is what the Redis server spent.)
        "redis_us_per_step": round(redis.total_usec / (runs * STEPS_PER_RUN), 1),
        "stream_events_per_run": round(redis.calls.get("xadd", 0) / runs, 1),
        "redis_cpu_us_per_step": round(redis.cpu_usec / (runs * STEPS_PER_RUN), 1),
    }


def _variant(
    b: Bench,
    name: str,
    runs: int,
    args: tuple[str, ...],
    env: dict[str, str],
    *,
    pieces: int = 10,
    chars: int = 0,
) -> Any:
    port = free_port()
    serve = ["--port", str(port), "--seconds", str(SECONDS), "--pieces", str(pieces)]
    serve += ["--chars", str(chars)]
    model = subprocess.Popen(  # its own process: its CPU is not the worker's or ours
        [sys.executable, "-m", "bench.slow_model", *serve],
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_for_port(port, 30)
        url = f"http://127.0.0.1:{port}"
        worker_env = {**b.env, "RELAY_MODEL_URL": f"{url}/v1", **env}
        log = b.directory / f"inflight-{name}.log"
        worker = relay_worker(worker_env, log, f"inflight-{name}", *args).start()
        with worker:
            return _load(b, worker, url, runs, f"inflight-{name}")
    finally:
        model.terminate()
        model.wait(30)
        b.clear()


def run(b: Bench) -> dict[str, Any]:
    """Calls in flight per model worker process, carried and in slots."""
    runs = b.pick(2_000, 300)
    carried = _variant(
        b, "carried", runs, ("--pool", "prefork", "-c", "2"),
        {"RELAY_MODEL_CARRIED": str(runs)},
    )  # fmt: skip
    slots = _variant(
        b, "slots", b.pick(640, 192), ("--pool", "threads", "-c", "64"),
        {"RELAY_MODEL_CARRIED": "0"},
    )  # fmt: skip
    threads_carried = _variant(
        b, "threads-carried", runs, ("--pool", "threads", "-c", "64"),
        {"RELAY_MODEL_CARRIED": str(runs)},
    )  # fmt: skip
    solo = _variant(
        b, "solo-carried", runs, ("--pool", "solo"), {"RELAY_MODEL_CARRIED": str(runs)},
    )  # fmt: skip
    tokens = _variant(
        b, "carried-tokens", b.pick(1_000, 200), ("--pool", "prefork", "-c", "2"),
        {"RELAY_MODEL_CARRIED": str(runs)}, pieces=TOKENS, chars=TOKENS * 4,
    )  # fmt: skip
    return {
        "seconds_per_reply": SECONDS,
        "carried": carried,
        "slots": slots,
        "threads_carried": threads_carried,
        "solo_carried": solo,
        "carried_tokens": tokens,
        "tokens_per_reply": TOKENS,
        "in_flight_ratio": round(carried["most_in_flight"] / max(slots["most_in_flight"], 1), 1),
    }
