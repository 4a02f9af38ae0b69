"""Registering `async def` tools, and the process's event loop they run on (no Redis)."""

from __future__ import annotations

import asyncio
import multiprocessing
import threading
from collections.abc import AsyncIterator

import pytest

from agent_core import Kind, Risk, Tool
from workers import Relay, Settings, ToolContext, ToolRegistrationError
from workers.loop import process_loop, run_blocking

SETTINGS = Settings.from_env({})


def test_an_async_function_is_described_like_a_sync_one_and_awaited_when_called() -> None:
    relay = Relay("aio", settings=SETTINGS)

    @relay.tool(risk=Risk.READ)
    async def lookup(city: str, context: ToolContext, limit: int = 3) -> str:
        """Look a city up.

        Args:
            city: The city's name.
        """
        await asyncio.sleep(0)
        return f"{city} x{limit} ({context.run_id}) on {threading.current_thread().name}"

    [tool] = relay.tools
    assert tool.description == "Look a city up."
    assert [(a.name, a.kind, a.required) for a in tool.args] == [
        ("city", Kind.TEXT, True),
        ("limit", Kind.INTEGER, False),
    ]
    spec = relay.kit.spec("lookup")
    assert spec is not None
    assert spec.asynchronous
    assert spec.idempotent  # READ, as for a sync tool
    said = spec.call({"city": "Oslo"}, ToolContext(run_id="r1", call_id="c1"))
    assert said == "Oslo x3 (r1) on relay-loop"


def test_a_sync_tool_is_not_taken_for_an_async_one() -> None:
    relay = Relay("aio", settings=SETTINGS)

    @relay.tool
    def plain(text: str) -> str:
        """Echo."""
        return text

    spec = relay.kit.spec("plain")
    assert spec is not None
    assert not spec.asynchronous
    assert spec.call({"text": "hi"}, ToolContext(run_id="r", call_id="c")) == "hi"


def test_an_object_with_an_async_call_is_an_async_tool() -> None:
    class Caller:
        async def __call__(self, text: str) -> str:
            return text.upper()

    relay = Relay("aio", settings=SETTINGS)
    relay.add_tool(Tool("shout", "Shout.").arg("text", Kind.TEXT, "what"), Caller())
    spec = relay.kit.spec("shout")
    assert spec is not None
    assert spec.asynchronous
    assert spec.call({"text": "hi"}, ToolContext(run_id="r", call_id="c")) == "HI"


def test_an_async_generator_is_refused_at_registration() -> None:
    relay = Relay("aio", settings=SETTINGS)

    async def lines(text: str) -> AsyncIterator[str]:
        """Yield lines."""
        yield text

    with pytest.raises(ToolRegistrationError, match="async generator; a tool returns one text"):
        relay.tool(lines)
    assert relay.tools == []


def test_run_blocking_times_out_and_cancels_and_refuses_the_loops_own_thread() -> None:
    cancelled = threading.Event()

    async def forever() -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    with pytest.raises(TimeoutError, match=r"within 0\.2 s"):
        run_blocking(forever(), 0.2)
    assert cancelled.wait(5)

    async def nested() -> str:
        try:
            run_blocking(asyncio.sleep(0))
        except RuntimeError as error:
            return str(error)
        return "no error"

    assert "event loop's own thread" in run_blocking(nested(), 5)


def _child_loop(answers: multiprocessing.Queue[object]) -> None:
    loop = process_loop()
    answers.put((loop.thread.is_alive(), run_blocking(asyncio.sleep(0, "child"), 5)))


def test_a_forked_child_gets_a_loop_of_its_own() -> None:
    parent = process_loop()
    assert run_blocking(asyncio.sleep(0, "parent"), 5) == "parent"
    context = multiprocessing.get_context("fork")  # as Celery's prefork pool makes its children
    answers: multiprocessing.Queue[object] = context.Queue()
    child = context.Process(target=_child_loop, args=(answers,))
    child.start()
    assert answers.get(timeout=20) == (True, "child")
    child.join(20)
    assert child.exitcode == 0
    assert process_loop() is parent
