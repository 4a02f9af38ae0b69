"""The model ⇄ tool loop the peers run, as their users would write it for the fake model.

One kept-alive HTTP client for the loopback model server, the bench tools, the
prompt and the history line (the same for every peer, so the fake model replies
alike), and the LangGraph graph that any checkpointer (SQLite, PostgreSQL) saves.
"""

from __future__ import annotations

import itertools
import json
import operator
from collections.abc import Callable
from typing import Annotated, Any, TypedDict

import httpx

from bench import app as bench_app
from bench.context import Bench
from bench.model import Task

__all__ = [
    "TOOLS",
    "Http",
    "State",
    "build_graph",
    "history_line",
    "prompt_for",
    "thread_config",
    "turn_gaps",
]

TOOLS: dict[str, Callable[..., str]] = {
    "noop": bench_app.noop,
    "wait": bench_app.wait,
    "approve_me": bench_app.approve_me,
}


class Http:
    """One kept-alive client for the loopback model server (as a user's code would hold)."""

    def __init__(self, url: str) -> None:
        self.client = httpx.Client(base_url=url, timeout=30)

    def ask(self, prompt: str) -> str:
        body = {"model": "bench", "messages": [{"role": "user", "content": prompt}]}
        answer = self.client.post("/chat/completions", json=body)
        answer.raise_for_status()
        return str(answer.json()["choices"][0]["message"]["content"])

    def close(self) -> None:
        self.client.close()


def prompt_for(task: str, history: list[str]) -> str:
    """The prompt a peer sends: the task and every history line so far."""
    shown = "\n\n".join(history)
    return f"Task:\n{task}\n\nWhat happened so far:\n{shown}"


def history_line(number: int, call: dict[str, Any], output: str) -> str:
    """One tool call and its output, as the next prompt shows it."""
    return f"[call-{number}] {call['tool']} {json.dumps(call['args'])}\n→ ok: {output}"


class State(TypedDict, total=False):
    """The LangGraph run's state: the task, the history (appended to), the pending call."""

    task: str
    history: Annotated[list[str], operator.add]
    call: dict[str, Any] | None
    final: str | None


def build_graph(http: Http, checkpointer: Any) -> Any:
    """A model ⇄ tool loop saved by `checkpointer` after every step; approval is an interrupt."""
    # The optional `bench` extra: imported here so the rest runs without it.
    from langgraph.graph import END, START, StateGraph  # noqa: PLC0415
    from langgraph.types import interrupt  # noqa: PLC0415

    def model(state: State) -> dict[str, Any]:
        reply = json.loads(http.ask(prompt_for(state["task"], state.get("history", []))))
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
        return {"history": [history_line(number, call, output)], "call": None}

    def route(state: State) -> str:
        return "tool" if state.get("call") else END

    graph = StateGraph(State)
    graph.add_node("model", model)
    graph.add_node("tool", tool)
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", route)
    graph.add_edge("tool", "model")
    return graph.compile(checkpointer=checkpointer)


def thread_config(thread: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread}, "recursion_limit": 100_000}


def turn_gaps(
    b: Bench, graph: Any, task: Task, thread: str, durability: str | None = None
) -> list[float]:
    """Run `task` on `thread` to its end; return the ms between its model calls (one a turn).

    `durability` is LangGraph's: None is its default ("async": a step's checkpoint is written
    while the next step runs), "sync" writes it before the next step starts.
    """
    graph.invoke({"task": task.text()}, thread_config(thread), durability=durability)
    return model_gaps(b, task)


def model_gaps(b: Bench, task: Task) -> list[float]:
    """The ms between the model server's consecutive calls for `task` (one a turn)."""
    times = [t for t, _ in b.brain.arrivals[task.marker]]
    return [(later - earlier) * 1000 for earlier, later in itertools.pairwise(times)]
