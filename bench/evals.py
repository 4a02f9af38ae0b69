"""13. What `relay eval --builtin --repeat 3` costs, against a scripted strong model.

Two measures, the model answering at once (so what is left is Relay's and the eval's):

- the command as a user runs it, end to end (the embedded default: it starts a
  private Redis and a worker, runs the 27 trials, stops both), three times: the
  slowest and the median;
- the same suite on the bench's Redis with one worker of the built-in app already
  up, in this process (`run_suite`): wall time, each trial's time against its runs'
  own time (created to finished, in Redis), so what the eval adds per trial is
  the difference (its polling: a plan, call or question waits up to one poll for
  its decision), and the eval process's CPU per trial.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.cluster import ROOT, Worker
from bench.context import Bench
from tests.support.eval_profiles import strong
from tests.support.model_server import ModelServer
from workers import Relay, Settings
from workers.evals.builtin import build
from workers.evals.runner import run_suite, trials_of
from workers.evals.suite import BUILTIN_APP, builtin_suite

__all__ = ["run"]

REPEAT = 3
COMMAND_RUNS = 3


def run(b: Bench) -> dict[str, Any]:
    with ModelServer(strong) as model, tempfile.TemporaryDirectory(prefix="bench-eval-") as folder:
        routes = [{"name": "strong", "url": model.url, "model": "strong"}]
        models = Path(folder) / "models.json"
        models.write_text(json.dumps(routes))
        env = {"RELAY_MODELS": str(models), "RELAY_EVAL_DIR": folder}
        command = _command(env, b.pick(COMMAND_RUNS, 1))
        in_process = _in_process(b, env)
    return {"repeat": REPEAT, "command": command, "in_process": in_process}


def _command(env: dict[str, str], times: int) -> dict[str, Any]:
    """`relay eval --builtin --route strong --repeat 3`, as typed, `times` times."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RELAY_")}
    argv = [sys.executable, "-m", "workers.cli", "eval", "--builtin", "--route", "strong"]
    argv += ["--repeat", str(REPEAT), "--json"]
    walls, passed = [], []
    for _ in range(times):
        began = time.monotonic()
        done = subprocess.run(
            argv,
            env={**clean, **env, "PYTHONPATH": str(ROOT)},
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
        walls.append(time.monotonic() - began)
        if not done.stdout.startswith("{"):
            raise RuntimeError(f"relay eval failed:\n{done.stderr[-3000:]}")
        report = json.loads(done.stdout)
        passed.append(sum(line["passed"] for line in report["routes"]))
    return {
        "runs": times,
        "seconds_max": max(walls),
        "seconds_median": statistics.median(walls),
        "passed": min(passed),
    }


def _in_process(b: Bench, env: dict[str, str]) -> dict[str, Any]:
    """The suite on the bench's Redis, one worker of the built-in app already up."""
    os.environ["RELAY_EVAL_DIR"] = env["RELAY_EVAL_DIR"]  # (the after-checks run here)
    worker_env = {**b.env, **env}
    worker_env.pop("RELAY_MODEL_URL", None)
    command = [sys.executable, "-c", "from workers.cli import main; main()"]
    command += ["--app", BUILTIN_APP, "worker", "--loglevel", "INFO", "--hostname", "eval@bench"]
    worker = Worker(command, worker_env, b.directory / "eval-worker.log").start()
    try:
        relay = build(Settings.from_env(worker_env))
        suite = builtin_suite()
        trials = trials_of(suite, ["strong"], REPEAT)
        cpu, began = time.process_time(), time.monotonic()
        results = run_suite(relay, trials)
        wall, cpu = time.monotonic() - began, time.process_time() - cpu
        own = [_runs_seconds(relay, r.runs) for r in results]
        added = [r.facts.seconds - mine for r, mine in zip(results, own, strict=True)]
    finally:
        worker.stop()
    return {
        "trials": len(trials),
        "passed": sum(1 for r in results if r.verdict.passed),
        "seconds": wall,
        "trial_seconds_mean": statistics.mean(r.facts.seconds for r in results),
        "trial_seconds_max": max(r.facts.seconds for r in results),
        "runs_seconds_mean": statistics.mean(own),
        "added_seconds_mean": statistics.mean(added),
        "added_seconds_max": max(added),
        "eval_cpu_ms_per_trial": 1000 * cpu / len(trials),
        "model_calls_per_trial": statistics.mean(r.facts.model_calls for r in results),
    }


def _runs_seconds(relay: Relay, runs: tuple[str, ...]) -> float:
    total = 0.0
    for run_id in runs:
        status = relay.status(run_id)
        if status.finished_ms is not None:
            total += (status.finished_ms - status.created_ms) / 1000
    return total
