"""Budgets on real workers: a tree never spends more than it was given.

Real Redis, real `relay worker` processes, a real HTTP model server that bills
each call (and cuts a reply at `max_tokens`, as real servers do). Specialists race
for a tight budget, many times over; the server's own bill is the judge. A tree
at a limit parks, holding no worker, until it is extended, cancelled or its
time to be extended runs out; a tree whose `seconds` pass stops, even while it
waits on a person.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from agent_core import Stop
from tests.support.brain import batch, call, final
from tests.support.fleet import Fleet, fleet
from tests.support.model_server import Reply
from tests.support.waiting import calls_for, pending_for, wait_state
from workers import Budget, Price, RelayError

MAX_TOKENS = 160
PRICE = Price(input_per_m=3.0, output_per_m=15.0, cached_input_per_m=0.3)
ENV = {"RELAY_MODEL_MAX_TOKENS": str(MAX_TOKENS)}


def _priced(tmp_path: Path, *models: str) -> dict[str, str]:
    """The environment for workers (and the client) that know PRICE for `models`."""
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({m: PRICE.model_dump() for m in models}))
    return {**ENV, "RELAY_PRICES": str(prices)}


def _delegate(specialist: str, task: str) -> tuple[str, dict[str, str]]:
    return ("delegate", {"specialist": specialist, "task": task})


def _racing_tree(f: Fleet, tag: str, kids: int = 4) -> None:
    """A root handing work to `kids` specialists that never finish on their own."""
    f.brain.script(
        f"{tag}-ROOT:",
        {0: batch(*[_delegate("reader", f"{tag}-K{k}: read on") for k in range(kids)])},
    )
    for k in range(kids):
        f.brain.script(f"{tag}-K{k}:", {n: call("read_note", name=f"{k}-{n}") for n in range(60)})


def _cost_micro(billed: list[tuple[int, int]]) -> int:
    return sum(PRICE.cost_micro(prompt, completion) for prompt, completion in billed)


def _parked(f: Fleet, root: str) -> list[str]:
    return [p.run_id for p in f.relay.pending() if p.root_id == root and p.kind == "budget"]


def _stop_tree(f: Fleet, root: str) -> None:
    f.relay.cancel(root)
    f.relay.wait(root, timeout=60)


@pytest.mark.parametrize(
    ("limit", "budget"),
    [
        ("tokens", Budget(tokens=2_500)),
        ("usd", Budget(usd=0.0075)),
        ("model_calls", Budget(model_calls=7)),
    ],
)
def test_specialists_racing_a_tight_budget_never_pass_it(
    tmp_path: Path, limit: str, budget: Budget
) -> None:
    with fleet(tmp_path, extra_env=_priced(tmp_path, "default")) as f:
        f.worker("--concurrency", "8", "--pool", "threads")
        for round_ in range(3):
            tag = f"{limit.upper()}{round_}"
            _racing_tree(f, tag)
            root = f.relay.start(f"{tag}-ROOT: share the work", budget=budget)
            # Every specialist parks at the budget in the end; then no call is under way.
            f.until(lambda root=root: len(_parked(f, root)) == 4, 90, what="the tree to park")
            billed = f.model.billed(f"{tag}-")
            if limit == "tokens":
                assert sum(p + c for p, c in billed) <= 2_500, billed
            elif limit == "usd":
                assert _cost_micro(billed) <= 7_500, billed
            else:
                assert len(billed) <= 7, billed
            # What the tree says it spent is exactly what the server billed.
            spent = f.relay.status(root).total_usage
            assert spent.total_tokens == sum(p + c for p, c in billed)
            assert spent.model_calls == len(billed)
            assert spent.cost_micro == _cost_micro(billed)
            _stop_tree(f, root)


def test_a_calls_reply_is_capped_to_what_its_tree_has_left(tmp_path: Path) -> None:
    # max_tokens is 4,096; the tree has 3,000 tokens: the first call may not ask for a
    # reply that takes it past them, and nothing the server bills passes them.
    with fleet(tmp_path) as f:
        f.brain.script("CAP:", {0: call("read_note", name="a"), 1: final("read")})
        f.worker("--pool", "threads")
        root = f.relay.start("CAP: read a note", budget=Budget(tokens=3_000))
        f.until(lambda: len(calls_for(f, "CAP:")) >= 1, 30, what="the first call")
        first = calls_for(f, "CAP:")[0].body["max_tokens"]
        assert 256 <= first < 3_000, first
        billed = f.model.billed("CAP:")
        assert sum(p + c for p, c in billed) <= 3_000, billed
        f.relay.cancel(root)


def test_a_parked_tree_holds_no_worker_and_goes_on_once_extended(tmp_path: Path) -> None:
    with fleet(tmp_path, extra_env=ENV) as f:
        f.brain.script("EXT-ROOT:", {0: call("read_note", name="a"), 1: final("read")})
        f.worker("--concurrency", "1", "--pool", "threads")
        # One model call fits; two do not.
        root = f.relay.start("EXT-ROOT: read a note", budget=Budget(model_calls=1))
        parked = pending_for(f, root, "budget")
        assert "used 1 model call of its 1 model call;" in parked.summary
        status = f.relay.status(root)
        assert (status.state, status.waiting_for) == ("waiting", "budget")
        assert status.budget == Budget(model_calls=1)
        # Parked, it holds no worker: the single worker slot serves another run meanwhile.
        f.brain.script("EXT-OTHER:", {0: final("done meanwhile")})
        assert f.relay.wait(f.relay.start("EXT-OTHER: answer"), 30).stop is Stop.DONE
        # A raise of a limit the tree never had is refused, and wakes nobody: the run
        # stays parked where a person saw it (it would only have parked again).
        with pytest.raises(RelayError, match="no limit that"):
            f.relay.extend(root, Budget(tokens=500))
        assert [p.run_id for p in f.relay.pending() if p.kind == "budget"] == [root]
        assert f.relay.status(root).waiting_for == "budget"
        assert f.relay.extend(root, Budget(model_calls=1)) == 1
        assert f.relay.wait(root, 60).stop is Stop.DONE, f.logs()
        assert f.relay.status(root).budget == Budget(model_calls=2)
        assert len(f.model.billed("EXT-ROOT:")) == 2


def test_a_parked_tree_not_extended_in_time_stops_with_budget_exceeded(tmp_path: Path) -> None:
    env = {**ENV, "RELAY_APPROVAL_TTL": "2", "RELAY_TICK_SECONDS": "1"}
    with fleet(tmp_path, extra_env=env) as f:
        _racing_tree(f, "TTL", kids=2)
        f.worker("--concurrency", "4", "--pool", "threads")
        root = f.relay.start("TTL-ROOT: share the work", budget=Budget(model_calls=3))
        outcome = f.relay.wait(root, 60)
        assert outcome.stop is Stop.BUDGET_EXCEEDED, (outcome, f.logs())
        for child in f.relay.status(root).children:
            assert f.relay.wait(child, 30).stop in (Stop.BUDGET_EXCEEDED, Stop.CANCELLED)
        assert _parked(f, root) == []
        assert len(f.model.billed("TTL-")) <= 3


def test_a_parked_run_can_be_cancelled(tmp_path: Path) -> None:
    with fleet(tmp_path, extra_env=ENV) as f:
        f.brain.script("CANCEL-B:", {0: call("read_note", name="a"), 1: final("read")})
        f.worker("--pool", "threads")
        root = f.relay.start("CANCEL-B: read", budget=Budget(model_calls=1))
        pending_for(f, root, "budget")
        assert f.relay.cancel(root)
        assert f.relay.wait(root, 30).stop is Stop.CANCELLED
        assert _parked(f, root) == []


def test_a_time_budget_stops_a_run_that_waits_on_a_person(tmp_path: Path) -> None:
    with fleet(tmp_path, extra_env={**ENV, "RELAY_TICK_SECONDS": "1"}) as f:
        f.brain.script("SLOW-PERSON:", {0: call("pay", amount=5), 1: final("paid")})
        f.worker("--pool", "threads")
        started = time.monotonic()
        root = f.relay.start("SLOW-PERSON: pay", budget=Budget(seconds=3))
        pending_for(f, root, "call")  # waits on a person, who never comes
        outcome = f.relay.wait(root, 60)
        assert outcome.stop is Stop.BUDGET_EXCEEDED, (outcome, f.logs())
        assert "time budget" in outcome.summary
        assert time.monotonic() - started >= 3
        assert f.relay.pending() == [p for p in f.relay.pending() if p.run_id != root]
        assert "pay 5" not in f.ledger()


def test_cost_is_exact_per_model_rolled_up_once_and_unpriced_models_cost_nothing(
    tmp_path: Path,
) -> None:
    with fleet(tmp_path, extra_env=_priced(tmp_path, "priced-model")) as f:
        f.brain.script(
            "COST-ROOT:",
            {
                0: batch(_delegate("reader", "COST-KID: read")),
                1: Reply(text=final("done"), model="priced-model", cached=20),
            },
        )
        f.brain.script(
            "COST-KID:",
            {
                0: Reply(text=call("read_note", name="a"), model="priced-model"),
                1: Reply(text=final("read it"), model="no-such-price"),
            },
        )
        f.worker("--concurrency", "4", "--pool", "threads")
        root = f.relay.start("COST-ROOT: delegate a read")
        assert f.relay.wait(root, 60).stop is Stop.DONE, f.logs()
        status = f.relay.status(root)
        child = f.relay.status(status.children[0])
        kid_billed = f.model.billed("COST-KID:")
        root_billed = f.model.billed("COST-ROOT:")
        assert len(kid_billed) == 2
        # The child: one priced call, one to a model with no price (0, counted as such).
        assert child.usage.cost_micro == PRICE.cost_micro(*kid_billed[0])
        assert child.usage.unpriced_calls == 1
        # The root's last call had 20 cached prompt tokens, priced at the cache rate.
        last = root_billed[-1]
        root_cost = PRICE.cost_micro(last[0], last[1], cached=20)
        assert status.usage.cached_prompt_tokens == 20
        # The total is the run's own plus its child's, once; its first call was unpriced.
        assert status.total_usage.cost_micro == root_cost + child.usage.cost_micro
        assert status.total_usage.unpriced_calls == 2
        assert status.total_usage.model_calls == len(kid_billed) + len(root_billed)
        assert status.total_usage.cost_usd == status.total_usage.cost_micro / 1_000_000


def test_an_int_budget_is_still_a_token_budget(tmp_path: Path) -> None:
    with fleet(tmp_path, extra_env=ENV) as f:
        f.brain.script("INT-B:", {n: call("read_note", name=f"n{n}") for n in range(30)})
        f.worker("--pool", "threads")
        root = f.relay.start("INT-B: read on", budget=900)
        pending_for(f, root, "budget")
        assert f.relay.status(root).budget == Budget(tokens=900)
        assert sum(p + c for p, c in f.model.billed("INT-B:")) <= 900
        _stop_tree(f, root)
        wait_state(f, root, "finished")
