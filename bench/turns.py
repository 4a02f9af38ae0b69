"""1. Turn overhead: what one turn (a model reply, then one tool call) costs, beside bare Celery.

Counts come from MONITOR over two runs of different lengths (K1 and K2
turns): the difference divided by K2 - K1 is exactly what one more turn
costs, whatever a run pays once. Times come from the model server: a turn is
the gap between two model calls of one run. A bare Celery hop is timed on
the same Redis and worker settings, in chains as long as the runs. Then one
worker (`--pool solo`) is sampled with py-spy, and the task bodies are run in
this process without Celery, to say where the time goes.
"""

from __future__ import annotations

import cProfile
import itertools
import pstats
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from bench.cluster import Counters
from bench.context import Bench, median
from bench.inprocess import LocalModel, LocalRuntime, local_turn_ms
from bench.model import Task
from bench.monitor import Monitor, Tally, tally
from bench.spy import IDLE, Breakdown, Spy, breakdown
from workers import Settings

__all__ = ["TURNS_PER_RUN", "relay_runs", "run", "turn_times"]

SPY_RATE = 250
TURNS_PER_RUN = 20
"""Turns per run when timing: short, so history stays small (growth is benchmark 5's)."""
T = TypeVar("T")


# --- Relay ------------------------------------------------------------------------------


def relay_runs(b: Bench, prefix: str, count: int, turns: int, size: int = 0) -> list[str]:
    """Start `count` runs of `turns` turns at once; return their markers once all finished."""
    markers = [f"{prefix}-{i}" for i in range(count)]
    run_ids = [b.relay.start(Task(m, turns=turns, size=size).text()) for m in markers]
    for marker in markers:
        b.brain.wait_for(marker, turns + 1, timeout=600)
    for run_id in run_ids:
        b.relay.wait(run_id, timeout=60)
    return markers


def turn_times(b: Bench, markers: list[str]) -> tuple[list[float], list[float]]:
    """Return (each run's mean turn in ms, every turn in ms) from the model calls' arrivals."""
    means, every = [], []
    for marker in markers:
        times = [t for t, _ in b.brain.arrivals[marker]]
        gaps = [(later - earlier) * 1000 for earlier, later in itertools.pairwise(times)]
        every += gaps
        means.append((times[-1] - times[0]) * 1000 / len(gaps))
    return means, every


def _count(b: Bench, path: Path, go: Callable[[], object]) -> tuple[Tally, Counters]:
    before = b.counters()
    with Monitor(b.redis_server.port, path):
        go()
        time.sleep(0.3)  # the last advance after the final model call
    return tally(path), b.counters().since(before)


def _per_unit(
    long: tuple[Tally, Counters], short: tuple[Tally, Counters], units: int
) -> dict[str, Any]:
    """What one more unit of work (a turn, a hop) cost: the difference of two runs ÷ units."""
    diff = long[0].minus(short[0])
    scaled = diff.scaled(1 / units)
    work = {k: v for k, v in diff.commands.items() if not k.startswith(("driver", "heartbeat"))}
    trips = {k: v for k, v in diff.round_trips.items() if k not in ("driver", "heartbeat")}
    usec = sum(
        long[1].usec.get(c, 0) - short[1].usec.get(c, 0)
        for c in long[1].usec
        if c not in ("info", "monitor")
    )
    return {
        "messages": round(sum(diff.messages.values()) / units, 2),
        "messages_by_task": scaled["messages"],
        "commands": round(sum(work.values()) / units, 2),
        "commands_in_lua": round(sum(diff.inner.values()) / units, 2),
        "round_trips": round(sum(trips.values()) / units, 2),
        "round_trips_by_part": {k: round(v / units, 2) for k, v in sorted(trips.items())},
        "commands_by_kind": {k: round(v / units, 2) for k, v in sorted(work.items()) if v},
        "lua_commands_by_script": scaled["inner"],
        "lua_commands_by_command": scaled["inner_commands"],
        "bytes_in": round((long[1].bytes_in - short[1].bytes_in) / units),
        "bytes_by_part": {k: round(v / units) for k, v in sorted(diff.bytes.items()) if v},
        # (A turn's STREAM calls vary with timing, as the reply comes in: this tells
        # what a change to a script saves apart from them.)
        "bytes_by_command": {k: round(v) for k, v in scaled["command_bytes"].items()},
        "bytes_out": round((long[1].bytes_out - short[1].bytes_out) / units),
        "redis_usec": round(usec / units, 1),
    }


def _relay_counts(b: Bench, k1: int, k2: int) -> dict[str, Any]:
    found = {}
    for k in (k1, k2):
        path = b.directory / f"monitor-relay-{k}.txt"

        def go(k: int = k) -> None:
            b.relay.start(Task(f"count-{k}", turns=k).text())
            b.brain.wait_for(f"count-{k}", k + 1, timeout=120)

        found[k] = _count(b, path, go)
    return _per_unit(found[k2], found[k1], k2 - k1)


def _bare_counts(b: Bench, h1: int, h2: int, queue: str) -> dict[str, Any]:
    found = {}
    for hops in (h1, h2):
        path = b.directory / f"monitor-{queue}-{hops}.txt"

        def go(hops: int = hops) -> None:
            b.chains(1, hops, f"count{hops}", queue=queue)

        found[hops] = _count(b, path, go)
    return _per_unit(found[h2], found[h1], h2 - h1)


def _window(
    b: Bench, background: Counters, go: Callable[[], list[T]], units: int
) -> tuple[list[T], dict[str, float]]:
    """Run `go`; return what it returned and Redis's work per unit, less idle workers' share."""
    before = b.counters()
    found = go()
    window = b.counters().since(before)
    net = window.less(background, window.at)
    per_unit: dict[str, Any] = {
        "commands": net.total_calls / units,
        "bytes_in": net.bytes_in / units,
        "redis_usec": net.total_usec / units,
        "redis_cpu_usec": net.cpu_usec / units,
        "usec_by_command": {c: u / units for c, u in net.usec.items()},
        "calls_by_command": {c: n / units for c, n in net.calls.items()},
    }
    return found, per_unit


def _once_usec(window: Mapping[str, Any], inner: Mapping[str, float]) -> float:
    """Redis's command time per unit with each command counted once. INFO commandstats
    counts a command a script runs twice: in its own line, and in the script's EVALSHA
    (whose time includes it). `inner` is how many of each a unit runs inside scripts
    (from MONITOR); their share of their command's time is taken out."""
    usec, calls = window["usec_by_command"], window["calls_by_command"]
    inside = sum(n * usec[c] / calls[c] for c, n in inner.items() if calls.get(c))
    return float(window["redis_usec"]) - inside


def _round(
    b: Bench, r: int, agents: int, turns: int, background: Counters
) -> tuple[dict[str, list[float]], dict[str, dict[str, float]]]:
    """One round: Relay runs and bare chains of the same length, at N and at 1 concurrency."""
    hops = 2 * turns
    markers, relay_window = _window(
        b, background, lambda: relay_runs(b, f"t{r}", agents, turns), agents * turns
    )
    bare_hops, bare_window = _window(
        b, background, lambda: b.chains(agents, hops, f"t{r}"), agents * hops
    )
    series = {
        "relay_turn_ms": turn_times(b, markers)[0],
        "bare_hop_ms": bare_hops,
        "quiet_hop_ms": b.chains(agents, hops, f"q{r}", queue="bare-quiet"),
        "relay_turn_ms_one_agent": turn_times(b, relay_runs(b, f"one{r}", 1, turns))[0],
        "bare_hop_ms_one_chain": b.chains(1, hops, f"one{r}"),
        "quiet_hop_ms_one_chain": b.chains(1, hops, f"qone{r}", queue="bare-quiet"),
    }
    return series, {"relay": relay_window, "bare": bare_window}


def _timing(
    b: Bench, agents: int, turns: int, rounds: int, inner: Mapping[str, float]
) -> dict[str, Any]:
    """Relay turns and bare hops, interleaved round by round so drift hits both alike
    (`inner`: the commands a turn runs inside scripts, for Redis's time counted once)."""
    background = b.background()
    series: dict[str, list[float]] = {}
    windows: dict[str, list[dict[str, Any]]] = {"relay": [], "bare": []}
    for r in range(rounds):
        found, window = _round(b, r, agents, turns, background)
        for key, values in found.items():
            series.setdefault(key, []).extend(values)
        for key, per_unit in window.items():
            windows[key].append(per_unit)
    out: dict[str, Any] = {"agents": agents, "turns": turns, "rounds": rounds}
    out.update({k: median(v) for k, v in series.items()})
    out["spread"] = {k: [round(x, 2) for x in v] for k, v in series.items()}
    for name, per_round in windows.items():
        for key in ("commands", "bytes_in", "redis_usec", "redis_cpu_usec"):
            out[f"{name}_window_{key}"] = round(median([w[key] for w in per_round]), 1)
    once = [_once_usec(w, inner) for w in windows["relay"]]
    out["relay_window_redis_usec_once"] = round(median(once), 1)
    return out


# --- where the time goes --------------------------------------------------------------------


def _table(spied: Breakdown, units: int, unit_ms: float) -> dict[str, Any]:
    """Main-thread ms per unit by part (idle is what the measured time leaves over)."""
    busy = {k: spied.ms(v, units) for k, v in spied.parts.items() if k != IDLE}
    parts = {k: round(v, 3) for k, v in sorted(busy.items(), key=lambda kv: -kv[1])}
    parts[IDLE] = round(max(0.0, unit_ms - sum(busy.values())), 3)
    kinds: dict[str, dict[str, float]] = {}
    for (part, kind), samples in spied.kinds.most_common():
        if part != IDLE:
            kinds.setdefault(part, {})[kind] = round(spied.ms(samples, units), 3)
    helper = {k: round(spied.ms(v, units), 3) for k, v in spied.helper.most_common()}
    return {"main_thread_ms": parts, "main_thread_by_kind_ms": kinds, "call_thread_ms": helper}


def _profiles(b: Bench, turns: int, rounds: int, spied_runs: int) -> dict[str, Any]:
    """Solo workers, Relay and bare side by side: plain timings, then py-spy samples of each
    (`spied_runs` runs of `turns` turns, and as many chains of twice as many hops)."""
    out: dict[str, Any] = {}
    relay_worker = b.relay_worker("turns-solo", "--pool", "solo")
    bare_worker = b.bare_worker("bare-solo", "--pool", "solo")
    with relay_worker, bare_worker:
        relay_runs(b, "solo-warm", 1, 3)
        b.chains(1, 5, "solo-warm")
        relay_ms, bare_ms = [], []
        for r in range(rounds):
            relay_ms += turn_times(b, relay_runs(b, f"solo{r}", 1, turns))[0]
            bare_ms += b.chains(1, 2 * turns, f"solo{r}")
        out["turn_ms_solo"], out["hop_ms_solo"] = median(relay_ms), median(bare_ms)
        out["spread"] = {"relay": relay_ms, "bare": bare_ms}
        path = b.directory / "spy-relay.txt"
        with Spy(relay_worker.pid, path, SPY_RATE):
            spied_ms = [
                turn_times(b, relay_runs(b, f"spied{r}", 1, turns))[0][0] for r in range(spied_runs)
            ]
        spied = median(spied_ms)
        out["relay"] = {
            "turn_ms_under_py_spy": spied,
            **_table(breakdown(path, SPY_RATE), spied_runs * turns, spied),
        }
        path = b.directory / "spy-bare.txt"
        with Spy(bare_worker.pid, path, SPY_RATE):
            hops = [b.chains(1, 2 * turns, f"spied{r}")[0] for r in range(spied_runs)]
        hop = median(hops)
        out["bare"] = {
            "hop_ms_under_py_spy": hop,
            **_table(breakdown(path, SPY_RATE), spied_runs * 2 * turns, hop),
        }
    return out


# (file ending, function name) -> label: the pieces of a turn worth counting.
_PIECES = {
    ("workers/runtime/calls.py", "call_model"): "Calls.call_model (task body)",
    ("workers/runtime/calls.py", "run_tool"): "Calls.run_tool (task body)",
    ("workers/runtime/steps.py", "advance"): "Steps.advance (load, engine, save, send)",
    ("workers/store/runs.py", "claim"): "RunStore.claim (Lua CLAIM + parse record)",
    ("workers/store/runs.py", "record"): "RunStore.record (Lua RECORD + load, pipelined)",
    ("workers/store/runs.py", "load"): "RunStore.load",
    ("workers/store/runs.py", "save"): "RunStore.save (Lua SAVE)",
    ("workers/kit/agents.py", "restore"): "AgentKit.restore (parse snapshot)",
    ("workers/engine/decide.py", "decide"): "engine decide (apply, next step, snapshot)",
    ("agent_core/agent.py", "snapshot"): "Agent.snapshot (dump JSON)",
    ("agent_core/agent.py", "resume"): "Agent.resume",
    ("agent_core/prompts.py", "ask_request"): "prompts.ask_request (build the prompt)",
    ("agent_core/history.py", "render_history"): "history.render_history",
    ("workers/runtime/leases.py", "run_leased"): "run_leased (helper thread)",
    ("workers/model/transport.py", "complete"): "ModelClient.complete (HTTP)",
    ("bench/inprocess.py", "complete"): "LocalModel.complete",
    ("pydantic/main.py", "model_validate_json"): "pydantic model_validate_json",
    ("pydantic/main.py", "model_dump_json"): "pydantic model_dump_json",
    ("json/__init__.py", "dumps"): "json.dumps",
    ("json/__init__.py", "loads"): "json.loads",
    ("redis/connection.py", "send_packed_command"): "redis-py send (one per round trip)",
    ("redis/connection.py", "read_response"): "redis-py read_response",
    ("redis/client.py", "load_scripts"): "redis-py Pipeline.load_scripts (SCRIPT EXISTS)",
}


def _pieces(profile: cProfile.Profile, turns: int) -> dict[str, dict[str, float]]:
    stats: dict[Any, Any] = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    found: dict[str, dict[str, float]] = {}
    for (filename, _line, function), (_cc, calls, _tt, cumulative, _callers) in stats.items():
        label = next(
            (v for (f, n), v in _PIECES.items() if filename.endswith(f) and function == n), None
        )
        if label is None:
            continue
        entry = found.setdefault(label, {"calls_per_turn": 0.0, "ms_per_turn": 0.0})
        entry["calls_per_turn"] += calls / turns
        entry["ms_per_turn"] += cumulative * 1000 / turns
    order = list(_PIECES.values())
    return {
        k: {n: round(v, 3) for n, v in found[k].items()} for k in sorted(found, key=order.index)
    }


def _top(profile: cProfile.Profile, turns: int, count: int = 20) -> list[dict[str, Any]]:
    stats: dict[Any, Any] = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    rows = sorted(stats.items(), key=lambda item: item[1][2], reverse=True)[:count]
    return [
        {
            "function": f"{Path(f).parent.name}/{Path(f).name}:{line}({name})",
            "self_ms_per_turn": round(tt * 1000 / turns, 3),
            "calls_per_turn": round(nc / turns, 2),
        }
        for (f, line, name), (_cc, nc, tt, _ct, _callers) in rows
    ]


def _in_process(b: Bench, turns: int, runs: int) -> dict[str, Any]:
    """Relay's runtime without Celery, with the HTTP model and with an in-process one."""
    settings = Settings.from_env(b.env)
    out: dict[str, Any] = {}
    # "http_model_plain": the same server answering without a stream, so the cost of
    # streaming each reply into the run's live stream (issue 15) shows beside it.
    # "http_model_continued": as a worker that consumes every queue runs a run, each next
    # step continued in place (and its call claimed with the save before: SAVE_CLAIM).
    variants = (
        ("http_model", None),
        ("http_model_continued", None),
        ("http_model_plain", None),
        ("local_model", LocalModel()),
    )
    for name, model in variants:
        b.model.streams = name != "http_model_plain"
        with LocalRuntime(settings, model, continued=name == "http_model_continued") as local:
            local_turn_ms(local, Task(f"local-warm-{name}", turns=3))
            times = [
                sum(local_turn_ms(local, Task(f"local-{name}-{r}", turns=turns))) / turns
                for r in range(runs)
            ]
        out[f"turn_ms_{name}"] = median(times)
    b.model.streams = True
    profile = cProfile.Profile()
    with LocalRuntime(settings, LocalModel()) as local:
        profile.enable()
        for r in range(runs):
            local.start(Task(f"local-profiled-{r}", turns=turns))
            local.drain()
        profile.disable()
    out["pieces"] = _pieces(profile, runs * turns)
    out["top_self_time"] = _top(profile, runs * turns)
    return out


def run(b: Bench) -> dict[str, Any]:
    """Measure turn overhead; return the figures (see RESULTS.md for what each means)."""
    k1, k2 = b.pick(5, 3), b.pick(25, 10)
    agents, turns, rounds = 2, TURNS_PER_RUN, b.pick(6, 3)
    out: dict[str, Any] = {}
    relay_worker = b.relay_worker("turns", "--concurrency", "2")
    bare_worker = b.bare_worker("bare", "--concurrency", "2")
    quiet_worker = b.bare_worker(
        "bare-quiet", "--concurrency", "2", events=False, queue="bare-quiet"
    )
    with relay_worker, bare_worker, quiet_worker:
        relay_runs(b, "warm", 1, 3)
        b.chains(2, 5, "warm")
        b.chains(2, 5, "warm", queue="bare-quiet")
        out["relay_counts"] = _relay_counts(b, k1, k2)
        out["bare_counts"] = _bare_counts(b, 2 * k1, 2 * k2, "bare")
        out["bare_no_events_counts"] = _bare_counts(b, 2 * k1, 2 * k2, "bare-quiet")
        inner = out["relay_counts"]["lua_commands_by_command"]
        out["timing"] = _timing(b, agents, turns, rounds, inner)
    b.clear()
    out["profiles"] = _profiles(b, turns, rounds, b.pick(8, 3))
    b.clear()
    out["in_process"] = _in_process(b, turns, b.pick(8, 3))
    b.clear()
    out["summary"] = _summary(out)
    return out


def _summary(out: dict[str, Any]) -> dict[str, Any]:
    t, p = out["timing"], out["profiles"]
    relay, bare_c = out["relay_counts"], out["bare_counts"]
    return {
        "messages_per_turn": relay["messages"],
        "turn_ms": t["relay_turn_ms"],
        "hop_ms": t["bare_hop_ms"],
        "turn_over_hop": t["relay_turn_ms"] / t["bare_hop_ms"],
        "turn_over_hop_one_agent": t["relay_turn_ms_one_agent"] / t["bare_hop_ms_one_chain"],
        "turn_over_hop_solo": p["turn_ms_solo"] / p["hop_ms_solo"],
        "goal_turn_over_hop": 2 * 1.3,
        "commands_per_turn": relay["commands"],
        "commands_in_lua_per_turn": relay["commands_in_lua"],
        "bare_commands_per_hop": bare_c["commands"],
        "round_trips_per_turn": relay["round_trips"],
        "bare_round_trips_per_hop": bare_c["round_trips"],
        "bytes_in_per_turn": relay["bytes_in"],
        "bare_bytes_in_per_hop": bare_c["bytes_in"],
        "bytes_by_part_per_turn": relay["bytes_by_part"],
        "redis_usec_per_step": t["relay_window_redis_usec_once"] / 2,
        "redis_usec_per_step_counted_twice": t["relay_window_redis_usec"] / 2,
        "redis_cpu_usec_per_step": t["relay_window_redis_cpu_usec"] / 2,
        "bare_redis_usec_per_hop": t["bare_window_redis_usec"],
        "bare_redis_cpu_usec_per_hop": t["bare_window_redis_cpu_usec"],
        "relay_own_ms_per_turn": out["in_process"]["turn_ms_http_model"],
        "relay_own_ms_per_turn_plain": out["in_process"]["turn_ms_http_model_plain"],
        "relay_own_ms_per_turn_continued": out["in_process"]["turn_ms_http_model_continued"],
        "solo_turn_split_ms": _solo_split(out),
    }


def _solo_split(out: dict[str, Any]) -> dict[str, float]:
    """A solo worker's turn, taken apart: the Celery hops it made (the turn's messages,
    each a bare hop: none while each next step is continued in place), Relay's own work in
    process done the same way, and the rest (the worker's own threads and loop)."""
    p, own = out["profiles"], out["in_process"]
    messages = out["relay_counts"]["messages"]
    hops = messages * p["hop_ms_solo"]
    work = own["turn_ms_http_model_continued" if messages < 1 else "turn_ms_http_model"]
    return {"celery_hops": hops, "relay_own_work": work, "rest": p["turn_ms_solo"] - hops - work}
