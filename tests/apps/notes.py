"""A small Relay app for the runtime tests: notes in a folder, and tools that keep a ledger.

Every tool that must not run twice writes a line to `ledger.txt` in the folder
named by RELAY_TEST_DIR, so a test can count how often it really ran. With
RELAY_TEST_SKILLS set, the app offers the Agent Skills in that folder.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
from pathlib import Path

from agent_core import Config, Risk, Specialist, ToolOutput
from workers import Relay, Settings, ToolContext

SPECIALISTS = [
    Specialist("reader", "Reads notes").tools(["read_note", "sleep"]).instructions("Only read."),
    Specialist("writer", "Writes notes").tools(["write_note", "delete_note", "sleep"]),
    Specialist("sleeper", "Waits a while").tools(["sleep", "once"]),
    Specialist("worker", "Works until told to stop").tools(["until_cancelled"]),
]


def folder() -> Path:
    return Path(os.environ.get("RELAY_TEST_DIR", "."))


def ledger(line: str) -> None:
    with (folder() / "ledger.txt").open("a") as out:
        out.write(line + "\n")
        out.flush()
        os.fsync(out.fileno())


def read_note(name: str) -> str:
    """Read a note.

    Args:
        name: The note's file name.
    """
    path = folder() / "notes" / name
    return path.read_text() if path.exists() else f"(no note named {name})"


def write_note(name: str, text: str) -> str:
    """Write a new note."""
    ledger(f"write_note {name}")
    notes = folder() / "notes"
    notes.mkdir(exist_ok=True)
    (notes / name).write_text(text)
    return f"wrote {len(text)} characters to {name}"


def delete_note(name: str) -> str:
    """Delete a note."""
    ledger(f"delete_note {name}")
    return f"deleted {name}"


def pay(amount: float) -> str:
    """Pay an amount."""
    ledger(f"pay {amount}")
    return f"paid {amount}"


def unsure(amount: float) -> ToolOutput:
    """Send a transfer whose bank does not confirm it."""
    ledger(f"unsure {amount}")
    return ToolOutput.unknown("the bank timed out: the transfer may or may not have gone through")


def sleep(seconds: float) -> str:
    """Wait, then say so (safe to run again)."""
    ledger(f"sleep start {seconds}")
    time.sleep(seconds)
    ledger(f"sleep end {seconds}")
    return f"slept {seconds}"


def once(label: str, seconds: float = 0.0) -> str:
    """Do something that must never happen twice, slowly."""
    ledger(f"once start {label}")
    time.sleep(seconds)
    ledger(f"once end {label}")
    return f"did {label}"


def big(size: int) -> str:
    """Return a long text."""
    return "x" * size


def number() -> str:
    """Return something that is not text (a bug in the tool)."""
    return 42  # type: ignore[return-value]


def boom() -> str:
    """Fail."""
    raise RuntimeError("kaboom")


def _hold_the_gil(seconds: float) -> None:
    """Busy-loop for `seconds` without letting another thread run, as C code can."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(seconds + 30)
    try:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            pass
    finally:
        sys.setswitchinterval(before)


def crunch(label: str, seconds: float) -> str:
    """Crunch numbers in C code that holds the GIL (must not run twice)."""
    ledger(f"crunch start {label}")
    _hold_the_gil(seconds)
    ledger(f"crunch end {label}")
    return f"crunched {label}"


def crunch_long_lease(label: str, seconds: float) -> str:
    """The same, registered with a lease long enough for it."""
    ledger(f"crunch_long_lease start {label}")
    _hold_the_gil(seconds)
    ledger(f"crunch_long_lease end {label}")
    return f"crunched {label}"


def crunch_then_wait(context: ToolContext, label: str, seconds: float, linger: float = 0.0) -> str:
    """Crunch holding the GIL the first time (then go on `linger` seconds more, unless told
    to stop); wait quietly the next times. Safe to run again."""
    earlier = [line for line in _ledger_lines() if line == f"crunch_then_wait start {label}"]
    ledger(f"crunch_then_wait start {label}")
    if earlier:
        time.sleep(seconds)
    else:
        _hold_the_gil(seconds)
        deadline = time.monotonic() + linger
        while time.monotonic() < deadline and not context.cancelled():
            time.sleep(0.05)
        if context.cancelled():
            ledger(f"crunch_then_wait told to stop {label}")
    ledger(f"crunch_then_wait end {label}")
    return f"crunched {label} (run {len(earlier) + 1})"


def _ledger_lines() -> list[str]:
    path = folder() / "ledger.txt"
    return path.read_text().splitlines() if path.exists() else []


def until_cancelled(context: ToolContext, seconds: float) -> str:
    """Work until told to stop."""
    ledger(f"until_cancelled start {context.idempotency_key}")
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if context.cancelled():
            ledger("until_cancelled saw cancel")
            return "stopped"
        context.progress("still working")
        time.sleep(0.1)
    return "finished"


async def async_once(label: str, seconds: float = 0.0) -> str:
    """Do something once, asynchronously (it must not run twice)."""
    ledger(f"async_once start {label} on {threading.current_thread().name}")
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        ledger(f"async_once cancelled {label}")
        raise
    ledger(f"async_once end {label}")
    return f"did {label} asynchronously"


async def async_wait(label: str, seconds: float) -> str:
    """Wait, asynchronously (a time limit of 2 seconds)."""
    return await async_once(label, seconds)


async def async_boom(label: str) -> str:
    """Fail after an await, asynchronously (the coroutine raises on the event loop)."""
    ledger(f"async_boom start {label}")
    await asyncio.sleep(0.05)
    raise ValueError(f"async kaboom {label}")


TOOLS = [
    (read_note, Risk.READ),
    (write_note, Risk.CREATE),
    (delete_note, Risk.WRITE),
    (pay, Risk.MONEY),
    (sleep, Risk.READ),
    (once, Risk.CREATE),
    (big, Risk.READ),
    (number, Risk.READ),
    (boom, Risk.READ),
    (until_cancelled, Risk.READ),
    (crunch_then_wait, Risk.READ),
    (unsure, Risk.READ),
    (async_once, Risk.CREATE),
    (async_boom, Risk.READ),
]


def build(
    settings: Settings | None = None,
    skills_dir: str | None = None,
    name: str = "notes",
    config: Config | None = None,
    *,
    risks: dict[str, Risk] | None = None,
    idempotent: dict[str, bool] | None = None,
) -> Relay:
    """The app (`risks`, `idempotent`: tools classed otherwise, as a new version might)."""
    relay = Relay(
        name,
        config=config or Config(require_plan=False, max_batch=4, max_calls=20),
        specialists=SPECIALISTS,
        skills_dir=skills_dir,
        questions=True,
        settings=settings,
    )
    for function, risk in TOOLS:
        name = function.__name__
        again = (idempotent or {}).get(name)
        relay.tool(risk=(risks or {}).get(name, risk), idempotent=again)(function)
    relay.tool(risk=Risk.CREATE)(crunch)
    relay.tool(risk=Risk.CREATE, lease_seconds=60)(crunch_long_lease)
    relay.tool(risk=Risk.READ, timeout=2)(async_wait)
    return relay


if os.environ.get("RELAY_TEST_WALK"):
    # Every call into a workers module from another is written down (tests/test_walk.py).
    from tests.support.walk import record_to

    record_to(os.environ["RELAY_TEST_WALK"])

# RELAY_TEST_SKILLS: a folder of Agent Skills this app's workers offer (and read).
relay = build(skills_dir=os.environ.get("RELAY_TEST_SKILLS") or None)
app = relay.celery  # for `celery -A tests.apps.notes:app worker`
# Another app with the same tools under the same prefix: its workers must not run "notes" runs.
billing = build(name="billing")
# The same tools under Relay's own defaults: a plan first, and WRITE calls ask a person.
careful = build(name="careful", config=Config())
# The app as an upgrade might make it: deleting a note READ (it no longer asks), writing
# one idempotent (run again after a lost worker). Its replay of the app's runs must say so.
upgraded = build(risks={"delete_note": Risk.READ}, idempotent={"write_note": True})

if os.environ.get("RELAY_TEST_DUPLICATES"):
    # Every task message this process sends goes to the broker twice, so each is
    # delivered twice: the runtime must apply no step, tool or model call twice.
    _send_once = relay.celery.send_task

    def _send_twice(*args: object, **kwargs: object) -> object:
        _send_once(*args, **kwargs)  # type: ignore[arg-type]
        return _send_once(*args, **kwargs)  # type: ignore[arg-type]

    relay.celery.send_task = _send_twice  # type: ignore[method-assign]
