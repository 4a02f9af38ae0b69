"""`relay eval` on real fleets: the README's recipe (`relay eval --builtin`, the embedded
default) against three scripted models that behave like the core's model table, and a
user's suite on a test app's workers with recorded tools, approvals decided by the
case, a budget and a timeout.
"""

from __future__ import annotations

import html
import json
import re
import signal
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from agent_core import Stop
from tests.support.brain import SUMMARY_SYSTEM, batch, call, final
from tests.support.cli import Background, clean_env, left_running, marked
from tests.support.cli import relay as relay_command
from tests.support.eval_profiles import seven_b, strong, strong_tools, three_b
from tests.support.fleet import Fleet, fleet
from tests.support.model_server import ModelServer
from tests.support.redis_server import RedisServer
from tests.support.waiting import pending_for, prompts_for
from tests.support.worker_process import RelayProcess
from workers import Recorded, Relay, RelayError, Settings
from workers.evals.chart import COLOURS
from workers.evals.report import RUNS_GONE, build_report
from workers.evals.runner import check_suite, run_suite, trials_of
from workers.evals.suite import load_suite, read_suite

ROUTES = ("strong", "7b", "3b")


@pytest.fixture(scope="module")
def profiles(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[dict[str, str], dict[str, ModelServer]]]:
    """Three model servers, one per profile, and an environment naming them as routes
    (priced, so cost tells them apart) and nothing else: no Redis, so `relay eval`
    starts its own."""
    folder = tmp_path_factory.mktemp("eval")
    with (
        ModelServer(strong) as a,
        ModelServer(seven_b) as b,
        ModelServer(three_b) as c,
        # A route whose server says the request is wrong (a gateway that lacks the
        # model, say): every call of it fails, not retried elsewhere.
        ModelServer(strong, refuse_fields=("messages",), refuse_status=404) as d,
    ):
        prices = {"strong": (3.0, 9.0), "7b": (0.2, 0.6), "3b": (0.05, 0.1), "broken": (1, 1)}
        servers = dict(zip((*ROUTES, "broken"), (a, b, c, d), strict=True))
        routes = [
            {
                "name": name,
                "url": server.url,
                "model": name,
                "price": {"input_per_m": prices[name][0], "output_per_m": prices[name][1]},
            }
            for name, server in servers.items()
        ]
        (folder / "models.json").write_text(json.dumps(routes))
        yield clean_env(RELAY_MODELS=str(folder / "models.json")), servers


def _eval(env: dict[str, str], *args: str) -> tuple[int, dict[str, Any]]:
    env, marker = marked(env)
    done = relay_command("eval", "--builtin", *args, "--json", env=env, timeout=600)
    assert not left_running(marker), "the private Redis or worker outlived the command"
    assert done.stdout.startswith("{"), done.stderr[-3000:]
    return done.returncode, json.loads(done.stdout)


def _kinds(report: dict[str, Any], route: str) -> dict[str, str | None]:
    return {t["case"]: t["failure"] for t in report["trials"] if t["route"] == route}


def test_the_builtin_suite_ranks_the_models_and_names_how_each_failed(
    profiles: tuple[dict[str, str], dict[str, ModelServer]], tmp_path: Path
) -> None:
    env, servers = profiles
    html, junit = tmp_path / "report.html", tmp_path / "report.xml"
    routes = [arg for name in ROUTES for arg in ("--route", name)]
    code, report = _eval(env, *routes, "--html", str(html), "--junit", str(junit))
    assert code == 1  # the small models fall short of min_pass
    passed = {line["route"]: (line["passed"], line["trials"]) for line in report["routes"]}
    assert passed == {"strong": (9, 9), "7b": (4, 9), "3b": (0, 9)}
    assert _kinds(report, "7b") == {
        "copy-note": None,
        "batch-lookups": None,  # it invented a tool name once, and recovered
        "arithmetic": "invented tool names",
        "specialist": "wrong calls",
        "memory": "no progress",  # its first run did; the second recalled the code
        "long-history": "no progress",
        "question": None,
        "refused-transfer": None,
        "sent-back": "final rejected",
    }
    assert set(_kinds(report, "3b").values()) == {"unusable replies"}
    by_route = {line["route"]: line for line in report["routes"]}
    assert by_route["7b"]["invented_tool_names"] == 5  # 1 recovered + 4 until it stopped
    assert by_route["strong"]["retries"] == 0
    costs = [by_route[name]["cost_usd"] for name in ROUTES]
    assert costs == sorted(costs, reverse=True)
    assert costs[-1] > 0
    # The long-history case really overflowed its history and had it summarised.
    assert any(c.system.startswith(SUMMARY_SYSTEM) for c in servers["strong"].calls)
    # The refused transfer never ran: the balance read afterwards is the opening one.
    (refused,) = [
        t for t in report["trials"] if t["route"] == "strong" and t["case"] == "refused-transfer"
    ]
    assert [c["tool"] for c in refused["tool_calls"]] == ["transfer"]
    (memory,) = [t for t in report["trials"] if t["route"] == "7b" and t["case"] == "memory"]
    assert memory["why"][0].startswith("its run 1 of 2 stopped with no_progress, not done")
    assert memory["final"] == "The office door code is 4711."  # (the last run alone passed)
    page = html.read_text()
    # Each route's dot says what its trials came to: the 3B route is red, not green.
    assert re.findall(r'<circle[^>]*fill="(#\w+)" data-state="([\w ]+)"><title>(\w+):', page) == [
        (COLOURS["passed"][0], "passed", "strong"),
        (COLOURS["short"][0], "short", "7b"),
        (COLOURS["short"][0], "short", "3b"),
    ]
    assert "arithmetic on 7b" in page
    suites = ET.parse(junit).getroot().findall("testsuite")
    assert [(s.get("tests"), s.get("failures")) for s in suites] == [
        ("9", "0"),
        ("9", "5"),
        ("9", "9"),
    ]
    # JUnit names the tool the 7B model invented, and says its runs are gone.
    (arithmetic,) = [c for c in suites[1].findall("testcase") if c.get("name") == "arithmetic #1"]
    failure = arithmetic.find("failure")
    assert failure is not None
    assert failure.get("message", "").startswith("invented tool names: it stopped with bad_replies")
    assert "there is no tool named 'calculator'" in (failure.text or "")
    assert RUNS_GONE in (arithmetic.findtext("system-out") or "")
    assert report["runs_note"] == RUNS_GONE

    # Seeded: the same suite again gives the same figures (but for the wall time).
    again_code, again = _eval(env, *routes)
    assert again_code == code

    def figures(data: dict[str, Any]) -> list[dict[str, Any]]:
        return [{k: v for k, v in line.items() if k != "seconds"} for line in data["cases"]]

    assert figures(again) == figures(report)


def test_a_model_that_passes_every_case_exits_zero_with_a_table(
    profiles: tuple[dict[str, str], dict[str, ModelServer]],
) -> None:
    env, _ = profiles
    env, marker = marked(env)
    done = relay_command(
        "eval", "--builtin", "--route", "strong", "--repeat", "2", env=env, timeout=600
    )
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "Routes" in done.stdout
    assert "Cases" in done.stdout
    assert "18/18 100%" in done.stdout
    assert not left_running(marker)


def test_a_model_that_fails_shows_it_on_the_table_and_exits_one(
    profiles: tuple[dict[str, str], dict[str, ModelServer]],
) -> None:
    env, _ = profiles
    done = relay_command("eval", "--builtin", "--route", "3b", env=env, timeout=600)
    assert done.returncode == 1, done.stderr[-3000:]
    assert "0/9 0%" in done.stdout
    assert "unusable replies x9" in done.stdout
    assert "copy-note on 3b: 0% < min_pass 100%" in done.stdout


def test_a_broken_route_is_reported_with_what_its_runs_said(
    profiles: tuple[dict[str, str], dict[str, ModelServer]], tmp_path: Path
) -> None:
    """`model failed` alone hid why; the table a person reads now says what the run
    said, the page colours the route as failing, and no run id is offered for a
    lookup once the private Redis is gone."""
    env, _ = profiles
    html = tmp_path / "broken.html"
    done = relay_command(
        "eval", "--builtin", "--route", "broken", "--html", str(html), env=env, timeout=600
    )
    assert done.returncode == 1, done.stderr[-3000:]
    out = done.stdout
    assert "model failed x9" in out
    assert "copy-note #1 on broken: model failed" in out
    reason = next(line for line in out.splitlines() if "it stopped with model_failed" in line)
    assert "The model server refused the call: model server answered 404" in reason
    assert "messages is not supported by this server" in reason  # what the server said
    assert RUNS_GONE in out
    assert "runs:" not in out  # no id offered as if it could be looked up
    page = html.read_text()
    assert re.findall(r'<circle[^>]*data-state="([\w ]+)"><title>broken:', page) == ["short"]
    assert "messages is not supported by this server" in page
    # The end of each failed trial's trace was read before the Redis went, and kept.
    traces = re.findall(r"<summary>the end of its trace</summary><pre>(.*?)</pre>", page, re.S)
    assert len(traces) == 9
    assert all(re.search(r"^\w+ call_failed: model server answered 404", t, re.M) for t in traces)


def test_bad_invocations_say_what_is_wrong(
    profiles: tuple[dict[str, str], dict[str, ModelServer]], tmp_path: Path
) -> None:
    env, _ = profiles
    unknown = relay_command("eval", "--builtin", "--route", "nope", env=env)
    assert unknown.returncode == 1
    assert "no model route nope" in unknown.stderr
    neither = relay_command("eval", env=env)
    assert neither.returncode == 2
    assert "give a SUITE file or --builtin" in neither.stderr
    bad = tmp_path / "bad.toml"
    bad.write_text('[[case]]\nname = "x"\ntask = "t"\nexpect.stpo = "done"\n')
    refused = relay_command("eval", str(bad), "--app", "tests.apps.notes:relay", env=env)
    assert refused.returncode == 1
    assert "case 1 (x): expect.stpo" in refused.stderr
    deep = tmp_path / "deep.toml"
    deep.write_text("x = " + "[" * 5_000 + "]" * 5_000)
    nested = relay_command("eval", str(deep), "--app", "tests.apps.notes:relay", env=env)
    assert nested.returncode == 1
    assert nested.stderr.strip().splitlines() == [
        f"relay: {deep}: tables or arrays nested more than 32 deep"
    ]
    helped = " ".join(relay_command("eval", "run", "--help", env=env).stdout.split())
    assert "The app's real tools run (a case's `recorded` tools do not)" in helped
    assert "--allow-money" in helped
    assert "approved only when its risk is in the suite's `approve` list" in helped
    shown = relay_command("eval", "--builtin", "--show", env=env)
    assert shown.returncode == 0
    assert shown.stdout.startswith("# The built-in suite")  # the TOML as shipped, to copy
    assert read_suite(shown.stdout.encode(), "shown").case[7].name == "refused-transfer"


# --- a user's suite, on a fleet of the test app ----------------------------------------------


def _without_sleep(ledger: list[str]) -> list[str]:
    return [line for line in ledger if not line.startswith("sleep")]


@pytest.fixture(scope="module")
def f(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with fleet(tmp_path_factory.mktemp("eval-fleet")) as running:
        running.worker("--concurrency", "4")
        yield running


USER_SUITE = b"""
approve = ["read", "create"]

[[case]]
name = "recorded"
task = "EV-REC pay, read, delete and write"
tools = ["pay", "read_note", "delete_note", "write_note"]
config = { policy = { ask = ["create", "write", "money"] } }
deny = ["delete_note"]
edit = { write_note = { name = "edited.txt" } }
recorded = [
    { tool = "pay", args = { amount = 5 }, output = "paid 5 (recorded)" },
    { tool = "read_note", output = "the recorded note" },
]
expect.final_contains = "recorded"
expect.called = [{ tool = "pay", args = { amount = 7 } }, "delete_note"]

[[case]]
name = "bad-edit"
task = "EV-BADEDIT write"
tools = ["write_note"]
config = { policy = { ask = ["create"] } }
edit = { write_note = { name = [1, 2] } }
expect.called = "write_note"

[[case]]
name = "budget"
task = "EV-BUDGET read a note"
tools = ["read_note"]
budget = { tokens = 1 }

[[case]]
name = "slow"
task = "EV-SLOW sleep"
tools = ["sleep"]
[[case]]
name = "no-plan"
task = "EV-NOPLAN write"
config = { require_plan = true }
plan = "decline"
expect.stop = "plan_declined"
"""


def test_a_users_suite_runs_with_recorded_tools_and_decisions_from_the_case(f: Fleet) -> None:
    f.brain.script(
        "EV-REC",
        {
            0: batch(("pay", {"amount": 5}), ("pay", {"amount": 7})),
            2: call("read_note", name="x.txt"),
            3: call("delete_note", name="x.txt"),
            4: call("write_note", name="a.txt", text="hello"),
            5: final("done with the recorded note"),
        },
    )
    f.brain.script("EV-BADEDIT", {0: call("write_note", name="c.txt", text="x"), 1: final("no")})
    f.brain.script("EV-BUDGET", {0: call("read_note", name="x.txt"), 1: final("read")})
    f.brain.script("EV-SLOW", {0: call("sleep", seconds=30), 1: final("slept")})
    f.brain.script("EV-NOPLAN", {0: final("wrote")})
    suite = read_suite(USER_SUITE, "user.toml")
    check_suite(f.relay, suite, [None])
    results = run_suite(f.relay, trials_of(suite, [None], 1), timeout=8)
    by_case = {r.trial.case.name: r for r in results}

    recorded = by_case["recorded"]
    assert recorded.verdict.passed, (recorded.verdict, recorded.facts, f.logs())
    assert list(recorded.facts.calls) == [
        ("pay", {"amount": 5}),
        ("pay", {"amount": 7}),
        ("read_note", {"name": "x.txt"}),
        ("delete_note", {"name": "x.txt"}),
        ("write_note", {"name": "edited.txt", "text": "hello"}),  # the case's edit ran
    ]
    # No recorded tool ran (pay is MONEY, approved as it never runs); the denied call did not run.
    assert [line for line in f.ledger() if not line.startswith("sleep")] == [
        "write_note edited.txt"
    ]
    ran = json.loads(build_report("user", results).as_json())["trials"][0]["tool_calls"]
    assert [(c["tool"], c["ran"]) for c in ran] == [
        ("pay", "recorded"),
        ("pay", "recorded"),  # (no outcome recorded for 7: an error, and nothing ran)
        ("read_note", "recorded"),
        ("delete_note", "not run"),
        ("write_note", "for real"),
    ]
    said = prompts_for(f, "EV-REC")[-1]
    assert "paid 5 (recorded)" in said
    assert "the recorded note" in said
    assert "pay has no recorded outcome for these arguments; it was not run" in said

    assert by_case["bad-edit"].verdict.passed, by_case["bad-edit"]
    assert "the case's edit was refused" in prompts_for(f, "EV-BADEDIT")[-1]
    assert by_case["budget"].verdict.kind == "over budget"
    assert by_case["budget"].facts.stop is Stop.CANCELLED
    assert by_case["no-plan"].verdict.passed, by_case["no-plan"]
    assert by_case["no-plan"].facts.stop is Stop.PLAN_DECLINED
    slow = by_case["slow"]
    assert slow.verdict.kind == "timed out"
    assert f.relay.wait(slow.runs[0], 30).stop is Stop.CANCELLED  # not left running


ATTACK = """[[case]]
name = "pay"
task = "EV-ATTACK pay and tidy up"
edit = { pay = { amount = 999999 } }
"""


def _suite_file(tmp_path: Path, text: str) -> str:
    path = tmp_path / f"suite-{time.monotonic_ns()}.toml"
    path.write_text(text)
    return str(path)


def test_a_suite_approves_only_the_risks_it_names_and_money_only_with_the_flag(
    f: Fleet, tmp_path: Path
) -> None:
    """The four-line suite that paid 999,999 through an edit: now the MONEY call (and a
    WRITE one) is declined, and the trial says so; money needs the suite and the flag."""
    f.brain.script(
        "EV-ATTACK",
        {
            0: call("pay", amount=5),
            1: call("delete_note", name="old.txt"),
            2: final("paid and tidied"),
        },
    )
    env = clean_env(**f.env)
    app = ("--app", "tests.apps.notes:relay")

    def evaluate(text: str, *flags: str) -> tuple[int, dict[str, Any], str]:
        done = relay_command(*app, "eval", _suite_file(tmp_path, text), *flags, "--json", env=env)
        data = json.loads(done.stdout) if done.stdout.startswith("{") else {}
        return done.returncode, data, done.stderr

    code, report, _ = evaluate(ATTACK)
    (trial,) = report["trials"]
    assert code == 0, report  # the run went on, told; the case checks nothing more
    assert [re.sub(r"call-\d+", "call-N", d) for d in trial["declined"]] == [
        "declined: call-N pay (MONEY) needs approval; the suite approves nothing",
        "declined: call-N delete_note (WRITE) needs approval; the suite approves nothing",
    ]
    assert not [line for line in f.ledger() if line.startswith(("pay", "delete"))]
    assert "relay eval declined: call-" in prompts_for(f, "EV-ATTACK")[-1]  # the model is told
    assert [(c["tool"], c["outcome"], c["ran"]) for c in trial["tool_calls"]] == [
        ("pay", "declined", "not run"),
        ("delete_note", "declined", "not run"),
    ]

    # A case that checks what was declined fails, saying so, in the table a person reads.
    done = relay_command(
        *app,
        "eval",
        _suite_file(
            tmp_path, ATTACK + 'expect.called = [{ tool = "pay", args = { amount = 999999 } }]\n'
        ),
        env=env,
    )
    assert done.returncode == 1
    assert "pay #1 on default: wrong calls" in done.stdout
    assert "pay (MONEY) needs approval; the suite approves nothing" in done.stdout

    # The suite may approve WRITE: the delete runs; MONEY is still declined.
    code, report, _ = evaluate('approve = ["write"]\n' + ATTACK)
    assert [d.split(" ", 2)[2] for d in report["trials"][0]["declined"]] == [
        "pay (MONEY) needs approval; the suite approves write"
    ]
    assert "delete_note old.txt" in f.ledger()
    assert not [line for line in f.ledger() if line.startswith("pay")]
    assert [(c["tool"], c["ran"]) for c in report["trials"][0]["tool_calls"]] == [
        ("pay", "not run"),
        ("delete_note", "for real"),  # the app's own tool
    ]

    # Money in approve without --allow-money: refused before anything runs.
    runs_before = f.relay.runs_client.count_runs()
    code, _, said = evaluate('approve = ["money"]\n' + ATTACK)
    assert code == 1
    assert "approves money" in said
    assert "--allow-money" in said
    assert f.relay.runs_client.count_runs() == runs_before
    # The flag alone approves nothing: the suite must list money too.
    code, report, _ = evaluate(ATTACK, "--allow-money")
    assert "pay (MONEY) needs approval" in report["trials"][0]["declined"][0]
    assert not [line for line in f.ledger() if line.startswith("pay")]
    # In Python too, a suite's money is not approved without allow_money.
    money = read_suite(('approve = ["money", "write"]\n' + ATTACK).encode(), "money.toml")
    (result,) = run_suite(f.relay, trials_of(money, [None], 1), timeout=60)
    assert [d.split(" ", 2)[2] for d in result.facts.declined] == [
        "pay (MONEY) needs --allow-money"
    ]
    assert not [line for line in f.ledger() if line.startswith("pay")]
    # Both: the edited payment runs for real, with the app's own tool.
    code, report, _ = evaluate('approve = ["money"]\n' + ATTACK, "--allow-money")
    assert report["trials"][0]["declined"][0].split(" ", 2)[2].startswith("delete_note (WRITE)")
    assert "pay 999999" in f.ledger()
    assert report["trials"][0]["tool_calls"][0] == {
        "tool": "pay",
        "args": {"amount": 999999},
        "outcome": "ok",
        "ran": "for real",
    }


NO_ASKING = """[[case]]
name = "no-asking"
task = "EV-NOASK make, delete and wait"
config = { policy = { ask = [] } }
"""


def test_a_case_whose_policy_asks_nothing_still_runs_no_risk_the_suite_does_not_list(
    f: Fleet, tmp_path: Path
) -> None:
    """A case's `config.policy` that asks about nothing does not let a call run
    unasked: the trial's run asks about every risk the suite does not approve, and
    the eval declines it (READ too, until the suite lists it)."""
    f.brain.script(
        "EV-NOASK",
        {
            0: call("write_note", name="noask-made.txt", text="x"),
            1: call("delete_note", name="noask-victim.txt"),
            2: call("sleep", seconds=0.01),
            3: final("made, deleted and waited"),
        },
    )
    env = clean_env(**f.env)

    def evaluate(text: str) -> dict[str, Any]:
        done = relay_command(
            *("--app", "tests.apps.notes:relay", "eval", _suite_file(tmp_path, text), "--json"),
            env=env,
        )
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        (trial,) = json.loads(done.stdout)["trials"]
        return dict(trial)

    def declined(trial: dict[str, Any]) -> list[str]:
        return [d.split(" ", 2)[2] for d in trial["declined"]]

    trial = evaluate(NO_ASKING)
    assert declined(trial) == [
        "write_note (CREATE) needs approval; the suite approves nothing",
        "delete_note (WRITE) needs approval; the suite approves nothing",
        "sleep (READ) needs approval; the suite approves nothing",
    ]
    assert [(c["tool"], c["ran"]) for c in trial["tool_calls"]] == [
        ("write_note", "not run"),
        ("delete_note", "not run"),
        ("sleep", "not run"),
    ]
    ran = [line for line in f.ledger() if "noask" in line or line.startswith("sleep start 0.01")]
    assert not ran

    # The suite lists read: the READ call runs for real, the others are still declined.
    trial = evaluate('approve = ["read"]\n' + NO_ASKING)
    assert declined(trial) == [
        "write_note (CREATE) needs approval; the suite approves read",
        "delete_note (WRITE) needs approval; the suite approves read",
    ]
    assert [(c["tool"], c["ran"]) for c in trial["tool_calls"]][2] == ("sleep", "for real")
    assert "sleep start 0.01" in f.ledger()
    assert not [line for line in f.ledger() if "noask" in line]

    # The suite lets read and write run, and the case denies sleep and edits delete_note:
    # both hold though neither call would ask (the case's policy asks about nothing).
    slept = f.ledger().count("sleep start 0.01")
    trial = evaluate(
        'approve = ["read", "write"]\n'
        + NO_ASKING
        + 'deny = ["sleep"]\nedit = { delete_note = { name = "noask-edited.txt" } }\n'
    )
    assert declined(trial) == [
        "write_note (CREATE) needs approval; the suite approves read, write",
    ]
    assert [(c["tool"], c["outcome"], c["ran"]) for c in trial["tool_calls"]][1:] == [
        ("delete_note", "ok", "for real"),
        ("sleep", "declined", "not run"),
    ]
    assert [line for line in f.ledger() if "noask" in line] == ["delete_note noask-edited.txt"]
    assert f.ledger().count("sleep start 0.01") == slept


def test_what_the_model_wrote_reaches_no_terminal_and_no_report_file_raw(
    f: Fleet, tmp_path: Path
) -> None:
    """A final answer that retitles the window and clears the screen, in a trial that
    fails: the table a person reads shows it defused, the JUnit file parses and says
    it, the HTML page holds no escape, and --json prints none raw either."""
    written = "hello \x1b]0;PWNED\x07\x1b[2J world \x9b31m"
    f.brain.script("EV-ESC", {0: final(written)})
    suite = _suite_file(
        tmp_path, '[[case]]\nname = "escapes"\ntask = "EV-ESC"\nexpect.stop = "failed"\n'
    )
    junit, page = tmp_path / "eval.xml", tmp_path / "eval.html"
    env = clean_env(**f.env)
    app = ("--app", "tests.apps.notes:relay", "eval", suite)
    done = relay_command(*app, "--junit", str(junit), "--html", str(page), env=env)
    assert done.returncode == 1, done.stdout + done.stderr
    shown = "hello \ufffd]0;PWNED\ufffd\ufffd[2J world \ufffd31m"
    assert "escapes #1 on default: wrong stop" in done.stdout
    assert f"it stopped with done, not failed: {shown}" in done.stdout
    for said in (done.stdout, done.stderr, page.read_text()):
        assert "\x1b" not in said
        assert "\x07" not in said
        assert "\x9b" not in said
    (failure,) = ET.parse(junit).getroot().iter("failure")
    assert shown in failure.get("message", "")
    assert html.escape(shown) in page.read_text()

    as_json = relay_command(*app, "--json", env=env)
    assert not re.search("[\x07\x1b\x9b]", as_json.stdout)
    (trial,) = json.loads(as_json.stdout)["trials"]
    assert trial["final"] == written  # the data, exactly, escaped


def test_a_catastrophic_pattern_is_judged_at_once(f: Fleet, tmp_path: Path) -> None:
    """`(a+)+$` on forty a's and a `!` is days of backtracking for Python's `re`; the
    eval judges it in no time and says the answer does not match."""
    f.brain.script("EV-REGEX", {0: final("a" * 40 + "!")})
    suite = _suite_file(
        tmp_path,
        '[[case]]\nname = "regex"\ntask = "EV-REGEX"\nexpect.final_matches = "(a+)+$"\n',
    )
    env = clean_env(**f.env)
    began = time.monotonic()
    done = relay_command(
        "--app", "tests.apps.notes:relay", "eval", suite, "--timeout", "5", env=env, timeout=120
    )
    assert time.monotonic() - began < 60
    assert done.returncode == 1, done.stderr
    assert "regex #1 on default: wrong final" in done.stdout
    assert "the final answer does not match '(a+)+$'" in done.stdout


def test_a_suite_naming_what_the_app_lacks_is_refused_before_anything_runs(f: Fleet) -> None:
    runs_before = f.relay.runs_client.count_runs()
    for text, said in (
        (b'[[case]]\nname = "a"\ntask = "t"\ntools = ["nope"]\n', "has no tool nope"),
        (b'[[case]]\nname = "a"\ntask = "t"\ndeny = ["nope"]\n', "has no tool nope"),
        (
            b'[[case]]\nname = "a"\ntask = "t"\nexpect.after = [{ tool = "write_note" }]\n',
            "not a READ tool",
        ),
        (b'[[case]]\nname = "a"\ntask = "t"\nedit = { pay = { sum = 1 } }\n', "no argument sum"),
        (
            b'[[case]]\nname = "a"\ntask = "t"\n'
            b'recorded = [{ tool = "pay", args = { amount = "lots" }, output = "x" }]\n',
            "case a: recorded pay",
        ),
    ):
        with pytest.raises(RelayError, match=said):
            check_suite(f.relay, read_suite(text, "s.toml"), [None])
    with pytest.raises(RelayError, match="no model route nope"):
        check_suite(f.relay, read_suite(b'[[case]]\nname = "a"\ntask = "t"\n', "s.toml"), ["nope"])
    with pytest.raises(RelayError, match="recorded: no tool named 'nope'"):
        f.relay.start("EV-NONE", recorded={"nope": [Recorded(output="x")]})
    with pytest.raises(RelayError, match="recorded pay"):
        f.relay.start("EV-NONE", recorded={"pay": [Recorded(output="x", args={"amount": "lots"})]})
    assert f.relay.runs_client.count_runs() == runs_before


def test_a_run_recorded_as_a_case_evaluates_without_touching_anything(
    f: Fleet, tmp_path: Path
) -> None:
    f.brain.script(
        "EV-RECORD",
        {
            0: call("read_note", name="a.txt"),
            1: json.dumps({"ask_user": "Whose note is it?"}),
            2: call("delete_note", name="old.txt"),
            3: call("write_note", name="b.txt", text="copied"),
            4: final("copied a.txt to b.txt"),
        },
    )
    run_id = f.relay.start("EV-RECORD copy a note")
    f.relay.answer(pending_for(f, run_id, "question").run_id, "Ada's")
    waiting = pending_for(f, run_id, "call")
    f.relay.deny(run_id, waiting.call_id or "", "not today")
    assert f.relay.wait(run_id, 60).stop is Stop.DONE
    ran_before = f.ledger()
    assert ran_before.count("write_note b.txt") == 1

    suite_file = tmp_path / "recorded.toml"
    suite_file.write_text('name = "recorded"\n')
    env = clean_env(**f.env)
    done = relay_command(
        "--app", "tests.apps.notes:relay", "eval", "record", run_id, "-o", str(suite_file), env=env
    )
    assert done.returncode == 0, done.stderr
    suite = load_suite(suite_file)
    (case,) = suite.case
    assert (case.name, case.task) == (f"run-{run_id}", "EV-RECORD copy a note")
    assert case.answers == ["Ada's"]
    assert case.deny == ["delete_note"]
    assert [(r.tool, r.args) for r in case.recorded] == [
        ("read_note", {"name": "a.txt"}),
        ("write_note", {"name": "b.txt", "text": "copied"}),
    ]
    assert [c.tool for c in case.expect.called] == ["read_note", "delete_note", "write_note"]

    (result,) = run_suite(f.relay, trials_of(suite, [None], 1))
    assert result.verdict.passed, (result.verdict, result.facts)
    # Every call was recorded, or denied: nothing ran. (The slow case's 30 s sleep, which an
    # earlier test left behind its 8 s timeout, may end meanwhile: this case calls no sleep.)
    assert _without_sleep(f.ledger()) == _without_sleep(ran_before)

    unfinished = relay_command(
        "--app", "tests.apps.notes:relay", "eval", "record", "nosuchrun", env=env
    )
    assert unfinished.returncode == 1
    assert "nosuchrun" in unfinished.stderr


def test_ctrl_c_stops_the_eval_and_cancels_its_runs(f: Fleet, tmp_path: Path) -> None:
    f.brain.script("EV-INT", {0: call("sleep", seconds=60), 1: final("slept")})
    suite_file = tmp_path / "slow.toml"
    suite_file.write_text(
        'approve = ["read"]\n[[case]]\nname = "slow"\ntask = "EV-INT sleep"\nrepeat = 2\n'
    )
    before = {r.id for r in f.relay.runs_client.runs(1000)}
    env = clean_env(**f.env)
    command = Background("--app", "tests.apps.notes:relay", "eval", str(suite_file), env=env)
    try:
        started: list[str] = []

        def both_started() -> bool:
            started[:] = [r.id for r in f.relay.runs_client.runs(1000) if r.id not in before]
            return len(started) == 2 and all(f.relay.status(r).state == "running" for r in started)

        f.until(both_started, 60, what="the eval's two runs to be under way")
        command.process.send_signal(signal.SIGINT)
        assert command.wait(60) == 130
        assert "interrupted; the runs in flight were cancelled" in command.text
    finally:
        command.close()
    for run_id in started:
        assert f.relay.wait(run_id, 30).stop is Stop.CANCELLED


def test_a_redis_restart_is_waited_out_and_a_vanished_run_fails_its_trial_alone(
    tmp_path: Path,
) -> None:
    with fleet(tmp_path, appendonly=True) as g:
        g.worker("--concurrency", "4")
        g.brain.script("EV-RESTART", {0: call("sleep", seconds=2), 1: final("slept")})
        g.brain.script("EV-GONE", {0: call("sleep", seconds=30), 1: final("slept")})
        suite = read_suite(
            b'approve = ["read"]\n'
            b'[[case]]\nname = "restart"\ntask = "EV-RESTART"\ntools = ["sleep"]\n'
            b'[[case]]\nname = "gone"\ntask = "EV-GONE"\ntools = ["sleep"]\n',
            "s.toml",
        )
        found: list[Any] = []
        runner = threading.Thread(
            target=lambda: found.extend(run_suite(g.relay, trials_of(suite, [None], 1), timeout=60))
        )
        runner.start()
        try:
            runs: dict[str, str] = {}

            def both_sleeping() -> bool:
                for status in g.relay.runs_client.runs(100):
                    runs[status.task] = status.id
                return len(runs) == 2 and "sleep start 30" in g.ledger()

            g.until(both_sleeping, 60, what="both runs to be asleep")
            g.redis.kill()
            time.sleep(1.0)  # ten polls find Redis down
            g.redis.start()
            g.relay.store.redis.delete(g.relay.store.keys.run(runs["EV-GONE"]))
        finally:
            runner.join(120)
        assert not runner.is_alive()
        by_case = {r.trial.case.name: r for r in found}
        assert by_case["restart"].verdict.passed, (by_case["restart"].facts, g.logs())
        assert by_case["gone"].verdict.kind == "could not run"
        assert runs["EV-GONE"] in by_case["gone"].facts.problem


# --- the route's protocol, measured by the suite ---------------------------------------------


def test_a_suite_measures_routes_speaking_function_calls_and_a_refused_json_schema(
    tmp_path: Path,
) -> None:
    with ExitStack() as stack:
        redis_server = stack.enter_context(RedisServer(tmp_path))
        calling = stack.enter_context(ModelServer(strong_tools))
        refusing = stack.enter_context(ModelServer(strong, refuse_fields=("response_format",)))
        routes = [
            {"name": "fc", "url": calling.url, "model": "m", "protocol": "tools"},
            {"name": "js", "url": refusing.url, "model": "m", "protocol": "json"},
        ]
        (tmp_path / "models.json").write_text(json.dumps(routes))
        env = clean_env(
            RELAY_REDIS_URL=redis_server.url,
            RELAY_MODELS=str(tmp_path / "models.json"),
            RELAY_EVAL_DIR=str(tmp_path),
        )
        worker = RelayProcess(
            ["--app", "workers.evals.builtin:relay", "worker", "--hostname", "w@eval"],
            env,
            tmp_path / "worker.log",
        ).start()
        stack.callback(worker.stop)
        done = relay_command(
            "eval", "--builtin", "--route", "fc", "--route", "js", "--json", env=env
        )
        assert done.returncode == 0, (
            done.stdout[-2000:] + done.stderr[-2000:] + worker.output()[-3000:]
        )
        report = json.loads(done.stdout)
        assert {line["route"]: line["passed"] for line in report["routes"]} == {"fc": 9, "js": 9}

        # The function-calling server was offered functions on every request but summaries.
        asked = [c.body for c in calling.calls]
        summaries = [b for b in asked if b["messages"][0]["content"].startswith(SUMMARY_SYSTEM)]
        assert summaries
        assert all("tools" not in b for b in summaries)
        others = [b for b in asked if b not in summaries]
        assert others
        assert all(b["tool_choice"] == "required" and b["tools"] for b in others)
        # The other refused the schema once per worker thread at most, then was asked in text.
        with_schema = [c for c in refusing.calls if "response_format" in c.body]
        assert 1 <= len(with_schema) <= 8
        assert len(refusing.calls) > len(with_schema) * 3

        shown = relay_command("routes", "--json", env=env)
        states = {s["name"]: s for s in json.loads(shown.stdout)}
        assert states["js"]["protocol_fallback"]
        assert "response_format" in states["js"]["protocol_fallback"]
        assert states["fc"]["protocol_fallback"] is None
        table = relay_command("routes", env=env).stdout
        assert "json → text" in table
        js_runs = [t["runs"][0] for t in report["trials"] if t["route"] == "js"]
        relay = Relay("relay-eval", settings=Settings.from_env(env))
        warned = [
            e.text
            for run_id in js_runs
            for e in relay.trace(run_id)
            if e.kind == "warning" and "does not take the json protocol" in e.text
        ]
        assert warned, "no run's trace says the route fell back to text"
