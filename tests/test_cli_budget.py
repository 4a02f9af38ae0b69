"""Budgets on the command line: `relay run --budget-...`, `relay extend`, and what
`relay pending`, `show` and `runs` say about a tree's spend. A real worker and a
real model server; bad values are one clear line."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from agent_core import Stop
from tests.support.brain import call, final
from tests.support.cli import clean_env, relay
from tests.support.fleet import Fleet, fleet
from tests.support.waiting import pending_for
from workers import Budget
from workers.cli import cli
from workers.cli.lines import describe
from workers.engine.events import BudgetExtended
from workers.engine.records import TraceEntry

APP = "tests.apps.notes:relay"


@pytest.fixture
def priced(tmp_path: Path) -> Iterator[Fleet]:
    prices = tmp_path / "prices.toml"
    prices.write_text("[default]\ninput_per_m = 3.0\noutput_per_m = 15.0\n")
    env = {"RELAY_PRICES": str(prices), "RELAY_MODEL_MAX_TOKENS": "200"}
    with fleet(tmp_path, extra_env=env) as f:
        f.worker("--concurrency", "4", "--pool", "threads")
        yield f


def _invoke(f: Fleet, *args: str) -> tuple[int, str, str]:
    result = CliRunner(env=f.env).invoke(cli, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def test_run_with_a_budget_parks_and_extend_lets_it_finish(priced: Fleet) -> None:
    f = priced
    f.brain.script("CLI-B:", {0: call("read_note", name="a"), 1: final("read it")})
    root = f.relay.start("CLI-B: read", budget=Budget(model_calls=1))
    pending_for(f, root, "budget")
    code, out, _ = _invoke(f, "pending")
    assert code == 0
    assert root in out
    assert "relay extend RUN --usd X" in out
    code, out, _ = _invoke(f, "pending", "--json")
    [parked] = json.loads(out)
    assert (parked["run_id"], parked["kind"]) == (root, "budget")
    assert parked["summary"].startswith("The tree has used 1 model call of its 1 model call;")
    code, out, _ = _invoke(f, "show", root)
    assert code == 0
    assert re.search(r"^budget +1 model call *$", out, re.MULTILINE), out
    assert "1 model calls" not in out  # one call, one model call: never "1 model calls"
    assert "cost      $0.00" in out
    # Run from carol's shell: the run's trace says she raised it, and by what.
    extended = relay("extend", root, "--calls", "2", env=clean_env(**f.env, USER="carol"))
    assert extended.returncode == 0, extended.stderr
    assert f"Raised the budget of {root} by 2 model calls; 1 parked run went on." in (
        extended.stdout
    )
    assert f.relay.wait(root, 60).stop is Stop.DONE
    code, out, _ = _invoke(f, "show", root)
    assert "✓ the budget was extended: 2 model calls more, by carol" in out, out
    code, out, _ = _invoke(f, "runs")
    assert code == 0
    line = next(line for line in out.splitlines() if root in line)
    assert "$0.00" in line


def test_a_budget_raise_stored_before_it_said_who_still_reads() -> None:
    """A BudgetExtended stored before `by` and `raised` reads, and its trace line says
    only that the budget was extended."""
    old = BudgetExtended.model_validate_json('{"kind": "budget_extended", "seq": 3}')
    assert (old.by, old.raised) == ("", "")
    assert '"by"' not in old.model_dump_json()
    line = describe(TraceEntry(at_ms=0, run="r1", kind="budget_extended"), "r1")
    assert line is not None
    assert line.plain == "✓ the budget was extended"


def test_relay_run_takes_its_budget_from_the_options(priced: Fleet) -> None:
    f = priced
    f.brain.script("CLI-RUN:", {0: final("nothing to do")})
    done = relay(
        "--app", APP, "run", "CLI-RUN: answer", "--budget-usd", "0.5", "--budget-tokens",
        "100000", "--budget-calls", "5", "--deadline", "1h30m", "--json",
        env=clean_env(**f.env),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    status = json.loads(done.stdout)
    assert status["outcome"]["stop"] == "done"
    assert status["budget"] == {
        "tokens": 100_000,
        "usd": 0.5,
        "model_calls": 5,
        "seconds": 5400.0,
    }
    assert status["total_usage"]["cost_usd"] > 0


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["run", "t", "--deadline", "banana"], "'banana' is not a duration"),
        (["run", "t", "--deadline", "0s"], "is not a duration of more than 0 seconds"),
        (["run", "t", "--budget-usd", "nan"], "'nan' is not more than 0"),
        (["run", "t", "--budget-usd", "-1"], "'-1' is not more than 0"),
        (["run", "t", "--budget-tokens", "2.5"], "'2.5' is not a whole number"),
        (["run", "t", "--budget-calls", "0"], "'0' is not more than 0"),
        (["extend", "r1"], "say what to raise"),
        (["extend", "r1", "--usd", "inf"], "'inf' is not more than 0"),
    ],
)
def test_bad_budget_values_are_one_clear_line(args: list[str], says: str) -> None:
    done = relay("--app", APP, *args, env=clean_env(RELAY_REDIS_URL="redis://127.0.0.1:1/0"))
    assert done.returncode == 2, done.stdout + done.stderr
    assert says in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_extending_an_unknown_run_is_one_line(priced: Fleet) -> None:
    done = relay("extend", "nope", "--usd", "1", env=clean_env(**priced.env))
    assert done.returncode == 1
    said = done.stderr.strip()
    assert said == "relay: no run 'nope' (it never existed, or it finished and expired)"
