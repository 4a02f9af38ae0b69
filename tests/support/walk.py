"""Which `workers` modules a process enters: a profile hook, and reading what it wrote.

`record_to(path)` makes this process (every thread, and every child it forks
afterwards) append one line to `path` each time a function of a `workers`
module is called from another module: `<pid> <caller> <callee>`, the modules
as paths under `workers/` (`-` for a caller outside it). The test app installs
it when RELAY_TEST_WALK names a file (tests/apps/notes.py); `entered(path, from)`
reads back the modules entered after byte `from`, and `calls_up(path, from)` the calls
that ran against the import direction (a callback handed down, called from below).
"""

from __future__ import annotations

import ast
import os
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

__all__ = ["WORKERS", "calls_up", "entered", "record_to"]

WORKERS = str(Path(__file__).resolve().parents[2] / "workers") + os.sep


def _module(frame: FrameType | None) -> str:
    if frame is None:
        return "-"
    name = frame.f_code.co_filename
    return name[len(WORKERS) :] if name.startswith(WORKERS) else "-"


def record_to(path: str | Path) -> None:
    """Write every call into a `workers` module from another module to `path`."""
    out = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def hook(frame: FrameType, event: str, _arg: Any) -> None:
        if event != "call" or not frame.f_code.co_filename.startswith(WORKERS):
            return
        callee, caller = _module(frame), _module(frame.f_back)
        if caller != callee:
            os.write(out, f"{os.getpid()} {caller} {callee}\n".encode())

    sys.setprofile(hook)
    threading.setprofile(hook)


def stop() -> None:
    """Stop recording in this process (every thread started from now on, and this one)."""
    sys.setprofile(None)
    threading.setprofile(None)  # type: ignore[arg-type]


def entered(path: Path, start: int = 0) -> set[str]:
    """The modules (paths under `workers/`) entered, as recorded in `path` after byte `start`."""
    lines = path.read_bytes()[start:].decode().splitlines()
    return {f"workers/{line.split()[2]}" for line in lines if line.strip()}


def _imports(path: Path) -> set[str]:
    """The `workers` modules `path` imports when it runs (not those under TYPE_CHECKING)."""
    found: set[str] = set()

    class Reader(ast.NodeVisitor):
        def visit_If(self, node: ast.If) -> None:
            test = node.test
            if getattr(test, "id", getattr(test, "attr", "")) == "TYPE_CHECKING":
                for statement in node.orelse:
                    self.visit(statement)
                return
            self.generic_visit(node)

        def visit_Import(self, node: ast.Import) -> None:
            found.update(alias.name for alias in node.names)

        def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
            if node.module:
                found.add(node.module)
                found.update(f"{node.module}.{alias.name}" for alias in node.names)

    Reader().visit(ast.parse(path.read_text(encoding="utf-8")))
    return found


def _below() -> dict[str, set[str]]:
    """For each `workers` module (a path under `workers/`), every module it imports,
    directly or not: those below it."""
    root = Path(WORKERS)
    named = {}
    for path in root.rglob("*.py"):
        relative = path.relative_to(root).as_posix()
        dotted = "workers." + relative.removesuffix(".py").replace("/", ".")
        named[dotted.removesuffix(".__init__")] = relative
    direct = {
        named[dotted]: {named[m] for m in _imports(root / named[dotted]) if m in named}
        for dotted in named
    }
    below: dict[str, set[str]] = {}

    def reach(module: str) -> set[str]:
        if module not in below:
            below[module] = set()
            for imported in direct.get(module, set()):
                below[module] |= {imported, *reach(imported)}
        return below[module]

    for module in direct:
        reach(module)
    return below


def calls_up(path: Path, start: int = 0) -> set[tuple[str, str]]:
    """The calls recorded in `path` after byte `start` that run against the import
    direction: (caller, callee), paths under `workers/`, where the callee imports the
    caller (directly or not), as a callback handed down and called from below does."""
    below = _below()
    found = set()
    for line in path.read_bytes()[start:].decode().splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] != "-" and parts[1] in below.get(parts[2], set()):
            found.add((f"workers/{parts[1]}", f"workers/{parts[2]}"))
    return found
