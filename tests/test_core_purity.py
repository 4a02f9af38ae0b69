"""agent_core stays pure, and its public names stay as DESIGN fixes them.

One module may touch the disk, `agent_core.skill_files` (reading skill folders
for `Skill.load` and for a host carrying out `read_skill_file`). The tests
below prove the rest never does: no other module imports a filesystem module
or calls `open`; no module imports `skill_files` when it is imported, only
`Skill.load`/`load_all` and the driver's `read_skill_file` do when called;
and a whole scripted run, skills read and snapshots restored, makes no
filesystem call at all (an audit hook watches).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap
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
    "Cron",
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


# --- the disk: skill_files alone --------------------------------------------------------------

DISK_MODULES = {"os", "pathlib", "io", "shutil", "glob", "stat", "tempfile", "fileinput", "mmap"}
DISK_MODULE = "skill_files"
LAZY_IMPORTERS = {"skills": {"load", "load_all"}, "driver": {"_read_skill_file"}}
"""Where skill_files is imported, inside which functions: only when called."""


def _core_modules() -> dict[str, ast.Module]:
    return {
        path.stem: ast.parse(path.read_text(encoding="utf-8"))
        for path in sorted((ROOT / "agent_core").glob("*.py"))
    }


def _type_checking_only(tree: ast.Module) -> set[int]:
    """Return the ids of nodes under `if TYPE_CHECKING:` (never run)."""
    hidden: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) in (
            "TYPE_CHECKING",
            "typing.TYPE_CHECKING",
        ):
            hidden |= {id(inner) for stmt in node.body for inner in ast.walk(stmt)}
    return hidden


def _imports(tree: ast.Module) -> list[tuple[str, ast.AST]]:
    """Return (module imported, node) for every import that runs, at any depth."""
    hidden = _type_checking_only(tree)
    found: list[tuple[str, ast.AST]] = []
    for node in ast.walk(tree):
        if id(node) in hidden:
            continue
        if isinstance(node, ast.Import):
            found += [(alias.name, node) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.append((node.module, node))
            found += [(f"{node.module}.{alias.name}", node) for alias in node.names]
    return found


def test_only_skill_files_imports_a_filesystem_module_or_calls_open() -> None:
    touching = set()
    for name, tree in _core_modules().items():
        used = {module.split(".")[0] for module, _ in _imports(tree)} & DISK_MODULES
        opens = any(
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "open"
            for node in ast.walk(tree)
        )
        if used or opens:
            touching.add(name)
    assert touching == {DISK_MODULE}


def test_skill_files_is_imported_only_lazily_and_only_where_it_is_needed() -> None:
    importers: dict[str, set[str]] = {}
    for name, tree in _core_modules().items():
        functions = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]
        for module, node in _imports(tree):
            if module != f"agent_core.{DISK_MODULE}":
                continue
            inside = {f.name for f in functions if node in list(ast.walk(f))}
            assert inside, f"{name} imports {DISK_MODULE} at module level"
            importers.setdefault(name, set()).update(inside)
    assert importers == LAZY_IMPORTERS


def test_importing_the_core_and_the_driver_does_not_load_skill_files() -> None:
    modules = sorted(p.stem for p in (ROOT / "agent_core").glob("*.py") if p.stem != DISK_MODULE)
    loaded = _modules_after("\n".join(f"import agent_core.{m}" for m in modules if m != "__init__"))
    assert "agent_core.transitions" in loaded
    assert f"agent_core.{DISK_MODULE}" not in loaded


# Plays a task with skills that have folders and files: a long body, use_skill, reads
# (their results fed in as a host would), a snapshot and restore mid-read, and the end.
# The second time round, an audit hook records every filesystem event Python raises.
_AUDITED_RUN = """
import sys
from agent_core import Agent, Config, Done, Kind, Risk, Run, Skill, Tool, ToolOutput

def play():
    skill = Skill(name="pdf", description="Forms.", body="Line of the body.\\n" * 2_000,
                  folder="/nonexistent/skills/pdf", resources=("FORMS.md", "scripts/fill.py"))
    tools = [Tool("read_file", "Read").arg("path", Kind.TEXT).risk(Risk.READ)]
    config = Config(require_plan=False)
    agent = Agent(config, tools).with_skills([skill])
    agent.start("Fill the form")
    agent.reply('{"tool": "use_skill", "args": {"name": "pdf"}}')
    step = agent.reply('{"tool": "read_skill_file", "args": {"skill": "pdf", "path": "FORMS.md"}}')
    assert isinstance(step, Run), step
    agent = Agent.restore(config, tools, agent.snapshot())
    agent.result(step.call.id, ToolOutput.ok("# Forms"))
    step = agent.reply('{"tool": "read_skill_file", "args": {"skill": "pdf", "path": "SKILL.md",'
                       ' "offset": 12000}}')
    agent.result(step.call.id, ToolOutput.ok("more"))
    done = agent.reply('{"final": "done"}')
    assert isinstance(done, Done), done

play()
events = []
WATCHED = ("open", "os.", "shutil.", "glob.", "io.", "pathlib.", "tempfile.")
sys.addaudithook(lambda event, args: events.append(event) if event.startswith(WATCHED) else None)
play()
print("LOADED", "agent_core.skill_files" in sys.modules)
print("EVENTS", sorted(set(events)))
"""


def test_a_whole_run_with_skills_makes_no_filesystem_call() -> None:
    finished = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_AUDITED_RUN)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert finished.returncode == 0, finished.stderr
    assert finished.stdout.strip().splitlines()[-2:] == ["LOADED False", "EVENTS []"]
