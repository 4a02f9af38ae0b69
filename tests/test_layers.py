"""Imports point one way: workers → scheduler → agent_core, and workers → agent_core."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

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


def test_the_runtime_never_imports_the_command_line() -> None:
    # workers/cli/ sits on top of the runtime: a worker never needs click or rich.
    offenders = {}
    for path in sorted((ROOT / "workers").rglob("*.py")):
        where = path.relative_to(ROOT).as_posix()
        if where.startswith("workers/cli/"):
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        modules = {
            alias.name
            for node in ast.walk(tree)
            if isinstance(node, ast.Import)
            for alias in node.names
        } | {
            node.module
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0
        }
        used = sorted(
            m
            for m in modules
            if m in ("workers.cli", "click", "rich") or m.startswith("workers.cli.")
        )
        # The worker's own --no-tick option is click's.
        if used and where != "workers/celery_app/app.py":
            offenders[where] = used
    assert offenders == {}


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
