"""docs/architecture.md is the walk one run really takes: traced on a real worker.

The worker (and this process, for `relay.start`) write down every call into a
`workers` module from another (tests/support/walk.py); the modules entered must
be exactly those the document lists, in its walk and in what the walk leans
on, so the document cannot drift from the code. The walk itself stays short,
and every module of `workers` is in the document's index.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

from agent_core import Stop
from tests.support import walk
from tests.support.brain import call, final
from tests.support.fleet import fleet

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"


def _block(name: str) -> set[str]:
    """The `workers/...py` paths between `<!-- name ... -->` and `<!-- /name -->`."""
    text = DOC.read_text(encoding="utf-8")
    found = re.search(rf"<!-- {name}\b[^>]*-->(.*?)<!-- /{name} -->", text, re.S)
    assert found is not None, f"docs/architecture.md has no {name} block"
    return set(re.findall(r"`(workers/[\w/]+\.py)`", found.group(1)))


def _room(module: str) -> str:
    """The room a module is in: its folder under workers/ ('' for the front door)."""
    parts = module.split("/")
    return parts[1] if len(parts) > 2 else ""


def test_the_walk_is_short_and_the_rest_is_apart() -> None:
    steps, rest = _block("walk"), _block("entered")
    assert len(steps) <= 12, sorted(steps)
    assert len({_room(m) for m in steps} - {""}) <= 6, sorted(steps)
    assert steps.isdisjoint(rest), sorted(steps & rest)
    for module in steps | rest:
        assert (ROOT / module).is_file(), f"docs/architecture.md names {module}, which is gone"


def test_the_document_lists_exactly_the_modules_a_run_enters(tmp_path: Path) -> None:
    log, client = tmp_path / "worker-walk.log", tmp_path / "client-walk.log"
    with fleet(tmp_path) as f:
        f.brain.script("WALK:", {0: call("read_note", name="a.txt"), 1: final("read it")})
        f.worker("--no-tick", env={"RELAY_TEST_WALK": str(log)})
        assert f.relay.store is not None  # this process's parts, built before the walk
        f.until(lambda: log.exists() and log.stat().st_size > 0, what="the worker's hook")
        time.sleep(0.5)  # the worker's start is written down: the run's walk begins after it
        start = log.stat().st_size
        walk.record_to(client)
        try:
            run_id = f.relay.start("WALK: read a note")
        finally:
            walk.stop()
        outcome = f.relay.wait(run_id, timeout=60)
        assert outcome.stop is Stop.DONE, f.logs()
        kinds = [entry.kind for entry in f.relay.trace(run_id)]
        assert kinds.count("call") == 1, kinds  # a model call, a tool call, a second model call
    entered = walk.entered(log, start) | walk.entered(client)
    listed = _block("walk") | _block("entered")
    assert sorted(entered - listed) == [], "entered, but not in docs/architecture.md"
    assert sorted(listed - entered) == [], "in docs/architecture.md, but not entered"
    # Nothing calls back up but the router's callback (a retry asks its route's circuit):
    # the runtime's task, its loop's calls and their keepers all run top down.
    up = walk.calls_up(log, start) | walk.calls_up(client)
    assert up <= {("workers/model/transport.py", "workers/model/router.py")}, sorted(up)


def test_every_module_is_in_the_documents_index() -> None:
    text = DOC.read_text(encoding="utf-8")
    missing = [
        str(path.relative_to(ROOT / "workers"))
        for path in sorted((ROOT / "workers").rglob("*.py"))
        if path.name != "__init__.py"
        and path.parent.name != "cli"
        and f"`{path.relative_to(ROOT / 'workers').as_posix()}`" not in text
    ]
    assert missing == []
