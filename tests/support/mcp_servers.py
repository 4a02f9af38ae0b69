"""MCP servers for the tests: real ones from the package registries, and our faults server.

The npm servers are installed once per machine into a cache folder (npm's own
registry, pinned versions), then started by the workers over stdio as any team
would start them. PyPI's come with the dev extras (`mcp-server-time`,
`mcp-server-git`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

from agent_core import Risk
from workers import MCPServer

__all__ = ["faults", "npm_bin", "pypi_bin", "write_servers"]

NPM_PACKAGES = {
    "@modelcontextprotocol/server-filesystem": "2026.8.31",
    "@modelcontextprotocol/server-everything": "2026.8.31",
}
_CACHE = Path(
    os.environ.get("RELAY_TEST_NPM_CACHE", Path.home() / ".cache" / "relay-tests" / "npm")
)
_lock = threading.Lock()
ROOT = Path(__file__).resolve().parents[2]


def npm_bin(name: str) -> str:
    """The path of an npm MCP server's program (`mcp-server-filesystem`), installed once."""
    program = _CACHE / "node_modules" / ".bin" / name
    with _lock:
        if not program.exists():
            _CACHE.mkdir(parents=True, exist_ok=True)
            wanted = [f"{package}@{version}" for package, version in NPM_PACKAGES.items()]
            subprocess.run(
                [
                    "npm",
                    "install",
                    "--no-audit",
                    "--no-fund",
                    "--silent",
                    "--prefix",
                    str(_CACHE),
                    *wanted,
                ],
                check=True,
                timeout=300,
            )
    if not program.exists():
        raise AssertionError(f"npm installed no {name} in {_CACHE}")
    return str(program)


def pypi_bin(name: str) -> str:
    """The path of a PyPI MCP server's program in this virtual environment."""
    program = Path(sys.executable).parent / name
    if not program.exists():
        raise AssertionError(f"{name} is not installed: pip install -e '.[dev]'")
    return str(program)


def faults(directory: Path, **fields: object) -> MCPServer:
    """Our faults server over stdio, keeping its ledger in `directory`, not trusted
    unless `trust_annotations=True` is given. Its `charge` is destructive by its
    annotations; the team's override makes it CREATE, so it runs without a person (and
    is not idempotent)."""
    command = [sys.executable, "-m", "tests.support.mcp_faults", str(directory)]
    fields = {"risk": {"charge": Risk.CREATE}, **fields}
    return MCPServer("faults", command=command, cwd=str(ROOT), **fields)  # type: ignore[arg-type]


def write_servers(path: Path, servers: list[MCPServer]) -> Path:
    """Write a RELAY_MCP file (JSON) of these servers, headers as given."""
    listed = [s.model_dump(mode="json", exclude_defaults=True) for s in servers]
    path.write_text(json.dumps({"servers": listed}, indent=2))
    return path
