"""6. Floors and peers: the same scripted turns in one process, through LangGraph, and DBOS.

- the pure core: `agent_core.run()` with the fake model as a function call;
- the core with the model over HTTP (the same loopback server Relay calls);
- LangGraph with a SQLite checkpointer (what a user might pick instead): a
  model node that calls the same server, a tool node, a loop between them,
  the state saved after every step; an approval is an `interrupt()`;
- the durable peers on the machine's PostgreSQL (`bench.durable`): the same
  graph with `PostgresSaver`, and a DBOS workflow with a step per model call
  and per tool call. A peer that cannot run here is "not measured: <reason>".

Per turn (a model call and a tool call; per step is half of it) each is set beside
Relay's turn from benchmark 1 (one agent, so all are sequential latency). Also: checkpoint bytes
of a LangGraph thread paused at its first approval and after four turns, and
per-turn time early and late in a long run (LangGraph keeps every checkpoint
and the whole history; Relay keeps one snapshot, bounded by `history_chars`).
"""

from __future__ import annotations

import itertools
import sqlite3
import time
import traceback
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

from agent_core import ModelRequest, ToolCall, ToolOutput
from agent_core import run as run_core
from bench import app as bench_app
from bench import durable
from bench.context import Bench, median
from bench.graph import TOOLS, Http, build_graph, thread_config, turn_gaps
from bench.model import Task, reply_for
from bench.turns import TURNS_PER_RUN

__all__ = ["run"]


class _CoreHost:
    """agent_core's Host: the fake model in process (or over HTTP), the bench tools."""

    def __init__(self, task: Task, http: Http | None) -> None:
        self.task = task
        self.http = http
        self.asked: list[float] = []

    def ask_model(self, request: ModelRequest) -> str:
        self.asked.append(time.perf_counter())
        if self.http is not None:
            return self.http.ask(f"{request.system}\n\n{request.prompt}")
        return reply_for(self.task, request.prompt)[0]

    def run_tool(self, call: ToolCall) -> ToolOutput:
        return ToolOutput.ok(TOOLS[call.tool](**call.args))


def _core(b: Bench, turns: int, size: int, http: Http | None) -> list[float]:
    """Run the core for `turns` turns; return each turn's ms."""
    task = Task(f"core-{'http' if http else 'local'}-{turns}-{size}", turns=turns, size=size)
    host = _CoreHost(task, http)
    agent = b.relay.kit.new_agent(bench_app.CONFIG)
    run_core(agent, host, task.text())
    return [(later - earlier) * 1000 for earlier, later in itertools.pairwise(host.asked)]


def _thread_bytes(db: sqlite3.Connection, thread: str) -> dict[str, int]:
    checkpoints = db.execute(
        "SELECT COUNT(*), COALESCE(SUM(LENGTH(checkpoint) + LENGTH(metadata)), 0)"
        " FROM checkpoints WHERE thread_id = ?",
        (thread,),
    ).fetchone()
    writes = db.execute(
        "SELECT COALESCE(SUM(LENGTH(value)), 0) FROM writes WHERE thread_id = ?", (thread,)
    ).fetchone()
    latest = db.execute(
        "SELECT LENGTH(checkpoint) + LENGTH(metadata) FROM checkpoints WHERE thread_id = ?"
        " ORDER BY checkpoint_id DESC LIMIT 1",
        (thread,),
    ).fetchone()
    return {
        "checkpoints": int(checkpoints[0]),
        "all_checkpoint_bytes": int(checkpoints[1]) + int(writes[0]),
        "latest_checkpoint_bytes": int(latest[0]) if latest else 0,
    }


def _langgraph(b: Bench, long_turns: int) -> dict[str, Any]:
    """LangGraph + SqliteSaver's bytes when parked, and its turns early and late in a long run."""
    from langgraph.checkpoint.sqlite import SqliteSaver  # noqa: PLC0415 - optional extra

    path = b.directory / "langgraph.sqlite"
    path.unlink(missing_ok=True)
    http = Http(b.model.url)
    db = sqlite3.connect(str(path), check_same_thread=False)
    graph = build_graph(http, SqliteSaver(db))
    out: dict[str, Any] = {}
    try:
        for label, parked in (("first_approval", 0), ("after_four_turns", 4)):
            task = Task(f"lg-park-{parked}", turns=parked, park=1)
            graph.invoke({"task": task.text()}, thread_config(f"park-{parked}"))
            out[f"bytes_{label}"] = _thread_bytes(db, f"park-{parked}")
        long_gaps = turn_gaps(b, graph, Task("lg-long", turns=long_turns, size=200), "long")
        out["long_run"] = {
            "turns": long_turns,
            "turn_ms_near_10": median(long_gaps[5:15]),
            f"turn_ms_near_{long_turns}": median(long_gaps[-10:]),
            **_thread_bytes(db, "long"),
        }
    finally:
        db.close()
        http.close()
    return out


def run(b: Bench) -> dict[str, Any]:
    """Time the same turns in the pure core, the core over HTTP and the peers; return figures."""
    turns = TURNS_PER_RUN
    long_turns = b.pick(500, 150)
    http = Http(b.model.url)
    _core(b, 3, 0, None)
    out: dict[str, Any] = {
        "turns": turns,
        "core_turn_ms": median(_core(b, turns, 0, None)),
        "core_http_turn_ms": median(_core(b, turns, 0, http)),
    }
    long_core = _core(b, long_turns, 200, None)
    out["core_long_run"] = {
        "turns": long_turns,
        "turn_ms_near_10": median(long_core[5:15]),
        f"turn_ms_near_{long_turns}": median(long_core[-10:]),
    }
    http.close()
    out.update(_side_by_side(b, turns, b.pick(5, 3)))
    if "turn_ms" in out["langgraph"]:
        out["langgraph"].update(_langgraph(b, long_turns))
    out.update(_ratios(b, out))
    return out


def _side_by_side(b: Bench, turns: int, rounds: int) -> dict[str, dict[str, Any]]:
    """Each peer that opens plays `rounds` runs of `turns` turns, round by round in turn (so
    the machine's drift hits all alike); the rest are "not measured" with the reason."""
    out: dict[str, dict[str, Any]] = {}
    with ExitStack() as stack:
        opened: dict[str, durable.Peer] = {}
        for key, open_peer in durable.PEERS.items():
            found = _guarded(stack.enter_context, open_peer(b))
            if isinstance(found, durable.Peer):
                opened[key] = found
            else:
                out[key] = found
        gaps: dict[str, list[float]] = {key: [] for key in opened}
        for r in range(-1, rounds):  # round -1 warms each peer up
            for key, peer in list(opened.items()):
                task = Task(f"{key}-{r}", turns=3 if r < 0 else turns)
                ran = _guarded(peer.run, task)
                if isinstance(ran, dict):
                    out[key] = ran
                    del opened[key]
                elif r >= 0:
                    gaps[key] += ran
        for key, peer in opened.items():
            stored = _guarded(peer.stored, Task(f"{key}-0", turns=turns))
            turn = median(gaps[key])
            out[key] = {"rounds": rounds, "turn_ms": turn, "step_ms": turn / 2}
            if isinstance(stored, int):
                out[key]["bytes_per_step"] = stored / durable.steps(turns)
    return out


def _guarded(act: Callable[..., Any], *args: Any) -> Any:
    """What `act(*args)` returns, or a peer's figures that say why it was not measured."""
    try:
        return act(*args)
    except durable.NotMeasured as reason:
        return {"skipped": f"not measured: {reason}"}
    except Exception as error:  # noqa: BLE001 - a broken peer must not lose the other figures
        traceback.print_exc()
        return {"skipped": f"not measured: {type(error).__name__}: {error}"}


def _ratios(b: Bench, out: dict[str, Any]) -> dict[str, Any]:
    """Relay's turn (benchmark 1, same run) over each peer's; a turn is two steps for all."""
    timing = b.results.get("turns", {}).get("timing", {})
    relay = timing.get("relay_turn_ms_one_agent")
    ratios: dict[str, Any] = {"relay_turn_ms_one_agent": relay}
    if relay is not None:
        ratios["relay_step_ms"] = relay / 2
        ratios["relay_over_core"] = relay / out["core_turn_ms"]
    for key in durable.PEERS:
        peer = out[key].get("turn_ms")
        if relay is not None and peer is not None:
            ratios[f"relay_over_{key}"] = relay / peer
    own = b.results.get("turns", {}).get("summary", {})
    if "relay_own_ms_per_turn_continued" in own:  # (issue 31: continuation in place on)
        ratios["own_turn_ms"] = own["relay_own_ms_per_turn_continued"]
        ratios["own_turn_ms_sent"] = own["relay_own_ms_per_turn"]
        ratios["own_over_core_http"] = ratios["own_turn_ms"] / out["core_http_turn_ms"]
    lg = out["langgraph"].get("turn_ms")
    if lg is not None:
        ratios["core_over_langgraph"] = out["core_turn_ms"] / lg
        ratios["core_http_over_langgraph"] = out["core_http_turn_ms"] / lg
    return ratios
