"""`AsyncRelay` in an asyncio app: a FastAPI app (served in process through httpx's ASGI
transport) starts 100 runs at once and streams one; every command of the client API,
awaited, against a real fleet (real Redis, real workers, a real model server).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator, Iterator

import anyio
import httpx
import pytest
from fastapi import FastAPI
from fastapi.responses import StreamingResponse

from agent_core import Stop
from tests.support.brain import call, final
from tests.support.fleet import Fleet
from tests.support.waiting import shared_fleet
from tests.support.web import form_of
from workers import AsyncRelay, Budget, DecisionRefused, RelayError, RunNotFound, WaitTimeout
from workers.web.app import build_app
from workers.web.auth import WebSettings


@pytest.fixture(scope="module")
def f(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    args = ("--pool", "threads", "--concurrency", "8")
    with shared_fleet(tmp_path_factory.mktemp("aio"), *args) as running:
        yield running


def _app(arelay: AsyncRelay) -> FastAPI:
    """What a team's FastAPI app does with Relay: start runs, read them, stream one."""
    app = FastAPI()

    @app.post("/runs")
    async def start(body: dict[str, str]) -> dict[str, str]:
        return {"run_id": await arelay.start(body["task"])}

    @app.get("/runs/{run_id}")
    async def status(run_id: str) -> dict[str, object]:
        found = await arelay.status(run_id)
        return {"state": found.state, "ending": found.ending}

    @app.get("/runs/{run_id}/stream")
    async def stream(run_id: str, after: str = "0") -> StreamingResponse:
        async def lines() -> AsyncIterator[str]:
            async for event in arelay.stream(run_id, after, timeout=60):
                yield json.dumps(event.model_dump(mode="json")) + "\n"

        return StreamingResponse(lines(), media_type="application/x-ndjson")

    return app


def test_a_fastapi_app_starts_100_runs_at_once_and_streams_one(f: Fleet) -> None:
    f.brain.script("AIO-MANY:", {0: call("read_note", name="a.txt"), 1: final("read it")})

    async def drive() -> tuple[list[str], list[str], list[dict[str, object]], float]:
        async with AsyncRelay(f.relay) as arelay:
            transport = httpx.ASGITransport(app=_app(arelay))
            async with httpx.AsyncClient(transport=transport, base_url="http://app") as http:
                began = time.monotonic()
                answers = await asyncio.gather(
                    *(http.post("/runs", json={"task": f"AIO-MANY: {n}"}) for n in range(100))
                )
                took = time.monotonic() - began
                ids = [answer.json()["run_id"] for answer in answers]
                outcomes = await asyncio.gather(*(arelay.wait(run_id, 120) for run_id in ids))
                streamed = await http.get(f"/runs/{ids[0]}/stream")
                events = [json.loads(line) for line in streamed.text.splitlines()]
                status = await http.get(f"/runs/{ids[-1]}")
                assert status.json() == {"state": "finished", "ending": "done"}
        return ids, [o.summary for o in outcomes], events, took

    ids, summaries, events, took = asyncio.run(drive())
    assert len(set(ids)) == 100
    assert summaries == ["read it"] * 100
    assert all(f.relay.status(run_id).ending == "done" for run_id in ids[:5])
    # The stream: each model call's reply as it was written, then the run's "done".
    assert [e["kind"] for e in events].count("step") == 2
    assert events[-1]["kind"] == "done"
    assert events[-1]["text"] == "read it"
    text = "".join(e["text"] for e in events if e["kind"] == "text")
    assert '"final": "read it"' in text
    assert took < 60  # (generous: a start is two round trips and a broker message)


def test_waiting_does_not_block_the_event_loop(f: Fleet) -> None:
    f.brain.script("AIO-SLOW:", {0: call("sleep", seconds=2), 1: final("slept")})

    async def drive() -> tuple[str, int]:
        arelay = AsyncRelay(f.relay)
        run_id = await arelay.start("AIO-SLOW: take your time")
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.05)
                ticks += 1

        beat = asyncio.create_task(ticker())
        outcome = await arelay.wait(run_id, 60)
        beat.cancel()
        await arelay.aclose()
        return outcome.summary, ticks

    summary, ticks = asyncio.run(drive())
    assert summary == "slept"
    # Two seconds of waiting on Redis; a blocking client would have let no tick through.
    assert ticks >= 10


def test_every_decision_and_steering_command_awaited(f: Fleet) -> None:
    f.brain.script(
        "AIO-DECIDE:",
        {
            0: call("delete_note", name="one.txt"),
            1: call("delete_note", name="two.txt"),
            2: final("decided"),
        },
    )
    f.brain.script(
        "AIO-STEER:", {0: call("sleep", seconds=1), 1: final("March"), 2: final("April")}
    )

    async def drive() -> dict[str, object]:
        seen: dict[str, object] = {}
        async with AsyncRelay(f.relay) as arelay:
            run_id = await arelay.start("AIO-DECIDE: delete two notes")
            await _until(arelay, run_id, "call", call="call-1")
            with pytest.raises(DecisionRefused, match="is not waiting for a decision"):
                await arelay.approve(run_id, "call-9")
            with pytest.raises(DecisionRefused, match="refused"):
                await arelay.approve(run_id, "call-1", args={"title": "x"})
            await arelay.approve(run_id, "call-1", by="a coroutine")
            await _until(arelay, run_id, "call", call="call-2")
            await arelay.deny(run_id, "call-2", "not that one")
            seen["decided"] = (await arelay.wait(run_id, 60)).summary
            seen["trace"] = [e.kind for e in await arelay.trace(run_id)]

            steered = await arelay.start("AIO-STEER: work")
            await arelay.send(steered, "Use March")
            assert await arelay.pause(steered)
            await _until(arelay, steered, "pause")
            assert await arelay.resume(steered)
            seen["first"] = (await arelay.wait(steered, 60)).summary
            await arelay.reply(steered, "Now April")
            seen["second"] = (await arelay.wait(steered, 60)).summary
            seen["watched"] = [e.kind async for e in arelay.watch(steered, timeout=30)]
            assert not await arelay.pause(steered)  # finished: nothing to pause
            assert not await arelay.cancel(steered)
            with pytest.raises(RunNotFound):
                await arelay.status("no-such-run")
            late = await arelay.start("AIO-STEER: again")
            with pytest.raises(WaitTimeout):
                await arelay.wait(late, 0.2)
            assert await arelay.cancel(late, "not needed")
            seen["cancelled"] = (await arelay.wait(late, 60)).stop
            with pytest.raises(RelayError, match="stream id"):
                async for _ in arelay.stream(late, after="not an id"):
                    pass
        return seen

    seen = asyncio.run(drive())
    assert seen["decided"] == "decided"
    assert "delete_note one.txt" in f.ledger()
    assert "delete_note two.txt" not in f.ledger()
    assert {"approved", "declined"} <= set(seen["trace"])  # type: ignore[arg-type]
    assert (seen["first"], seen["second"]) == ("March", "April")
    watched = seen["watched"]
    assert isinstance(watched, list)
    assert watched.count("paused") == 1
    assert watched.count("resumed") == 1
    assert seen["cancelled"] is Stop.CANCELLED


async def _until(arelay: AsyncRelay, run_id: str, waiting_for: str, *, call: str = "") -> None:
    for _ in range(300):
        status = await arelay.status(run_id)
        calls = [p.call_id for p in status.pending]
        if status.waiting_for == waiting_for and (not call or call in calls):
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"run {run_id} never waited for {waiting_for} {call}")


def test_pending_lists_what_waits_for_a_person_as_the_sync_client_does(f: Fleet) -> None:
    f.brain.script("AIO-PENDING:", {0: call("delete_note", name="p.txt"), 1: final("ok")})
    run_id = f.relay.start("AIO-PENDING: delete")

    async def drive() -> list[str]:
        async with AsyncRelay(f.relay) as arelay:
            await _until(arelay, run_id, "call")
            return [p.model_dump_json() for p in await arelay.pending() if p.run_id == run_id]

    listed = asyncio.run(drive())
    assert listed == [p.model_dump_json() for p in f.relay.pending() if p.run_id == run_id]
    assert len(listed) == 1
    f.relay.deny(run_id, "call-1")


def test_a_tree_parked_at_its_budget_goes_on_once_extended_awaited(f: Fleet) -> None:
    f.brain.script("AIO-BUDGET:", {0: call("read_note", name="a"), 1: final("read")})

    async def drive() -> tuple[str, int, Budget | None, str]:
        async with AsyncRelay(f.relay) as arelay:
            # One model call fits; two do not.
            run_id = await arelay.start("AIO-BUDGET: read", budget=Budget(model_calls=1))
            await _until(arelay, run_id, "budget")
            with pytest.raises(RelayError, match="extend needs a Budget"):
                await arelay.extend(run_id, Budget())
            woken = await arelay.extend(run_id, Budget(model_calls=1))
            outcome = await arelay.wait(run_id, 60)
            status = await arelay.status(run_id)
            return outcome.summary, woken, status.budget, status.ending or ""

    summary, woken, budget, ending = asyncio.run(drive())
    assert (summary, woken, ending) == ("read", 1, "done")
    assert budget == Budget(model_calls=2)


def test_runs_are_listed_and_counted_as_the_sync_client_lists_them(f: Fleet) -> None:
    f.brain.script("AIO-LIST:", {0: final("listed")})
    started = [f.relay.start(f"AIO-LIST: {n}") for n in range(5)]
    for run_id in started:
        f.relay.wait(run_id, 60)

    async def drive() -> tuple[list[list[str]], int, int]:
        async with AsyncRelay(f.relay) as arelay:
            pages, before = [], ""
            for _ in range(3):  # the newest six runs, two a page, each page after the last
                found = await arelay.runs(limit=2, state="done", before=before)
                pages.append([status.id for status in found])
                before = f"{found[-1].created_ms}:{found[-1].id}"
            with pytest.raises(ValueError, match="a run's state is one of"):
                await arelay.runs(state="green")
            with pytest.raises(ValueError, match="a page cursor"):
                await arelay.runs(before="yesterday")
            return pages, await arelay.count_runs("done"), await arelay.count_runs()

    pages, done, every = asyncio.run(drive())
    synced, before = [], ""
    for _ in range(3):
        found = f.relay.runs(limit=2, state="done", before=before)
        synced.append([status.id for status in found])
        before = f"{found[-1].created_ms}:{found[-1].id}"
    assert pages == synced
    assert [run_id for page in pages for run_id in page][:5] == started[::-1]
    assert (done, every) == (f.relay.count_runs("done"), f.relay.count_runs())
    assert done >= 5


def test_relay_web_serves_runs_and_decisions_with_no_thread_free(f: Fleet) -> None:
    """relay web's run pages, its API and its decisions await AsyncRelay: with the one
    thread Starlette may use held, they still answer; a page still on a thread waits."""
    f.brain.script("AIO-WEB:", {0: call("delete_note", name="web.txt"), 1: final("web done")})
    by_form, by_api = f.relay.start("AIO-WEB: one"), f.relay.start("AIO-WEB: two")
    app = build_app(f.relay, WebSettings.of("alice", "a-long-password"))
    auth = ("alice", "a-long-password")

    async def drive() -> dict[str, object]:
        seen: dict[str, object] = {}
        limiter = anyio.to_thread.current_default_thread_limiter()
        limiter.total_tokens, held = 1, threading.Event()
        holder = asyncio.create_task(anyio.to_thread.run_sync(held.wait))
        transport = httpx.ASGITransport(app=app)
        try:
            async with (
                app.router.lifespan_context(app),
                AsyncRelay(f.relay) as arelay,
                httpx.AsyncClient(transport=transport, base_url="http://web", auth=auth) as web,
            ):
                await _until(arelay, by_form, "call", call="call-1")
                await _until(arelay, by_api, "call", call="call-1")
                for path in (
                    "/", "/runs", f"/runs/{by_form}", "/approvals", "/api/runs",
                    f"/api/runs/{by_form}", f"/api/runs/{by_form}/trace",
                    f"/api/runs/{by_form}/live", "/api/pending",
                ):  # fmt: skip
                    answer = await asyncio.wait_for(web.get(path), 20)
                    seen[path] = answer.status_code
                page = (await web.get("/approvals")).text
                form = {**form_of(page, by_form, "call-1"), "decision": "approve"}
                decided = await asyncio.wait_for(web.post("/approvals/decide", data=form), 20)
                seen["form"] = decided.status_code
                replayed = await asyncio.wait_for(web.post("/approvals/decide", data=form), 20)
                seen["replayed"] = replayed.status_code
                path = f"/api/runs/{by_api}/calls/call-1/decision"
                denied = await asyncio.wait_for(web.post(path, json={"approve": False}), 20)
                seen["api"] = denied.json()
                with pytest.raises(TimeoutError):  # (the control: this one needs a thread)
                    await asyncio.wait_for(web.get("/routes"), 1)
        finally:
            held.set()
            await holder
            limiter.total_tokens = 40
        return seen

    seen = asyncio.run(drive())
    assert {k: v for k, v in seen.items() if k.startswith("/")} == {
        path: 200 if path != "/" else 303 for path in seen if path.startswith("/")
    }
    assert len([k for k in seen if k.startswith("/")]) == 9
    assert (seen["form"], seen["replayed"]) == (303, 403)
    assert seen["api"] == {"done": f"denied call-1 of run {by_api}"}
    assert f.relay.wait(by_form, 60).summary == "web done"
    assert any(e.kind == "approved" and e.text == "by alice" for e in f.relay.trace(by_form))
    assert f.relay.wait(by_api, 60).summary == "web done"
    assert "delete_note web.txt" in f.ledger()
    assert any(e.kind == "declined" for e in f.relay.trace(by_api))
