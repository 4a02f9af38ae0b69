"""agent_core stays pure, and its public names stay as DESIGN fixes them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import agent_core

ROOT = Path(__file__).resolve().parent.parent
FORBIDDEN = ("celery", "kombu", "redis", "httpx", "workers", "scheduler")

EXPORTED = [
    "Agent",
    "AgentError",
    "Ask",
    "Attachment",
    "Config",
    "Daily",
    "DataError",
    "DefinitionError",
    "Done",
    "Every",
    "FinalStream",
    "Host",
    "Kind",
    "ModelRequest",
    "Outcome",
    "Plan",
    "Policy",
    "Question",
    "Recipe",
    "RecipeError",
    "Risk",
    "Run",
    "Skill",
    "SkillError",
    "SkillReport",
    "SnapshotError",
    "Specialist",
    "Step",
    "Stop",
    "Summarize",
    "Tool",
    "ToolArgsError",
    "ToolCall",
    "ToolOutput",
    "TraceEvent",
    "Trigger",
    "UsageError",
    "Weekly",
    "run",
    "trigger_from_json",
]


def _modules_after(code: str) -> list[str]:
    """Return the modules a fresh interpreter holds after running `code`."""
    shown = "import json, sys; print(json.dumps(sorted(sys.modules)))"
    finished = subprocess.run(
        [sys.executable, "-c", f"{code}\n{shown}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return list(json.loads(finished.stdout))


def test_importing_agent_core_imports_no_runtime_package() -> None:
    loaded = _modules_after("import agent_core, agent_core.driver, agent_core.stream")
    assert "agent_core" in loaded
    heavy = sorted(m for m in loaded if m.split(".")[0] in FORBIDDEN)
    assert heavy == []


def test_every_agent_core_module_imports_alone_without_runtime_packages() -> None:
    modules = sorted(p.stem for p in (ROOT / "agent_core").glob("*.py") if p.stem != "__init__")
    assert "agent" in modules
    imports = "\n".join(f"import agent_core.{m}" for m in modules)
    loaded = _modules_after(imports)
    assert sorted(m for m in loaded if m.split(".")[0] in FORBIDDEN) == []


def test_agent_core_source_never_names_the_runtime_packages() -> None:
    for path in (ROOT / "agent_core").glob("*.py"):
        for line in path.read_text(encoding="utf-8").splitlines():
            words = line.strip().split()
            if words[:1] in (["import"], ["from"]) and len(words) > 1:
                assert words[1].split(".")[0] not in FORBIDDEN, f"{path.name}: {line}"


def test_the_exported_names_are_exactly_these() -> None:
    assert agent_core.__all__ == EXPORTED


def test_the_exported_names_are_sorted() -> None:
    assert sorted(agent_core.__all__) == agent_core.__all__


@pytest.mark.parametrize("name", EXPORTED)
def test_every_exported_name_is_importable(name: str) -> None:
    namespace: dict[str, object] = {}
    exec(f"from agent_core import {name}", namespace)
    assert namespace[name] is getattr(agent_core, name)


def test_star_import_gives_the_exported_names() -> None:
    namespace: dict[str, object] = {}
    exec("from agent_core import *", namespace)
    assert sorted(k for k in namespace if k != "__builtins__") == sorted(EXPORTED)


def test_every_error_is_rooted_in_agent_error() -> None:
    errors = [getattr(agent_core, n) for n in EXPORTED if n.endswith("Error")]
    assert len(errors) == 8
    assert all(issubclass(e, agent_core.AgentError) for e in errors)
