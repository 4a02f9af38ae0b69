"""The README's promises, run as written: its commands, its example app, its settings table."""

from __future__ import annotations

import io
import json
import re
import runpy
import shlex
import subprocess
import threading
import time
from collections.abc import Callable
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import ROOT, Background, clean_env, marked, relay, wait_until_gone
from tests.support.model_server import ChatCall, ModelServer
from tests.support.redis_server import RedisServer
from workers import Relay, Settings
from workers.cli import cli
from workers.model.endpoints import load_routes

README = (ROOT / "README.md").read_text()
INSTALL_AND_DEMO = "python3 -m venv .venv && .venv/bin/pip install -e . && .venv/bin/relay demo"
INSTALL_AND_TEST = (
    "python3 -m venv .venv && .venv/bin/pip install -e '.[dev]'"
    " && PATH=$PWD/.venv/bin:$PATH .ci/check"
)
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)


def blocks(section: str | None = None, language: str | None = None) -> list[str]:
    """Return the fenced code blocks of the README (of one `## ` section, in one language)."""
    text = README
    if section is not None:
        start = README.index(f"\n## {section}\n")
        end = README.find("\n## ", start + 1)
        text = README[start : end if end > 0 else None]
    return [code for lang, code in _FENCE.findall(text) if language in (None, lang)]


# --- what a reader meets first ----------------------------------------------------------------


def test_the_first_commands_are_at_the_top() -> None:
    first, second = blocks()[:2]
    assert first.strip() == INSTALL_AND_DEMO
    assert second.strip() == INSTALL_AND_TEST
    assert README.splitlines().index(INSTALL_AND_DEMO) < 12  # no scrolling before it


def test_the_settings_table_lists_every_setting() -> None:
    table = README[README.index("\n## Settings\n") :]
    for field in Settings.model_fields:
        assert f"`RELAY_{field.upper()}`" in table, field


def test_every_relay_command_in_the_readme_is_a_verb() -> None:
    verbs = set(cli.commands) | {"schedule"}  # the schedule group is attached by the lead
    used = set()
    for code in blocks(language="bash"):
        for line in code.replace("\\\n", " ").splitlines():  # continued lines are one
            words = shlex.split(line.split("  #")[0].strip() or "#")
            while words and words[0] != "relay":
                words = words[1:]
            args = [w for w in words[1:] if not w.startswith("--app") and ":" not in w]
            if args:
                used.add(args[0])
    assert used, "no relay commands found"
    assert used <= verbs, used - verbs


# --- the example app, end to end --------------------------------------------------------------


def copier(chat: ChatCall) -> str:
    """A model that copies the first .txt file a task names to the second: read, then write."""
    if "Reply now with your plan" in chat.prompt:
        return json.dumps({"plan": ["Read the note", "Write the copy"]})
    task = chat.prompt.split("\n\n", 1)[0]
    source, target = re.findall(r"[\w.-]+\.txt", task)[:2]
    if "] read_note " not in chat.prompt:
        return json.dumps({"tool": "read_note", "args": {"name": source}})
    if "] write_note " not in chat.prompt:
        read = chat.prompt.split("] read_note ", 1)[1].split("\n→ ok: ", 1)[1]
        text = read.split("\n\n", 1)[0]
        return json.dumps({"tool": "write_note", "args": {"name": target, "text": text}})
    return json.dumps({"final": f"copied {source} to {target}"})


def run_block(
    code: str, env: dict[str, str], given: dict[str, str], cwd: Path, started: list[Background]
) -> list[str]:
    """Run a bash block of the README line by line; `relay run` gets --yes (no terminal here).

    `given` replaces what `export` lines set (a model server, a Redis of the test's own).
    Returns the output of each `relay run`.
    """
    outputs = []
    for raw in code.splitlines():
        line = raw.split("  #")[0].strip()
        if not line:
            continue
        if line.startswith("export "):
            for word in shlex.split(line)[1:]:
                name, _, value = word.partition("=")
                assert name.startswith("RELAY_"), name
                env[name] = given.get(name, value)
        elif line.startswith("relay ") and " worker" in line:
            worker = Background(*shlex.split(line)[1:], env=env, cwd=cwd)
            started.append(worker)
            worker.expect(r"ready\.")
        elif line.startswith("relay "):
            done = relay(*shlex.split(line)[1:], "--yes", env=env, cwd=cwd)
            assert done.returncode == 0, done.stdout + done.stderr
            outputs.append(done.stdout)
        else:
            subprocess.run(["bash", "-c", line], cwd=cwd, env=env, check=True, timeout=30)
    return outputs


def approve_everything(app: Relay, stop: threading.Event) -> Callable[[], None]:
    """Stand in for the person in the Approvals section, from another thread."""

    def loop() -> None:
        while not stop.wait(0.1):
            for pending in app.pending():
                if pending.kind == "plan":
                    app.approve_plan(pending.run_id)
                elif pending.call_id is not None:
                    app.approve(pending.run_id, pending.call_id)

    return loop


def test_the_first_app_runs_as_the_readme_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    app_code, client_code = blocks("A first app", "python")
    embedded, fleet = blocks("A first app", "bash")
    (tmp_path / "notes_app.py").write_text(app_code)
    backup = tmp_path / "notes" / "backup.txt"
    with ModelServer(copier) as model:
        given = {"RELAY_MODEL_URL": model.url}

        env, marker = marked(clean_env())
        (output,) = run_block(embedded, env, given, tmp_path, [])
        assert "Started a private Redis" in output
        assert "■ Done: copied todo.txt to backup.txt" in output
        assert backup.read_text().strip() == "Buy milk"
        assert wait_until_gone(marker) == []

        backup.unlink()
        started: list[Background] = []
        with RedisServer(tmp_path) as server:
            given["RELAY_REDIS_URL"] = server.url
            try:  # the same shell as before: RELAY_MODEL_URL is still exported
                (output,) = run_block(fleet, env, given, tmp_path, started)
                assert "Started a private Redis" not in output
                assert backup.read_text().strip() == "Buy milk"
                _run_the_python_snippets(client_code, env, tmp_path, monkeypatch, model)
            finally:
                for worker in started:
                    worker.close()


def _follow_and_steer_as_the_readme_does(
    env: dict[str, str], tmp_path: Path, model: ModelServer
) -> None:
    namespace: dict[str, Any] = runpy.run_path(str(tmp_path / "notes_app.py"))
    app: Relay = namespace["relay"]
    stop = threading.Event()
    person = threading.Thread(target=approve_everything(app, stop), daemon=True)
    person.start()
    try:
        with redirect_stdout(io.StringIO()) as printed:
            exec(blocks("Live runs", "python")[0], namespace)
        run_id = namespace["run_id"]
        # The answer was printed as the model wrote it, as text, not JSON.
        assert printed.getvalue() == "copied todo.txt to notes.txt"
        assert any("Keep the first line only" in call.prompt for call in model.calls)
        deadline = time.monotonic() + 60
        while [e.kind for e in app.trace(run_id)].count("finished") < 2:  # the second turn
            assert time.monotonic() < deadline, [e.kind for e in app.trace(run_id)]
            time.sleep(0.1)
    finally:
        stop.set()
        person.join(10)
    mine = [c.prompt for c in model.calls if "Copy todo.txt to notes.txt" in c.prompt]
    assert "current request" in mine[-1]
    assert "Now copy it to archive.txt" in mine[-1]
    assert (tmp_path / "notes" / "notes.txt").read_text().strip() == "Buy milk"
    assert env["RELAY_REDIS_URL"] == app.redis_url


def _run_the_python_snippets(
    client_code: str,
    env: dict[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    model: ModelServer,
) -> None:
    for name in ("RELAY_REDIS_URL", "RELAY_MODEL_URL", "RELAY_MODEL"):
        monkeypatch.setenv(name, env[name])
    namespace: dict[str, Any] = runpy.run_path(str(tmp_path / "notes_app.py"))
    app: Relay = namespace["relay"]
    stop = threading.Event()
    person = threading.Thread(target=approve_everything(app, stop), daemon=True)
    person.start()
    try:
        exec(client_code, namespace)
    finally:
        stop.set()
        person.join(10)
    outcome = app.wait(namespace["run_id"], timeout=5)
    assert outcome.summary == "copied todo.txt to backup.txt"
    _follow_and_steer_as_the_readme_does(env, tmp_path, model)

    exec(blocks("Schedules", "python")[0], namespace)
    assert app.schedules() == []  # the snippet ends by removing it again
    exec(blocks("Budgets and cost", "python")[0], namespace)
    budgeted = namespace["relay"].status(namespace["run_id"])
    assert budgeted.budget is not None
    assert budgeted.budget.usd == 2.50  # 1.50, then extended by 1.00
    exec(blocks("Specialists", "python")[0], namespace)
    assert [s.name for s in namespace["relay"].specialists] == ["reader"]
    exec(blocks("Model routes", "python")[0], namespace)
    routed: Relay = namespace["relay"]
    assert [r.name for r in routed.routes] == ["primary", "local"]
    assert routed.key_concurrency == 8
    assert routed.status(namespace["run_id"]).key == "acme"
    routed.cancel(namespace["run_id"])
    (toml,) = blocks("Model routes", "toml")
    (tmp_path / "models.toml").write_text(toml)
    assert [r.name for r in load_routes(tmp_path / "models.toml")] == ["primary", "local"]
