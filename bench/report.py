"""The machine a run was made on, and the table of figures and ratios it prints."""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

__all__ = ["Row", "machine", "table"]


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def machine() -> dict[str, Any]:
    return {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "packages": {
            p: _version(p)
            for p in (
                *("celery", "kombu", "redis", "pydantic", "httpx", "langgraph"),
                *("langgraph-checkpoint-postgres", "dbos", "psycopg"),
            )
        },
    }


@dataclass(frozen=True)
class Row:
    item: str
    what: str
    value: str
    goal: str = ""
    verdict: str = ""


# Issue 31's goals, each printed beside its figure with a verdict (bench/RESULTS.md,
# "At a glance"). The other goals below are earlier issues' and stay where they are.
BYTES_PER_TURN_GOAL = 4_096
"""Bytes written to Redis a turn (store + broker + events), the replay journal included."""
REDIS_USEC_PER_STEP_GOAL = 150
"""Redis server time a step, µs."""
OWN_OVER_CORE_HTTP_GOAL = 1.5
"""Relay's own ms a turn in process over the core + HTTP model turn, same run."""
PEER_GOALS: dict[str, tuple[bool, float]] = {
    "langgraph_sync": (False, 1.0),
    "langgraph_postgres_sync": (False, 1.0),
    "langgraph": (False, 1.5),
    "langgraph_postgres": (False, 1.5),
    "dbos": (True, 0.6),
}
"""Relay per step over each peer's: (strictly below, the bound)."""


def _fmt(value: float, digits: int = 2) -> str:
    return f"{value:,.{digits}f}"


def _check(ok: bool) -> str:
    return "met" if ok else "MISSED"


def _turns(r: dict[str, Any]) -> list[Row]:
    s, t = r["summary"], r["timing"]
    item = "1 turns"
    return [
        Row(
            item,
            "Celery messages per turn",
            _fmt(s["messages_per_turn"]),
            "<= 2",
            _check(s["messages_per_turn"] <= 2),
        ),
        Row(
            item,
            "Redis commands per turn (+ run inside Lua)",
            f"{_fmt(s['commands_per_turn'], 1)} (+{_fmt(s['commands_in_lua_per_turn'], 1)})",
            f"bare hop {_fmt(s['bare_commands_per_hop'], 1)}",
        ),
        Row(
            item,
            "Redis round trips per turn",
            _fmt(s["round_trips_per_turn"], 1),
            f"bare hop {_fmt(s['bare_round_trips_per_hop'], 1)}",
        ),
        Row(
            item,
            "bytes written to Redis per turn",
            _fmt(s["bytes_in_per_turn"], 0),
            f"<= {BYTES_PER_TURN_GOAL:,} (bare hop {_fmt(s['bare_bytes_in_per_hop'], 0)})",
            _check(s["bytes_in_per_turn"] <= BYTES_PER_TURN_GOAL),
        ),
        Row(
            item,
            "  of which Relay's store (arguments, MONITOR)",
            _fmt(s["bytes_by_part_per_turn"].get("store", 0), 0),
            " + ".join(f"{k} {v:,}" for k, v in s["bytes_by_part_per_turn"].items()),
        ),
        Row(
            item,
            "Redis server time per step (us, commandstats, idle workers' share out)",
            _fmt(s["redis_usec_per_step"], 0),
            f"<= {REDIS_USEC_PER_STEP_GOAL} (bare hop {_fmt(s['bare_redis_usec_per_hop'], 0)};"
            " summed as before, with scripts' commands counted twice:"
            f" {_fmt(s['redis_usec_per_step_counted_twice'], 0)})",
            _check(s["redis_usec_per_step"] <= REDIS_USEC_PER_STEP_GOAL),
        ),
        Row(
            item,
            "  Redis main thread's CPU per step (us: commands and their sockets)",
            _fmt(s["redis_cpu_usec_per_step"], 0),
            f"bare hop {_fmt(s['bare_redis_cpu_usec_per_hop'], 0)}",
        ),
        Row(
            item,
            f"turn ms, {t['agents']} agents (prefork -c 2)",
            _fmt(s["turn_ms"]),
            f"bare hop {_fmt(s['hop_ms'])} ms",
        ),
        Row(
            item,
            "  turn / bare hop, 2 agents",
            _fmt(s["turn_over_hop"]),
            "<= 2.6 (1.3 x 2)",
            _check(s["turn_over_hop"] <= 2.6),
        ),
        Row(
            item,
            "  turn / bare hop, 1 agent",
            _fmt(s["turn_over_hop_one_agent"]),
            "<= 2.6",
            _check(s["turn_over_hop_one_agent"] <= 2.6),
        ),
        Row(
            item,
            "  turn / bare hop, --pool solo",
            _fmt(s["turn_over_hop_solo"]),
            "<= 2.6",
            _check(s["turn_over_hop_solo"] <= 2.6),
        ),
        Row(
            item,
            "  solo turn = its Celery hops + Relay's own work + rest",
            " + ".join(f"{v:.1f}" for v in s["solo_turn_split_ms"].values()),
            "ms (the own work, in process, pays the loopback model server's CPU too:"
            " the rest can be below 0)",
        ),
        Row(
            item,
            "Relay's own ms per turn (no Celery)",
            _fmt(s["relay_own_ms_per_turn"]),
            "in process, HTTP model",
        ),
        Row(
            item,
            "  the same, each next step continued in place",
            _fmt(s["relay_own_ms_per_turn_continued"]),
            "as a worker that consumes every queue runs it",
        ),
        Row(
            item,
            "  the same, the server not streaming",
            _fmt(s["relay_own_ms_per_turn_plain"]),
            "what streaming replies to the live stream costs",
        ),
    ]


def _batch(r: dict[str, Any]) -> list[Row]:
    item, parts = "2 batch", r["parts_ms_median"]
    goal = r["goal_with_one_hop"] or r["goal"]
    per = r["per_batch"]
    return [
        Row(
            item,
            f"{r['calls']} x {r['tool_ms']} ms: batch ms",
            _fmt(r["batch_ms_median"], 1),
            f"dispatch {parts['dispatch']:.0f} + stagger {parts['stagger']:.0f} + tools "
            f"{parts['tools']:.0f} + fan-in {parts['fan_in']:.0f}",
        ),
        Row(
            item,
            "  batch / 200 ms",
            _fmt(r["ratio"]),
            f"<= {goal:.3f} (1.15 + a hop)",
            _check(r["ratio"] <= goal),
        ),
        Row(
            item,
            "  saves (lost CAS races) per batch",
            f"{per['saves']:.1f} ({per['lost_saves']:.1f})",
            "9 events in",
        ),
    ]


def _many(r: dict[str, Any]) -> list[Row]:
    rows = []
    for name, pool in r["pools"].items():
        relay, bare = pool["relay"], {"tasks_per_s": pool["bare_tasks_per_s"]}
        rows.append(
            Row(
                "3 many",
                f"{relay['runs']} runs x 5 steps, 2 workers {name}: steps/s",
                _fmt(relay["steps_per_s"], 1),
                f"bare no-op {_fmt(bare['tasks_per_s'], 1)}/s; lone hop "
                f"{pool.get('bare_hop_ms_one_chain_alone', float('nan')):.1f} ms",
            )
        )
        rows.append(
            Row(
                "3 many",
                "  steps/s / bare tasks/s",
                _fmt(pool["ratio"]),
                f">= {r['goal']}",
                _check(pool["ratio"] >= r["goal"]),
            )
        )
        if "worker_cpu_ms_per_step" in relay:
            rows.append(
                Row(
                    "3 many",
                    "  workers' CPU ms per step (all their processes)",
                    _fmt(relay["worker_cpu_ms_per_step"]),
                    f"bare: {_fmt(pool['bare_worker_cpu_ms_per_task'])} per task",
                )
            )
    return rows


def _waiting(r: dict[str, Any]) -> list[Row]:
    item, one, lat = "4 waiting", r["one_run"], r["approve_to_model_ms"]
    slots = r["slots_held"]
    long = r["long_run"]
    return [
        Row(
            item,
            f"{r['runs']:,} parked: Redis bytes per run",
            _fmt(r["bytes_per_run"], 0),
            f"<= {r['goal_bytes']}",
            _check(r["bytes_per_run"] <= r["goal_bytes"]),
        ),
        Row(
            item,
            "  the first minute, while their live streams are kept",
            _fmt(r.get("bytes_per_run_streams_kept", float("nan")), 0),
            "then they expire",
        ),
        Row(
            item,
            "  MEMORY USAGE of one run's keys",
            _fmt(one["memory_usage_total"], 0),
            ", ".join(f"{k} {v}" for k, v in one["memory_usage"].items()),
        ),
        Row(
            item,
            "  worker slots held",
            str(slots["tasks_running"] + slots["messages_in_flight"]),
            "0",
            _check(slots["tasks_running"] + slots["messages_in_flight"] == 0),
        ),
        Row(
            item,
            "  approve -> next model call ms, median / p99",
            f"{lat['median']:.1f} / {lat['p99']:.1f}",
            f"{lat['samples']} approvals, 3 hops",
        ),
        Row(
            item,
            "  parked after 4 turns: bytes",
            _fmt(r["after_four_turns"]["memory_usage_total"], 0),
            "MEMORY USAGE of its keys",
        ),
        Row(
            item,
            f"  parked after {long['turns']} turns: bytes",
            _fmt(long["memory_usage_total"], 0),
            f"snapshot {long['snapshot_chars']:,} chars; trace {long['trace_entries']} entries",
        ),
    ]


def _growth(r: dict[str, Any]) -> list[Row]:
    item, w = "5 growth", r["workers"]
    turns = [k for k in w if k.isdigit()]
    first, last = turns[0], turns[-1]
    return [
        Row(
            item,
            f"turn ms at turn {first} / {last}",
            f"{w[first]['turn_ms']:.1f} / {w[last]['turn_ms']:.1f}",
            "flat",
            _check(r["turn_ratio_last_over_first"] <= 1.2),
        ),
        Row(
            item,
            f"snapshot chars at turn {first} / {last}",
            f"{w[first]['snapshot_chars']:,} / {w[last]['snapshot_chars']:,}",
            "bounded by history_chars",
        ),
        Row(
            item,
            f"  bytes written to Redis per turn, turns {turns[-2]} to {last}",
            f"{w[last].get('bytes_in_per_turn', 0):,}",
            "late in a long run: what the turns bench's short runs leave out",
        ),
        Row(
            item,
            f"  in process (no Celery) turn ms {first} / {last}",
            f"{r['in_process_turn_ms'][first]:.1f} / {r['in_process_turn_ms'][last]:.1f}",
        ),
        Row(
            item,
            f"  trace list at turn {last}",
            f"{w[last]['trace_entries']:,} entries, {w[last]['trace_bytes']:,} bytes",
            "capped at 2,000 lines",
        ),
    ]


def _peers(r: dict[str, Any]) -> list[Row]:
    item = "6 peers"
    rows = [
        Row(item, "pure core turn ms (agent_core.run, no I/O)", _fmt(r["core_turn_ms"], 3)),
        Row(item, "core + HTTP model turn ms", _fmt(r["core_http_turn_ms"], 3)),
    ]
    lg = r["langgraph"]
    if "turn_ms" in lg:
        rows.append(Row(item, "LangGraph + SqliteSaver turn ms", _fmt(lg["turn_ms"], 3)))
        if "step_ms" in lg:
            rows.append(Row(item, "  ms per step", _fmt(lg["step_ms"], 3)))
            rows.append(Row(item, "  bytes stored per step", f"{lg['bytes_per_step']:,.0f}"))
        rows.append(
            Row(
                item,
                "  LangGraph bytes at 1st approval / after 4 turns",
                f"{lg['bytes_first_approval']['all_checkpoint_bytes']:,} / "
                f"{lg['bytes_after_four_turns']['all_checkpoint_bytes']:,}",
                "all checkpoints of the thread",
            )
        )
    else:
        rows.append(Row(item, "LangGraph", lg.get("skipped", "?")))
    for key, name in _DURABLE.items():
        peer = r.get(key, {"skipped": "not measured: not in this run"})
        if "step_ms" in peer:
            rows.append(Row(item, f"{name} ms per step", _fmt(peer["step_ms"], 3)))
            if "bytes_per_step" in peer:
                rows.append(Row(item, "  bytes stored per step", f"{peer['bytes_per_step']:,.0f}"))
        else:
            rows.append(Row(item, name, peer.get("skipped", "?")))
    if "relay_step_ms" in r:
        rows.append(Row(item, "Relay ms per step (1 agent, turn / 2)", _fmt(r["relay_step_ms"], 3)))
    for key, name in _PEER_NAMES.items():
        ratio = r.get(f"relay_over_{key}")
        if ratio is not None:
            below, most = PEER_GOALS[key]
            ok = ratio < most if below else ratio <= most
            goal = f"{'<' if below else '<='} {most:g}"
            rows.append(Row(item, f"Relay per step / {name}", _fmt(ratio), goal, _check(ok)))
    own = r.get("own_over_core_http")
    if own is not None:
        rows.append(
            Row(
                item,
                "Relay's own ms per turn / core + HTTP model turn",
                _fmt(own),
                f"<= {OWN_OVER_CORE_HTTP_GOAL:g} (own {_fmt(r['own_turn_ms'])} ms, each next"
                f" step continued in place; each step a message: {_fmt(r['own_turn_ms_sent'])})",
                _check(own <= OWN_OVER_CORE_HTTP_GOAL),
            )
        )
    return rows


_DURABLE = {
    "langgraph_postgres": "LangGraph + PostgresSaver",
    "dbos": "DBOS Transact",
    "langgraph_sync": "LangGraph + SqliteSaver, durability=sync",
    "langgraph_postgres_sync": "LangGraph + PostgresSaver, durability=sync",
}
_PEER_NAMES = {"langgraph": "LangGraph + SqliteSaver", **_DURABLE}


def _recovery(r: dict[str, Any]) -> list[Row]:
    return [
        Row(
            "7 recovery",
            f"dead worker's call picked up again, s ({r['kills']} kills, one every 5-10 s)",
            f"median {r['median_s']:.1f}, max {r['max_s']:.2f}",
            f"<= {r['goal_s']:.0f}",
            _check(r["max_s"] <= r["goal_s"]),
        ),
        Row(
            "7 recovery",
            "  pick-ups over the bound (lease + tick + allowance)",
            f"{r['over_bound']} of {r['picked_up']}",
            "0",
            _check(r["over_bound"] == 0),
        ),
    ]


def _outage(r: dict[str, Any]) -> list[Row]:
    return [
        Row(
            "8 outage",
            f"runs move again after Redis returns, s ({r['runs']} runs, {r['down_s']:.0f} s down)",
            f"median {r['median_s']:.2f}, max {r['max_s']:.2f}",
            f"<= {r['goal_s']:.0f} (one tick)",
            _check(r["max_s"] <= r["goal_s"]),
        ),
        Row("8 outage", "  outcomes held through the outage", str(r["held"]), str(r["runs"])),
        Row(
            "8 outage",
            "  lost, reported unknown, calls made again, model calls made again",
            f"{r['lost']}, {r['unknown']}, {r['calls_again']}, {r['model_calls_again']}",
            "0, 0, 0, 0",
            _check(r["lost"] + r["unknown"] + r["calls_again"] + r["model_calls_again"] == 0),
        ),
    ]


def _admission(r: dict[str, Any]) -> list[Row]:
    calls = r["round_trips_per_claim"]
    usec = r["redis_usec_per_claim"]
    return [
        Row(
            "9 admission",
            f"budget check in CLAIM, ms per model call ({r['claims']:,} claims)",
            f"{r['admission_ms']:.3f}",
            f"<= {r['goal_ms']} (claim {r['claim_ms_with_budget']:.3f}"
            f" vs {r['claim_ms_without']:.3f})",
            _check(r["admission_ms"] <= r["goal_ms"]),
        ),
        Row(
            "9 admission",
            "  round trips (EVALSHA) per claim, with and without a budget",
            f"{calls['with_budget']:.2f}, {calls['without']:.2f}",
            f"server µs {usec['with_budget']:.1f} vs {usec['without']:.1f}",
            _check(calls["with_budget"] <= calls["without"] + 0.01),
        ),
    ]


def _live(r: dict[str, Any]) -> list[Row]:
    lat, parked = r["first_text_ms"], r["parked"]
    sizes = ", ".join(
        f"{s['answer_chars']:,} chars {s.get('gap_ms', 0)} ms apart: {s['memory_usage']:,} B"
        f" ({s['events']:,} events)"
        for s in r["stream_bytes"]
    )
    return [
        Row(
            "11 live",
            f"server's first text event → reader's first text, ms ({lat['samples']} runs)",
            f"median {lat['median']:.2f}, p90 {lat['p90']:.2f}, max {lat['max']:.2f}",
            f"< {r['goal_ms']:.0f}",
            _check(lat["p90"] < r["goal_ms"]),
        ),
        Row("11 live", "  MEMORY USAGE of a tree's stream after one answer", sizes, ""),
        Row(
            "11 live",
            f"  {parked['runs']:,} parked after a streamed reply: bytes per run",
            f"{parked['bytes_per_run_with_stream']:,.0f} with stream,"
            f" {parked['bytes_per_run_once_expired']:,.0f} once expired",
            f"stream kept {r['stream_parked_s']} s after parking",
        ),
    ]


_GOAL_SHAPES = ("carried", "solo_carried")
"""The in-flight shapes issue 31's goal is read against: a prefork worker, one process."""


def _inflight(r: dict[str, Any]) -> list[Row]:
    rows = []
    shapes = (
        ("carried", "prefork -c 2, RELAY_MODEL_CARRIED"),
        ("slots", "threads -c 64, RELAY_MODEL_CARRIED=0"),
        ("threads_carried", "threads -c 64, RELAY_MODEL_CARRIED"),
        ("solo_carried", "solo (one process), RELAY_MODEL_CARRIED"),
        ("carried_tokens", "prefork -c 2, RELAY_MODEL_CARRIED, a token at a time"),
        ("loop", "solo, issue 53's load: 5-turn runs, streamed"),
        ("loop_1turn", "solo, issue 53's load: 1-turn runs, streamed"),
    )
    for name, what in shapes:
        v = r.get(name)
        if v is None:  # (results written before the shape was measured)
            continue
        rows.append(
            Row(
                "14 inflight",
                f"{what}: {v['runs']:,} runs, {r['seconds_per_reply']:g} s a reply",
                f"{v['most_in_flight']:,} calls in flight, {v['runs_per_s']:,} runs/s"
                f" ({v['took_over_allowed']} x what the model allows),"
                f" {v['worker_cores_busy']} cores busy"
                f" ({v.get('worker_cpu_ms_per_run', '?')} ms a run),"
                f" {v['kb_per_call_in_flight']:,} KB"
                f" a call, Redis CPU {v.get('redis_cpu_us_per_step', '?')} us a step,"
                f" {v.get('stream_events_per_run', '?')} live events a run"
                + (_loop_figures(v, r) if name.startswith("loop") else ""),
                ">= 1,000 in flight, < 1 core" if name in _GOAL_SHAPES else "beside",
                _check(v["most_in_flight"] >= 1_000 and v["worker_cores_busy"] < 1.0)
                if name in _GOAL_SHAPES
                else "",
            )
        )
    return rows


def _loop_figures(v: dict[str, Any], r: dict[str, Any]) -> str:
    """What issue 53 reads of an in-flight load (`bench.goals` gives the verdicts)."""
    lag = v.get("loop_lag_p99_ms")
    return (
        f"; {v['model_calls']:,} model calls ({v['turns']} a run"
        f", {r.get('loop_pieces_per_s', '?')} pieces/s), {v['worker_cpu_ms_per_model_call']} ms"
        f" a call, {v['threads_at_peak']} threads at the peak (most {v['threads_most']}),"
        f" loop lag p99 {'not exported' if lag is None else f'{lag} ms'}"
    )


def _stored(r: dict[str, Any]) -> list[Row]:
    found: dict[str, int] = r["bytes_per_turn"]
    least, most = min(found.values()), max(found.values())
    return [
        Row(
            "15 stored",
            f"bytes a turn writes: {' / '.join(found)}",
            " / ".join(f"{v:,}" for v in found.values()),
            "the same whatever the task's length (within 5%)",
            _check(most <= least * 1.05),
        )
    ]


def _routes(r: dict[str, Any]) -> list[Row]:
    spaced, unspaced, admit = r["with_route_limit"], r["without"], r["admission"]
    limit = f"{r['limit']} calls in any {r['window_s']:.0f} s"
    return [
        Row(
            "10 routes",
            f"429s from a provider enforcing {limit}, with the route's rpm / without",
            f"{spaced['refused_share']:.1%} / {unspaced['refused_share']:.1%}",
            f"<= {r['goal_refused_share']:.0%} ({spaced['refused_429']} of {spaced['requests']}"
            f" vs {unspaced['refused_429']} of {unspaced['requests']})",
            _check(spaced["refused_share"] <= r["goal_refused_share"]),
        ),
        Row(
            "10 routes",
            f"  the limit used, with the route's rpm / without ({spaced['runs']} runs, 2 workers)",
            f"{spaced['used_share']:.1%} / {unspaced['used_share']:.1%}",
            f">= {r['goal_used_share']:.0%} ({spaced['served_per_s']:.2f}"
            f" of {spaced['limit_per_s']:.0f} calls/s)",
            _check(spaced["used_share"] >= r["goal_used_share"]),
        ),
        Row(
            "10 routes",
            f"  admit + done, ms per call ({admit['calls']:,} calls, in process)",
            f"{admit['admit_ms']:.3f} + {admit['done_ms']:.3f}",
            f"<= {r['goal_admit_ms']} each; {admit['round_trips_per_call']:.2f} round trips,"
            f" server µs {admit['redis_usec_per_call']:.1f}",
            _check(
                max(admit["admit_ms"], admit["done_ms"]) <= r["goal_admit_ms"]
                and admit["round_trips_per_call"] <= 2.01
            ),
        ),
    ]


def _journal(r: dict[str, Any]) -> list[Row]:
    turn, waiting = r["per_turn"], r["replay_waiting"]
    return [
        Row(
            "12 journal",
            f"bytes to Redis per turn, with the journal / without ({turn['turns']} turns)",
            f"{turn['bytes_in_per_turn_with']:,.0f} / {turn['bytes_in_per_turn_without']:,.0f}",
            f"journal {turn['journal_bytes_per_turn']:,.0f} B/turn stored,"
            f" start {turn['start_bytes']:,} B",
        ),
        Row(
            "12 journal",
            "  Redis µs per turn, all / the journal's RPUSH",
            f"{turn['redis_usec_per_turn_with']:,.0f} / {turn['journal_rpush_usec_per_turn']:,.1f}",
        ),
        Row(
            "12 journal",
            f"  replay --waiting over {waiting['parked_runs']} parked runs, s (max of 3)",
            f"{waiting['seconds_max']:.2f} ({waiting['ms_per_run_max']:.1f} ms a run)",
            f"seconds; {waiting['identical']} of {waiting['parked_runs']} identical",
            _check(waiting["identical"] == waiting["parked_runs"] and waiting["seconds_max"] < 10),
        ),
    ]


def _evals(r: dict[str, Any]) -> list[Row]:
    command, inner = r["command"], r["in_process"]
    return [
        Row(
            "13 eval",
            f"relay eval --builtin --repeat {r['repeat']}, s (max / median of {command['runs']})",
            f"{command['seconds_max']:.1f} / {command['seconds_median']:.1f}",
            f"as typed: a private Redis and worker started and stopped; {command['passed']}"
            f" of {inner['trials']} passed",
        ),
        Row(
            "13 eval",
            f"  on a running fleet: {inner['trials']} trials, s; a trial, mean / max",
            f"{inner['seconds']:.1f}; {inner['trial_seconds_mean']:.2f}"
            f" / {inner['trial_seconds_max']:.2f}",
            f"its runs' own {inner['runs_seconds_mean']:.2f} s a trial;"
            f" {inner['model_calls_per_trial']:.1f} model calls a trial",
        ),
        Row(
            "13 eval",
            "  the eval adds per trial, s mean / max; its CPU ms per trial",
            f"{inner['added_seconds_mean']:.3f} / {inner['added_seconds_max']:.3f};"
            f" {inner['eval_cpu_ms_per_trial']:.1f}",
        ),
    ]


_ROWS = {
    "evals": _evals,
    "journal": _journal,
    "turns": _turns,
    "batch": _batch,
    "many": _many,
    "waiting": _waiting,
    "growth": _growth,
    "peers": _peers,
    "recovery": _recovery,
    "outage": _outage,
    "admission": _admission,
    "routes": _routes,
    "live": _live,
    "inflight": _inflight,
    "stored": _stored,
}


def table(results: dict[str, Any]) -> str:
    rows: list[Row] = []
    for name, figures in results["benchmarks"].items():
        maker = _ROWS.get(name)
        if "error" in figures:
            rows.append(Row(name, "FAILED", figures["error"][:60]))
        elif maker is not None:
            rows += maker(figures)
    headers = ("item", "what", "value", "goal / beside", "verdict")
    cells = [headers, *[(r.item, r.what, r.value, r.goal, r.verdict) for r in rows]]
    widths = [max(len(c[i]) for c in cells) for i in range(len(headers))]
    lines = ["  ".join(c[i].ljust(widths[i]) for i in range(len(headers))) for c in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    m = results["machine"]
    head = (
        f"Relay bench ({'quick' if results['quick'] else 'full'}) on {m['cpu']}, "
        f"{m['cores']} cores, Python {m['python']}, Redis {m.get('redis', '?')},"
        f" RELAY_INLINE_MS {results.get('inline_ms', '?')}"
    )
    return "\n".join([head, "", *lines])
