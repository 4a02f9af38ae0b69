"""Which `workers` modules a process enters: a profile hook, and reading what it wrote.

`record_to(path)` makes this process (every thread, and every child it forks
afterwards) append one line to `path` each time a function of a `workers`
module is called from another module: `<pid> <caller> <callee>`, the modules
as paths under `workers/` (`-` for a caller outside it). The test app installs
it when RELAY_TEST_WALK names a file (tests/apps/notes.py); `entered(path, from)`
reads back the modules entered after byte `from`.
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

__all__ = ["WORKERS", "entered", "record_to"]

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
