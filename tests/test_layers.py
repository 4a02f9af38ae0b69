"""Imports point one way, with no cycle anywhere.

The layers themselves (workers' rooms, and the layers inside each room) are
contracts in pyproject.toml, checked by `lint-imports` in .ci/check. What is
here: the purity rules of agent_core and scheduler, read from the source; that
no module imports another that imports it back, counting every import (under
TYPE_CHECKING and inside functions too); and that the contracts do hold.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[1]

FORBIDDEN = {
    "agent_core": {"workers", "scheduler", "celery", "kombu", "redis", "httpx"},
    "scheduler": {"workers", "celery", "kombu", "httpx"},
}


def _imported_roots(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_no_module_imports_upwards(package: str) -> None:
    offenders = {
        str(path.relative_to(ROOT)): sorted(_imported_roots(path) & FORBIDDEN[package])
        for path in sorted((ROOT / package).rglob("*.py"))
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_importing_scheduler_loads_no_worker_code() -> None:
    probe = (
        "import sys, scheduler\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('workers', 'celery', 'kombu')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("package", ["agent_core", "workers", "scheduler"])
def test_functions_stay_a_screen_long(package: str) -> None:
    too_long = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > 60:
                    too_long.append(f"{path.relative_to(ROOT)}: {node.name} ({length} lines)")
    assert too_long == []


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules that import each other, round a loop (each sorted)."""

    def reached(start: str) -> set[str]:
        seen: set[str] = set()
        todo = list(edges.get(start, ()))
        while todo:
            module = todo.pop()
            if module not in seen:
                seen.add(module)
                todo.extend(edges.get(module, ()))
        return seen

    reach = {module: reached(module) for module in edges}
    looped = {module for module in edges if module in reach[module]}
    groups = {frozenset(m for m in looped if m in reach[n] and n in reach[m]) for n in looped}
    return sorted(sorted(group) for group in groups)


def test_the_cycle_finder_finds_a_cycle_through_a_package_face() -> None:
    edges = {"p": {"p.a"}, "p.a": {"p.b"}, "p.b": {"p"}, "p.c": {"p.a"}, "q": {"q"}}
    assert sorted(_cycles(edges)) == [["p", "p.a", "p.b"], ["q"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_imports_one_that_imports_it_back() -> None:
    # Every import counts: at the top, inside a function, under TYPE_CHECKING; and a
    # package's __init__ is a module like the others (importing it half-initialised
    # is a cycle through it).
    graph = grimp.build_graph("agent_core", "scheduler", "workers", cache_dir=None)
    edges = {m: set(graph.find_modules_directly_imported_by(m)) for m in graph.modules}
    assert _cycles(edges) == []


def test_the_layer_contracts_hold() -> None:
    # The contracts (pyproject.toml) include that no module of a worker imports the
    # command line (click, rich) but the worker's own options (--no-tick, --remote-control).
    lint_imports = Path(sys.executable).parent / "lint-imports"
    out = subprocess.run(
        [str(lint_imports), "--no-cache"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stdout[-4000:]
    assert "0 broken" in out.stdout


def test_every_benchmark_module_still_imports() -> None:
    # The benchmarks are not run in CI; a module moved under them must not break them quietly.
    names = sorted(f"bench.{path.stem}" for path in (ROOT / "bench").glob("*.py"))
    code = "import importlib, sys\nfor name in sys.argv[1:]: importlib.import_module(name)"
    command = [sys.executable, "-c", code, *names]
    done = subprocess.run(command, check=False, cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert len(names) > 20
