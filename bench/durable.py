"""6. Durable peers on PostgreSQL: LangGraph + PostgresSaver, and DBOS Transact.

The same scripted turns as the other peers (a model call to the loopback
server, then a tool call), each step saved before the next begins:

- LangGraph's graph from `bench.graph` with `PostgresSaver` (a checkpoint per
  superstep, autocommit);
- a DBOS workflow with one `@DBOS.step` per model call and one per tool call
  (DBOS writes each step's output to its system database before going on).

Each peer gets a database of its own, with a unique name, on the machine's
PostgreSQL (`BENCH_POSTGRES_URL`, default the local server as user postgres),
dropped at the end even on error. A peer that cannot run here (package absent,
server unreachable) raises `NotMeasured`, which `bench.peers` records as its
reason; no figure is made up.
"""

from __future__ import annotations

import json
import os
import secrets
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any
from urllib.parse import urlsplit

from bench.context import Bench
from bench.graph import TOOLS, Http, build_graph, history_line, model_gaps, prompt_for, turn_gaps
from bench.model import Task

__all__ = [
    "PEERS",
    "POSTGRES_URL",
    "NotMeasured",
    "Peer",
    "dbos",
    "postgres_saver",
    "scratch_database",
    "sqlite_saver",
    "steps",
]

POSTGRES_URL = os.environ.get("BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
"""An administrative connection (it may create and drop databases)."""


class NotMeasured(Exception):
    """Raised when a peer cannot be measured here: its package is absent or PostgreSQL is away."""


def steps(turns: int) -> int:
    """Steps of a run of `turns` turns: a model and a tool call a turn, and the final model call."""
    return 2 * turns + 1


@dataclass(frozen=True)
class Peer:
    """An open peer: `run` plays a task to its end and returns the ms between its model
    calls (one a turn); `stored` returns the bytes the peer keeps for that task's run."""

    run: Callable[[Task], list[float]]
    stored: Callable[[Task], int]


def _where() -> str:
    parts = urlsplit(POSTGRES_URL)
    return f"{parts.hostname}:{parts.port or 5432}"


@contextmanager
def scratch_database(prefix: str) -> Iterator[str]:
    """Create a database named `prefix` plus a unique suffix; yield its URL; drop it at the end.

    Raises NotMeasured when psycopg is absent or the server cannot be reached. The
    drop closes any session still open on the database (`WITH (FORCE)`), even on error.
    """
    try:
        import psycopg  # noqa: PLC0415 - optional `bench` extra
        from psycopg import sql  # noqa: PLC0415
    except ImportError as error:
        raise NotMeasured(f"not installed ({error.name}): pip install '.[bench]'") from error
    name = f"{prefix}_{os.getpid()}_{secrets.token_hex(4)}"
    try:
        admin = psycopg.connect(POSTGRES_URL, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise NotMeasured(f"PostgreSQL not reachable at {_where()}: {reason}") from error
    with admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        try:
            yield urlsplit(POSTGRES_URL)._replace(path=f"/{name}").geturl()
        finally:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


# --- LangGraph + SqliteSaver (a file) ----------------------------------------------------

_SQLITE_BYTES = """
SELECT (SELECT COALESCE(SUM(LENGTH(checkpoint) + LENGTH(metadata)), 0)
          FROM checkpoints WHERE thread_id = ?)
     + (SELECT COALESCE(SUM(LENGTH(value)), 0) FROM writes WHERE thread_id = ?)
"""


@contextmanager
def sqlite_saver(b: Bench, durability: str | None = None) -> Iterator[Peer]:
    """LangGraph saved by SqliteSaver in a file of the bench's work directory."""
    try:
        from langgraph.checkpoint.sqlite import SqliteSaver  # noqa: PLC0415 - optional extra
    except ImportError as error:
        raise NotMeasured(f"not installed ({error.name}): pip install '.[bench]'") from error
    path = b.directory / f"langgraph-turns-{durability or 'default'}.sqlite"
    path.unlink(missing_ok=True)
    http = Http(b.model.url)
    db = sqlite3.connect(str(path), check_same_thread=False)
    graph = build_graph(http, SqliteSaver(db))

    def stored(task: Task) -> int:
        row = db.execute(_SQLITE_BYTES, (task.marker, task.marker)).fetchone()
        return int(row[0])

    try:
        yield Peer(lambda task: turn_gaps(b, graph, task, task.marker, durability), stored)
    finally:
        db.close()
        http.close()


# --- LangGraph + PostgresSaver -----------------------------------------------------------

_LG_BYTES = """
SELECT
  (SELECT COALESCE(SUM(octet_length(checkpoint::text) + octet_length(metadata::text)), 0)
     FROM checkpoints WHERE thread_id = %(t)s)
+ (SELECT COALESCE(SUM(octet_length(blob)), 0) FROM checkpoint_blobs WHERE thread_id = %(t)s)
+ (SELECT COALESCE(SUM(octet_length(blob)), 0) FROM checkpoint_writes WHERE thread_id = %(t)s)
"""


@contextmanager
def postgres_saver(b: Bench, durability: str | None = None) -> Iterator[Peer]:
    """LangGraph saved by PostgresSaver in a database of its own (JSONB counted as text)."""
    try:
        from langgraph.checkpoint.postgres import PostgresSaver  # noqa: PLC0415
    except ImportError as error:
        raise NotMeasured(f"not installed ({error.name}): pip install '.[bench]'") from error
    http = Http(b.model.url)
    try:
        with (
            scratch_database("relay_bench_lg") as url,
            PostgresSaver.from_conn_string(url) as saver,
        ):
            saver.setup()
            graph = build_graph(http, saver)
            yield Peer(
                lambda task: turn_gaps(b, graph, task, task.marker, durability),
                lambda task: _count(url, _LG_BYTES, {"t": task.marker})[0],
            )
    finally:
        http.close()


# --- DBOS Transact -----------------------------------------------------------------------

_DBOS_BYTES = """
SELECT COALESCE(SUM(octet_length(COALESCE(output, ''))), 0)
     + (SELECT COALESCE(SUM(octet_length(COALESCE(inputs, ''))
                          + octet_length(COALESCE(output, ''))), 0)
          FROM dbos.workflow_status WHERE workflow_uuid = %(w)s)
FROM dbos.operation_outputs WHERE workflow_uuid = %(w)s
"""


@contextmanager
def dbos(b: Bench) -> Iterator[Peer]:
    """A DBOS workflow (a step per model and per tool call) on a database of its own.

    Bytes are what DBOS keeps for the workflow: its inputs and output, and every step's
    output (a step's inputs are not kept: a recovered workflow runs its code again).
    """
    try:
        from dbos import DBOS, SetWorkflowID  # noqa: PLC0415 - optional `bench` extra
    except ImportError as error:
        raise NotMeasured(f"not installed ({error.name}): pip install '.[bench]'") from error
    http = Http(b.model.url)

    # Registered before launch, as DBOS requires; `destroy` drops the registry.
    @DBOS.step()
    def model(prompt: str) -> str:
        return http.ask(prompt)

    @DBOS.step()
    def tool(call: dict[str, Any]) -> str:
        return TOOLS[call["tool"]](**call["args"])

    @DBOS.workflow()
    def agent(task: str) -> str:
        history: list[str] = []
        while True:
            reply = json.loads(model(prompt_for(task, history)))
            if "final" in reply:
                return str(reply["final"])
            call = {"tool": reply["tool"], "args": reply["args"]}
            history.append(history_line(len(history) + 1, call, tool(call)))

    def run(task: Task) -> list[float]:
        with SetWorkflowID(task.marker):
            agent(task.text())
        return model_gaps(b, task)

    try:
        with scratch_database("relay_bench_dbos") as url:
            try:
                DBOS(
                    config={
                        "name": "relay-bench",
                        "system_database_url": url,
                        "log_level": "WARNING",
                    }
                )
                DBOS.launch()
                yield Peer(run, lambda task: _count(url, _DBOS_BYTES, {"w": task.marker})[0])
            finally:
                DBOS.destroy(destroy_registry=True)
    finally:
        http.close()


def _count(url: str, query: str, params: dict[str, str]) -> list[int]:
    """Run a query of whole numbers on the database at `url`; return its one row."""
    import psycopg  # noqa: PLC0415 - optional `bench` extra

    with psycopg.connect(url) as db:
        row = db.execute(query, params).fetchone()
    return [int(v) for v in row] if row else []


PEERS: dict[str, Callable[[Bench], AbstractContextManager[Peer]]] = {
    "langgraph": sqlite_saver,
    "langgraph_postgres": postgres_saver,
    "dbos": dbos,
    "langgraph_sync": partial(sqlite_saver, durability="sync"),
    "langgraph_postgres_sync": partial(postgres_saver, durability="sync"),
}
"""Each peer's key in the figures, and how to open it. LangGraph's default durability
("async") writes a step's checkpoint while the next step runs; "sync" writes it before,
as Relay and DBOS do."""
