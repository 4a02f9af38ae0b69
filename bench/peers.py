"""6. Floors and peers: the same scripted turns in one process, and through LangGraph.

- the pure core: `agent_core.run()` with the fake model as a function call;
- the core with the model over HTTP (the same loopback server Relay calls);
- LangGraph with a SQLite checkpointer (what a user might pick instead): a
  model node that calls the same server, a tool node, a loop between them,
  the state saved after every step; an approval is an `interrupt()`.

Per turn (a model call and a tool call) each is set beside Relay's turn from
benchmark 1 (one agent, so all are sequential latency). Also: checkpoint bytes
of a LangGraph thread paused at its first approval and after four turns, and
per-turn time early and late in a long run (LangGraph keeps every checkpoint
and the whole history; Relay keeps one snapshot, bounded by `history_chars`).
"""

from __future__ import annotations

import itertools
import json
import operator
import sqlite3
import time
from collections.abc import Callable
from typing import Annotated, Any, TypedDict

import httpx

from agent_core import ModelRequest, ToolCall, ToolOutput
from agent_core import run as run_core
from bench import app as bench_app
from bench.context import Bench, median
from bench.model import Task, reply_for
from bench.turns import TURNS_PER_RUN

__all__ = ["run"]

TOOLS: dict[str, Callable[..., str]] = {
    "noop": bench_app.noop,
    "wait": bench_app.wait,
    "approve_me": bench_app.approve_me,
}


class _Http:
    """One kept-alive client for the loopback model server (as a user's code would hold)."""

    def __init__(self, url: str) -> None:
        self.client = httpx.Client(base_url=url, timeout=30)

    def ask(self, prompt: str) -> str:
        body = {"model": "bench", "messages": [{"role": "user", "content": prompt}]}
        answer = self.client.post("/chat/completions", json=body)
        answer.raise_for_status()
        return str(answer.json()["choices"][0]["message"]["content"])


class _CoreHost:
    """agent_core's Host: the fake model in process (or over HTTP), the bench tools."""

    def __init__(self, task: Task, http: _Http | None) -> None:
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


def _core(b: Bench, turns: int, size: int, http: _Http | None) -> list[float]:
    """Run the core for `turns` turns; return each turn's ms."""
    task = Task(f"core-{'http' if http else 'local'}-{turns}-{size}", turns=turns, size=size)
    host = _CoreHost(task, http)
    agent = b.relay.kit.new_agent(bench_app.CONFIG)
    run_core(agent, host, task.text())
    return [(later - earlier) * 1000 for earlier, later in itertools.pairwise(host.asked)]


# --- LangGraph ---------------------------------------------------------------------------


class State(TypedDict, total=False):
    """The LangGraph run's state: the task, the history (appended to), the pending call."""

    task: str
    history: Annotated[list[str], operator.add]
    call: dict[str, Any] | None
    final: str | None


def _graph(http: _Http, checkpointer: Any) -> Any:
    """A model ⇄ tool loop, as a LangGraph user would write it for this fake model."""
    # The optional `bench` extra: imported here so the rest runs without it.
    from langgraph.graph import END, START, StateGraph  # noqa: PLC0415
    from langgraph.types import interrupt  # noqa: PLC0415

    def model(state: State) -> dict[str, Any]:
        shown = "\n\n".join(state.get("history", []))
        reply = json.loads(http.ask(f"Task:\n{state['task']}\n\nWhat happened so far:\n{shown}"))
        if "final" in reply:
            return {"final": reply["final"], "call": None}
        return {"call": {"tool": reply["tool"], "args": reply["args"]}}

    def tool(state: State) -> dict[str, Any]:
        call = state["call"]
        assert call is not None
        if call["tool"] == "approve_me" and not interrupt({"approve": call}):
            output = "declined by the person"
        else:
            output = TOOLS[call["tool"]](**call["args"])
        number = len(state.get("history", [])) + 1
        line = f"[call-{number}] {call['tool']} {json.dumps(call['args'])}\n→ ok: {output}"
        return {"history": [line], "call": None}

    def route(state: State) -> str:
        return "tool" if state.get("call") else END

    graph = StateGraph(State)
    graph.add_node("model", model)
    graph.add_node("tool", tool)
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", route)
    graph.add_edge("tool", "model")
    return graph.compile(checkpointer=checkpointer)


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


def _langgraph(b: Bench, turns: int, long_turns: int) -> dict[str, Any]:
    from langgraph.checkpoint.sqlite import SqliteSaver  # noqa: PLC0415 - optional extra

    path = b.directory / "langgraph.sqlite"
    path.unlink(missing_ok=True)
    http = _Http(b.model.url)
    db = sqlite3.connect(str(path), check_same_thread=False)
    graph = _graph(http, SqliteSaver(db))
    out: dict[str, Any] = {}
    try:
        _lg_turns(b, graph, Task("lg-warm", turns=3), "warm")
        out["turn_ms"] = median(_lg_turns(b, graph, Task("lg-turns", turns=turns), "turns"))
        for label, parked in (("first_approval", 0), ("after_four_turns", 4)):
            task = Task(f"lg-park-{parked}", turns=parked, park=1)
            graph.invoke({"task": task.text()}, _config(f"park-{parked}"))
            out[f"bytes_{label}"] = _thread_bytes(db, f"park-{parked}")
        long_gaps = _lg_turns(b, graph, Task("lg-long", turns=long_turns, size=200), "long")
        out["long_run"] = {
            "turns": long_turns,
            "turn_ms_near_10": median(long_gaps[5:15]),
            f"turn_ms_near_{long_turns}": median(long_gaps[-10:]),
            **_thread_bytes(db, "long"),
        }
    finally:
        db.close()
        http.client.close()
    return out


def _config(thread: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread}, "recursion_limit": 100_000}


def _lg_turns(b: Bench, graph: Any, task: Task, thread: str) -> list[float]:
    graph.invoke({"task": task.text()}, _config(thread))
    times = [t for t, _ in b.brain.arrivals[task.marker]]
    return [(later - earlier) * 1000 for earlier, later in itertools.pairwise(times)]


def run(b: Bench) -> dict[str, Any]:
    """Time the same turns in the pure core, the core over HTTP and LangGraph; return figures."""
    turns = TURNS_PER_RUN
    long_turns = b.pick(500, 150)
    http = _Http(b.model.url)
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
    http.client.close()
    try:
        out["langgraph"] = _langgraph(b, turns, long_turns)
    except ImportError as error:
        out["langgraph"] = {"skipped": f"not installed ({error.name}): pip install '.[bench]'"}
    out.update(_ratios(b, out))
    return out


def _ratios(b: Bench, out: dict[str, Any]) -> dict[str, Any]:
    timing = b.results.get("turns", {}).get("timing", {})
    relay = timing.get("relay_turn_ms_one_agent")
    lg = out["langgraph"].get("turn_ms")
    ratios: dict[str, Any] = {"relay_turn_ms_one_agent": relay}
    if relay is not None and lg is not None:
        ratios["relay_over_langgraph"] = relay / lg
    if lg is not None:
        ratios["core_over_langgraph"] = out["core_turn_ms"] / lg
        ratios["core_http_over_langgraph"] = out["core_http_turn_ms"] / lg
    if relay is not None:
        ratios["relay_over_core"] = relay / out["core_turn_ms"]
    return ratios
