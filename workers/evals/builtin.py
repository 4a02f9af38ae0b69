"""The app `relay eval --builtin` runs its suite on: offline tools only.

    relay eval --builtin --route local      # a private Redis and a worker for this app

Its tools touch nothing outside one private folder (RELAY_EVAL_DIR, default
`relay-eval-<uid>` in the system's temp dir): each run tree gets a world of its own,
one JSON file named by its root run, made on first use: a few notes, a ledger of
two accounts, and a table of cities to look up. So trials never see each other's
writes, and `expect.after` reads the world of the run it checks.

    list_notes, read_note, write_note    a notes folder (write_note: CREATE)
    calculate                            arithmetic (+ - * / ** and brackets)
    lookup_city                          population and country of a few cities
    balance, transfer                    a fake ledger (transfer: MONEY, always asks)
    researcher                           a specialist with lookup_city and calculate

A final answer that states a population is sent back unless it names its source
(`Source: ...`): the built-in suite's case of a final that must be sent back.
"""

from __future__ import annotations

import ast
import fcntl
import json
import operator
import os
import re
import stat
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from agent_core import Outcome, Risk, Specialist
from workers.engine.ids import root_of
from workers.kit.tools import ToolContext
from workers.relay import Relay
from workers.settings import Settings

__all__ = ["CITIES", "NOTES", "build", "relay", "world_folder"]

NOTES = {
    "a.txt": "Shopping: apples, pears and plums.\n",
    # Long enough that three of them overflow a 1,000-character history (the colour
    # first: a result is shown cut to a quarter of the history).
    "long1.txt": "The shed door is painted green. " + "Minutes of the garden committee. " * 24,
    "long2.txt": "The new tiles are red. " + "Minutes of the roof committee. " * 24,
    "long3.txt": "The fence will be blue. " + "Minutes of the paint committee. " * 24,
}
CITIES = {
    "paris": ("France", 2_102_650),
    "berlin": ("Germany", 3_878_100),
    "madrid": ("Spain", 3_332_035),
    "rome": ("Italy", 2_748_109),
    "lisbon": ("Portugal", 545_796),
}
OPENING_BALANCES = {"checking": 1_000, "savings": 250}
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


def world_folder() -> Path:
    """The private folder the worlds live in (made 0700; refused if not private)."""
    configured = os.environ.get("RELAY_EVAL_DIR", "").strip()
    folder = Path(configured or Path(tempfile.gettempdir()) / f"relay-eval-{os.getuid()}")
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = os.lstat(folder)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o022:
        raise PermissionError(f"refusing the eval folder {folder}: not a private folder of ours")
    return folder


@contextmanager
def _world(context: ToolContext) -> Iterator[dict[str, Any]]:
    """The run tree's world, locked while a call reads or changes it, saved after."""
    folder = world_folder()
    root = root_of(context.run_id)
    if not _NAME.fullmatch(root):
        raise ValueError(f"not a run id: {root!r}")
    path = folder / f"{root}.json"
    with open(folder / f"{root}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        world = json.loads(path.read_text()) if path.exists() else _new_world()
        yield world
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps(world))
        os.replace(temporary, path)


def _new_world() -> dict[str, Any]:
    return {"notes": dict(NOTES), "ledger": dict(OPENING_BALANCES)}


_OPERATORS: dict[type, Callable[..., float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.Pow: operator.pow,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}


def _arithmetic(node: ast.AST) -> float:
    """Numbers, + - * / ** and brackets; nothing else is evaluated."""
    if (
        isinstance(node, ast.Constant)
        and isinstance(node.value, int | float)
        and not isinstance(node.value, bool)
    ):
        return float(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        right = _arithmetic(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > 64:
            raise ValueError("an exponent above 64 is refused")
        return _OPERATORS[type(node.op)](_arithmetic(node.left), right)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPERATORS:
        return _OPERATORS[type(node.op)](_arithmetic(node.operand))
    raise ValueError("only numbers, + - * / ** and brackets are understood")


def _cited(outcome: Outcome) -> str | None:
    text = outcome.summary
    if "population" in text.casefold() and "source:" not in text.casefold():
        return "A population needs its source: end the answer with 'Source: <the tool used>'."
    return None


def build(settings: Settings | None = None) -> Relay:
    """The built-in eval app (its routes and settings from the environment, or `settings`)."""
    researcher = Specialist(
        "researcher", "Looks up facts about cities and does the arithmetic on them."
    ).tools(["lookup_city", "calculate"])
    app = Relay("relay-eval", specialists=[researcher], questions=True, settings=settings)
    app.verifier(_cited)
    _notes_tools(app)
    _fact_tools(app)
    _ledger_tools(app)
    return app


def _notes_tools(app: Relay) -> None:
    @app.tool(risk=Risk.READ)
    def list_notes(context: ToolContext) -> str:
        """List the notes."""
        with _world(context) as world:
            return ", ".join(sorted(world["notes"]))

    @app.tool(risk=Risk.READ)
    def read_note(name: str, context: ToolContext) -> str:
        """Read one note.

        Args:
            name: The note's name, as list_notes shows it.
        """
        with _world(context) as world:
            if name not in world["notes"]:
                raise FileNotFoundError(f"there is no note named {name}")
            return str(world["notes"][name])

    @app.tool(risk=Risk.CREATE)
    def write_note(name: str, text: str, context: ToolContext) -> str:
        """Write a note, replacing one of that name.

        Args:
            name: A plain name, such as summary.txt.
            text: The whole text of the note.
        """
        if not _NAME.fullmatch(name):
            raise ValueError(f"{name!r} is not a note name; use one such as summary.txt")
        with _world(context) as world:
            world["notes"][name] = text
        return f"wrote {len(text)} characters to {name}"


def _fact_tools(app: Relay) -> None:
    @app.tool(risk=Risk.READ)
    def calculate(expression: str) -> str:
        """Work out an arithmetic expression, such as (17 * 23) + 4.

        Args:
            expression: Numbers with + - * / ** and brackets.
        """
        if len(expression) > 200:
            raise ValueError("an expression is at most 200 characters")
        value = _arithmetic(ast.parse(expression, mode="eval").body)
        return f"{value:g}" if abs(value) < 1e15 else repr(value)

    @app.tool(risk=Risk.READ)
    def lookup_city(city: str) -> str:
        """Look up a city's country and population.

        Args:
            city: The city's name in English, such as Paris.
        """
        found = CITIES.get(city.strip().casefold())
        if found is None:
            raise LookupError(f"no city named {city!r} in the table")
        country, people = found
        return f"{city.strip().title()}, {country}: population {people:,}"


def _ledger_tools(app: Relay) -> None:
    @app.tool(risk=Risk.READ)
    def balance(account: str, context: ToolContext) -> str:
        """The balance of an account (checking or savings).

        Args:
            account: checking or savings.
        """
        with _world(context) as world:
            if account not in world["ledger"]:
                raise LookupError(f"no account named {account!r}")
            return f"{account}: {world['ledger'][account]} EUR"

    @app.tool(risk=Risk.MONEY)
    def transfer(source: str, target: str, amount: int, context: ToolContext) -> str:
        """Move money between two accounts.

        Args:
            source: The account the money leaves.
            target: The account it goes to.
            amount: Whole euros, more than 0.
        """
        with _world(context) as world:
            ledger = world["ledger"]
            if source not in ledger or target not in ledger or amount <= 0:
                raise ValueError("both accounts must exist and the amount be positive")
            ledger[source] -= amount
            ledger[target] += amount
        return f"moved {amount} EUR from {source} to {target}"


relay = build()
