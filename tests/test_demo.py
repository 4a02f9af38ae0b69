"""From a fresh virtual environment: the README's install line, `relay --help`, `relay demo`.

The project is copied to a temp dir first, so the README's line runs verbatim
(`.venv` there, not the working tree's own) with nothing set: no Redis URL, no
model URL, no PYTHONPATH. `relay demo` must succeed offline, say it used the
demo model, and leave no process behind.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.support.cli import ROOT, marked, wait_until_gone
from tests.test_readme import INSTALL_AND_DEMO

DEMO = " && .venv/bin/relay demo"


def _checkout(into: Path) -> Path:
    """Copy what `pip install -e .` needs: the packages, pyproject.toml and the README."""
    into.mkdir()
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    for package in ("agent_core", "workers", "scheduler"):
        shutil.copytree(ROOT / package, into / package, ignore=skip)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, into / name)
    return into


@pytest.mark.timeout(420)
def test_a_fresh_venv_installs_and_runs_the_demo(tmp_path: Path) -> None:
    assert INSTALL_AND_DEMO.endswith(DEMO)
    install = INSTALL_AND_DEMO.removesuffix(DEMO)
    checkout = _checkout(tmp_path / "relay")
    plain = {k: v for k, v in os.environ.items() if not k.startswith(("RELAY_", "PYTHON"))}
    env, marker = marked(plain)

    installed = subprocess.run(
        ["bash", "-c", install], cwd=checkout, env=env, capture_output=True, text=True,
        timeout=360, check=False,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-3000:]
    where = subprocess.run(
        [str(checkout / ".venv/bin/python"), "-c", "import workers; print(workers.__file__)"],
        cwd=tmp_path, env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert where.stdout.startswith(str(checkout)), where.stdout  # the copy, not the work tree

    relay = str(checkout / ".venv" / "bin" / "relay")
    helped = subprocess.run([relay, "--help"], env=env, capture_output=True, text=True, check=False)
    assert helped.returncode == 0, helped.stderr
    assert "demo" in helped.stdout
    assert "worker" in helped.stdout

    started = time.monotonic()
    demo = subprocess.run(
        [relay, "demo"], cwd=tmp_path, env=env, stdin=subprocess.DEVNULL,
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    took = time.monotonic() - started
    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert "demo model" in demo.stdout
    assert "Started a private Redis" in demo.stdout
    assert "■ Done:" in demo.stdout
    assert "Traceback" not in demo.stderr
    assert took < 60, f"the demo took {took:.0f} s"
    assert wait_until_gone(marker) == []
