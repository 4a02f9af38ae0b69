"""Specialists side by side: child runs in parallel, approvals inside them, usage
rolled up exactly once, a budget for the whole tree, cancel and crashes reaching
every descendant. Real Redis, real worker processes, a real HTTP model server."""

from __future__ import annotations

from pathlib import Path

from agent_core import Stop
from tests.support.brain import batch, call, final
from tests.support.fleet import Fleet, fleet
from tests.support.waiting import pending_for


def _delegate(specialist: str, task: str) -> tuple[str, dict[str, str]]:
    return ("delegate", {"specialist": specialist, "task": task})


def test_three_specialists_run_side_by_side(tmp_path: Path) -> None:
    with fleet(tmp_path) as f:
        three = batch(
            _delegate("reader", "KID-R: nap"),
            _delegate("writer", "KID-W: nap"),
            _delegate("sleeper", "KID-S: nap"),
        )
        f.brain.script("TRIO:", {0: three, 3: final("all three done")})
        for kid in ("KID-R:", "KID-W:", "KID-S:"):
            f.brain.script(kid, {0: call("sleep", seconds=1), 1: final(f"{kid} slept")})
        f.worker("--concurrency", "8", "--pool", "threads")
        root = f.relay.start("TRIO: hand out three naps")
        outcome = f.relay.wait(root, timeout=60)
        assert outcome.stop is Stop.DONE, f.logs()
        # The three one-second tools overlapped: at least two began before any ended
        # (all three, unless one was slow to start).
        lines = f.ledger()
        assert sorted(lines) == sorted(["sleep start 1"] * 3 + ["sleep end 1"] * 3), lines
        assert lines[-1] == "sleep end 1", lines
        assert lines.index("sleep end 1") >= 2, lines
        status = f.relay.status(root)
        assert len(status.children) == 3
        for child_id in status.children:
            child = f.relay.status(child_id)
            assert child.parent == root
            assert child.root == root
            assert child.outcome is not None
            assert child.outcome.stop is Stop.DONE
        # The parent's trace names each child, and each child's summary came back as a result.
        linked = [e.data["child"] for e in f.relay.trace(root) if e.kind == "child"]
        assert sorted(linked) == sorted(status.children)
        results = sorted(e.text for e in f.relay.trace(root) if e.kind == "result")
        assert results == ["KID-R: slept", "KID-S: slept", "KID-W: slept"]
        # Usage: the root total is the whole tree, exactly what the server billed.
        prompt, completion = f.model.usage_total()
        assert status.total_usage.prompt_tokens == prompt
        assert status.total_usage.completion_tokens == completion
        own = sum(f.relay.status(r).usage.total_tokens for r in (root, *status.children))
        assert status.total_usage.total_tokens == own == prompt + completion


def test_an_approval_inside_a_child(tmp_path: Path) -> None:
    with fleet(tmp_path) as f:
        f.brain.script(
            "PARENT-A:",
            {
                0: call("delegate", specialist="writer", task="KID-A: delete x"),
                1: final("parent done"),
            },
        )
        f.brain.script("KID-A:", {0: call("delete_note", name="x.txt"), 1: final("deleted x")})
        f.worker("--concurrency", "4", "--pool", "threads")
        root = f.relay.start("PARENT-A: get x deleted")
        child_id = f"{root}.call-1"
        pending = pending_for(f, child_id)
        assert pending.root_id == root
        assert pending.tool == "delete_note"
        assert f.relay.status(root).waiting_for == "children"
        assert f.relay.status(child_id).state == "waiting"
        f.relay.approve(child_id, pending.call_id or "", yes=True)
        outcome = f.relay.wait(root, timeout=60)
        assert outcome.stop is Stop.DONE, f.logs()
        assert f.ledger() == ["delete_note x.txt"]


def test_a_budget_spent_mid_tree_parks_the_tree_and_cancel_stops_it(tmp_path: Path) -> None:
    with fleet(tmp_path) as f:
        two = batch(_delegate("reader", "KID-B1: read"), _delegate("sleeper", "KID-B2: nap"))
        f.brain.script("BUDGET:", {0: two, 2: final("never reached")})
        # Children that keep going: each turn costs tokens, so the tree's budget runs out.
        f.brain.script("KID-B1:", {n: call("read_note", name=f"n{n}") for n in range(30)})
        f.brain.script("KID-B2:", {n: call("sleep", seconds=0.05) for n in range(30)})
        f.worker("--concurrency", "4", "--pool", "threads")
        root = f.relay.start("BUDGET: spend", budget=9_000)
        f.until(lambda: _parked_at_budget(f, root), 90, what="the tree to park at its budget")
        assert f.relay.cancel(root)
        outcome = f.relay.wait(root, timeout=90)
        assert outcome.stop is Stop.CANCELLED, (outcome, f.logs())
        for child_id in f.relay.status(root).children:
            child = f.relay.wait(child_id, timeout=30)
            assert child.stop is Stop.CANCELLED, child
        # Nothing more is billed once the tree stopped, the totals are exact, and the
        # tree never passed its budget (each call's reply is capped by max_tokens).
        prompt, completion = f.model.usage_total()
        total = f.relay.status(root).total_usage
        assert (total.prompt_tokens, total.completion_tokens) == (prompt, completion)
        assert total.total_tokens <= 9_000


def _parked_at_budget(f: Fleet, root: str) -> bool:
    """Every specialist of the tree waits for its budget (or has finished): no model call
    is in flight, so the server's bill is final once the tree is cancelled."""
    children = f.relay.status(root).children
    return len(children) == 2 and all(
        (status := f.relay.status(child)).waiting_for == "budget" or status.state == "finished"
        for child in children
    )


def test_cancel_reaches_running_children(tmp_path: Path) -> None:
    with fleet(tmp_path) as f:
        two = batch(_delegate("worker", "KID-C1: work"), _delegate("worker", "KID-C2: work"))
        f.brain.script("CANCEL:", {0: two, 2: final("never")})
        for kid in ("KID-C1:", "KID-C2:"):
            f.brain.script(kid, {0: call("until_cancelled", seconds=60), 1: final("stopped")})
        f.worker("--concurrency", "6", "--pool", "threads")
        root = f.relay.start("CANCEL: start two workers")
        f.until(
            lambda: len([x for x in f.ledger() if "until_cancelled start" in x]) == 2,
            30,
            what="both tools",
        )
        assert f.relay.cancel(root, "enough") is True
        outcome = f.relay.wait(root, timeout=30)
        assert outcome.stop is Stop.CANCELLED
        children = f.relay.status(root).children
        assert len(children) == 2
        for child_id in children:
            assert f.relay.wait(child_id, timeout=30).stop is Stop.CANCELLED
        # The running tools saw the flag and stopped.
        f.until(
            lambda: f.ledger().count("until_cancelled saw cancel") == 2,
            30,
            what="the tools to stop",
        )


def test_a_worker_killed_while_children_run(tmp_path: Path) -> None:
    with fleet(tmp_path) as f:
        _crash_tree(f)


def _crash_tree(f: Fleet) -> None:
    two = batch(_delegate("sleeper", "KID-K1: once"), _delegate("sleeper", "KID-K2: nap"))
    f.brain.script("CRASH:", {0: two, 2: final("tree done")})
    f.brain.script("KID-K1:", {0: call("once", label="k1", seconds=3), 1: final("k1 handled")})
    f.brain.script("KID-K2:", {0: call("sleep", seconds=3), 1: final("k2 slept")})
    first = f.worker("--concurrency", "4", "--pool", "threads")
    root = f.relay.start("CRASH: two children")
    f.until(lambda: {"once start k1", "sleep start 3"} <= set(f.ledger()), 30, what="both tools")
    first.kill()
    f.worker("--concurrency", "4", "--pool", "threads", name="second")
    outcome = f.relay.wait(root, timeout=120)
    assert outcome.stop is Stop.DONE, f.logs()
    for child_id in f.relay.status(root).children:
        assert f.relay.wait(child_id, timeout=10).stop is Stop.DONE
    ledger = f.ledger()
    assert ledger.count("once start k1") == 1, ledger  # never run twice
    assert "once end k1" not in ledger
    assert ledger.count("sleep end 3") == 1, ledger  # the safe one ran again to the end


def test_watch_follows_the_children_of_a_finished_run(tmp_path: Path) -> None:
    with fleet(tmp_path) as f:
        f.brain.script(
            "WATCHED:",
            {0: call("delegate", specialist="reader", task="KID-WATCH: read"), 1: final("done")},
        )
        f.brain.script("KID-WATCH:", {0: call("read_note", name="a"), 1: final("read a")})
        f.worker("--concurrency", "4", "--pool", "threads")
        root = f.relay.start("WATCHED: delegate a read")
        assert f.relay.wait(root, timeout=60).stop is Stop.DONE
        seen = list(f.relay.watch(root, timeout=30))
        child = f"{root}.call-1"
        assert {e.run for e in seen} == {root, child}
        assert [e.kind for e in seen if e.run == child] == [e.kind for e in f.relay.trace(child)]
