"""The suite format of `relay eval` and the checks of a run, without a fleet: what a
user writes is read (the README's example as written), what is wrong is refused
naming the case and the field, and every failure kind is told apart."""

from __future__ import annotations

import html
import json
import re
import time
import tomllib
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_core import Config, Policy, Risk, Stop
from workers import RelayError
from workers.evals.chart import COLOURS
from workers.evals.checks import FAILURE_KINDS, RunFacts, judge
from workers.evals.record import toml_value
from workers.evals.report import RUNS_GONE, build_report
from workers.evals.runner import Trial, TrialResult, trials_of
from workers.evals.suite import Expect, builtin_suite, load_suite, read_suite

README_CASE = b"""
approve = ["read", "create"]          # none by default; money also needs --allow-money

[[case]]
name = "copy"
task = "Copy a.txt to b.txt"
tools = ["read_note", "write_note"]   # the app's own tools, by name
min_pass = 1.0                         # of the repeats; below it, relay eval exits non-zero
expect.stop = "done"
expect.final_contains = "b.txt"
expect.called = ["read_note"]          # and expect.not_called, expect.max_calls
"""


def test_the_readme_case_reads_as_written() -> None:
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    assert README_CASE.decode().strip() in readme  # (the README shows this very text)
    suite = read_suite(README_CASE, "cases.toml", default_name="cases")
    (case,) = suite.case
    assert suite.name == "cases"
    assert suite.approve == [Risk.READ, Risk.CREATE]
    assert case.tools == ["read_note", "write_note"]
    assert case.expect.stop is Stop.DONE
    assert case.expect.final_contains == ["b.txt"]
    assert [c.tool for c in case.expect.called] == ["read_note"]
    assert case.expect.called[0].args is None


def test_the_builtin_suite_reads_and_covers_the_model_table() -> None:
    names = [case.name for case in builtin_suite().case]
    assert names == [
        "copy-note",
        "batch-lookups",
        "arithmetic",
        "specialist",
        "memory",
        "long-history",
        "question",
        "refused-transfer",
        "sent-back",
    ]


@pytest.mark.parametrize(
    ("text", "said"),
    [
        (b'[[case]]\nname = "a"\ntask = "t"\nexpect.stpo = "done"\n', "case 1 (a): expect.stpo"),
        (
            b'[[case]]\nname = "a"\ntask = "t"\nexpect.stop = "finished"\n',
            "case 1 (a): expect.stop",
        ),
        (b'[[case]]\nname = "a"\ntask = "t"\nexpect.final_matches = "("\n', "not a regular"),
        (b'[[case]]\nname = "a"\ntask = "t"\nconfig = { max_batch = 0 }\n', "case 1 (a): config"),
        (b'[[case]]\nname = "a"\ntask = "t"\nconfig = { maxbatch = 2 }\n', "maxbatch"),
        (b'[[case]]\nname = "a"\ntask = "t"\nthen = "again"\n', "need `memory = true`"),
        (b'[[case]]\nname = "a"\ntask = "t"\nmin_pass = 1.5\n', "case 1 (a): min_pass"),
        (b'[[case]]\nname = "a"\ntask = "t"\n[[case]]\nname = "a"\ntask = "u"\n', "two cases"),
        (b'[[case]]\nname = "a"\n', "case 1 (a): task"),
        (b'name = "x"\n', "case: Field required"),
        (b"[[case]\n", "not TOML"),
        (b"\xff\xfe", "not UTF-8"),
        (b'[[case]]\nname = "a"\ntask = "t"\nbudget = { tokens = -1 }\n', "budget.tokens"),
        (b'[[case]]\nname = "a"\ntask = "t"\napprove = "maybe"\n', "case 1 (a): approve"),
        (b'[[case]]\nname = "a"\ntask = "t"\napprove = "yes"\n', 'e.g. ["read", "create"]'),
        (b'approve = ["spend"]\n[[case]]\nname = "a"\ntask = "t"\n', "approve.0"),
        (
            b'approve = ["read"]\n[[case]]\nname = "a"\ntask = "t"\napprove = ["write"]\n',
            "cases.toml: case 1 (a): approve: write is not in the suite's approve (read)",
        ),
        (
            b'[[case]]\nname = "a"\ntask = "t"\nexpect.final_matches = "(a)\\\\1"\n',
            "(`\\1` is a backreference: RE2 matches none, nor look-around)",
        ),
        (
            b'[[case]]\nname = "a"\ntask = "t"\nexpect.final_matches = "(?=a)b"\n',
            "not a regular expression RE2 can match: invalid perl operator: (?= (`(?=` is"
            " look-around: RE2 matches none, nor backreferences)",
        ),
    ],
)
def test_a_wrong_suite_is_refused_naming_the_case_and_the_field(text: bytes, said: str) -> None:
    with pytest.raises(RelayError) as refused:
        read_suite(text, "cases.toml")
    assert str(refused.value).startswith("cases.toml: ")
    assert said in str(refused.value)


@pytest.mark.parametrize(
    ("pattern", "said"),
    [
        ("a{2000}", "invalid repetition size: {2000}"),
        ("(a", "missing ): (a"),
        ("a**", "bad repetition operator: **"),
        ("[\\1]", "invalid escape sequence: \\1"),  # (in a class, no backreference)
        ("\\\\[(?=]x(?>y)", "invalid perl operator: (?>"),  # (escaped, in a class; atomic)
    ],
)
def test_a_pattern_refused_for_another_reason_is_not_said_to_hold_a_backreference(
    pattern: str, said: str
) -> None:
    text = f'[[case]]\nname = "a"\ntask = "t"\nexpect.final_matches = {toml_value(pattern)}\n'
    with pytest.raises(RelayError) as refused:
        read_suite(text.encode(), "cases.toml")
    assert str(refused.value) == (
        "cases.toml: case 1 (a): expect.final_matches: not a regular expression RE2 can"
        f" match: {said}"
    )


@pytest.mark.parametrize(
    "nested",
    [
        "x = " + "[" * 5_000 + "]" * 5_000,  # deeper than tomllib's recursion reaches
        # Read by tomllib and pydantic, but too deep to serialise (`--show`, `Relay.start`):
        '[[case]]\nname = "a"\ntask = "t"\nrecorded = [{ tool = "x", output = "o", args = '
        + "{ x = "
        + "[" * 300
        + "]" * 300
        + " } }]",
        "[[case]]\nname = 'a'\ntask = 't'\n" + "config = " + "{ a = " * 40 + "1" + " }" * 40,
    ],
)
def test_deep_nesting_is_one_error_naming_the_file(tmp_path: Path, nested: str) -> None:
    deep = tmp_path / "deep.toml"
    deep.write_text(nested)
    with pytest.raises(RelayError) as refused:
        load_suite(deep)
    assert str(refused.value) == f"{deep}: tables or arrays nested more than 32 deep"


def test_the_suite_says_which_risks_its_cases_approve() -> None:
    suite = read_suite(
        b'approve = ["read", "create"]\n'
        b'[[case]]\nname = "a"\ntask = "t"\n'
        b'[[case]]\nname = "b"\ntask = "t"\napprove = ["read"]\n'
        b'[[case]]\nname = "c"\ntask = "t"\napprove = []\nplan = "decline"\n',
        "s.toml",
    )
    assert [suite.approves(case) for case in suite.case] == [
        (Risk.READ, Risk.CREATE),
        (Risk.READ,),
        (),
    ]
    assert suite.case[2].plan == "decline"
    trials = trials_of(suite, [None], 1)
    assert [(t.approve, t.approved_by) for t in trials] == [
        ((Risk.READ, Risk.CREATE), "suite"),
        ((Risk.READ,), "case"),
        ((), "case"),
    ]
    # With no `approve`, a suite approves nothing.
    assert read_suite(b'[[case]]\nname = "a"\ntask = "t"\n', "s.toml").approve == []


def test_a_case_policy_cannot_stop_the_run_asking_about_a_risk_it_does_not_approve() -> None:
    suite = read_suite(
        b'approve = ["read", "write"]\n'
        b'[[case]]\nname = "a"\ntask = "t"\nconfig = { policy = { ask = [] }, max_calls = 3 }\n'
        b'[[case]]\nname = "b"\ntask = "t"\nconfig = { policy = { ask = ["write"] } }\n',
        "s.toml",
    )
    app = Config(policy=Policy.TRUSTING)
    quiet, asking = (case.config_over(app, suite.approves(case)) for case in suite.case)
    # Every risk but the approved ones is asked about (and so declined by the eval).
    assert quiet.policy.ask == {Risk.CREATE, Risk.OUTSIDE, Risk.MONEY}
    assert quiet.max_calls == 3  # the case's other fields stand
    # A policy may ask about more than that, never less.
    assert asking.policy.ask == {Risk.CREATE, Risk.WRITE, Risk.OUTSIDE, Risk.MONEY}
    assert suite.case[0].config_over(app, ()).policy.ask == set(Risk)


def test_a_missing_or_huge_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(RelayError, match="cannot read it"):
        load_suite(tmp_path / "none.toml")
    huge = tmp_path / "huge.toml"
    huge.write_bytes(b"#" * 1_000_001)
    with pytest.raises(RelayError, match="at most 1000000 bytes"):
        load_suite(huge)


# --- the checks, and their failure kinds ---------------------------------------------------


def _expect(**fields: object) -> Expect:
    return Expect.model_validate(fields)


DONE = RunFacts(
    stop=Stop.DONE, final="Copied a.txt to b.txt", calls=(("read_note", {"name": "a.txt"}),)
)


def test_a_run_that_does_what_the_case_expects_passes() -> None:
    expect = _expect(
        final_contains=["B.TXT"],
        final_matches=r"a\.txt",
        called=[{"tool": "read_note", "args": {"name": "a.txt"}}],
        not_called=["write_note"],
        max_calls=1,
    )
    assert judge(expect, DONE).passed


@pytest.mark.parametrize(
    ("facts", "expect", "kind"),
    [
        (RunFacts(stop=None), {}, "timed out"),
        (RunFacts(stop=None, problem="no journal"), {}, "could not run"),
        (RunFacts(stop=Stop.BAD_REPLIES, retries=("no JSON",)), {}, "unusable replies"),
        (
            RunFacts(stop=Stop.BAD_REPLIES, retries=("there is no tool named 'x'; the tools",)),
            {},
            "invented tool names",
        ),
        (RunFacts(stop=Stop.MODEL_FAILED), {}, "model failed"),
        (RunFacts(stop=Stop.CALL_LIMIT), {}, "call limit"),
        (RunFacts(stop=Stop.MODEL_CALL_LIMIT), {}, "call limit"),
        (RunFacts(stop=Stop.NO_PROGRESS), {}, "no progress"),
        (RunFacts(stop=Stop.CANCELLED, over_budget=True), {}, "over budget"),
        (RunFacts(stop=Stop.BUDGET_EXCEEDED), {}, "over budget"),
        (
            RunFacts(stop=Stop.FAILED, final="The final answer was rejected 3 times: why"),
            {},
            "final rejected",
        ),
        (RunFacts(stop=Stop.PLAN_DECLINED), {}, "declined"),
        (RunFacts(stop=Stop.DONE), {"stop": "plan_declined"}, "wrong stop"),
        (DONE, {"final_contains": "c.txt"}, "wrong final"),
        (DONE, {"final_matches": "^nothing$"}, "wrong final"),
        (DONE, {"called": ["write_note"]}, "wrong calls"),
        (DONE, {"called": [{"tool": "read_note", "args": {"name": "z"}}]}, "wrong calls"),
        (DONE, {"not_called": ["read_note"]}, "wrong calls"),
        (DONE, {"max_calls": 0}, "wrong calls"),
        (RunFacts(stop=Stop.DONE, model_calls=5), {"max_model_calls": 4}, "wrong calls"),
        (RunFacts(stop=Stop.DONE, tokens=5), {"max_tokens": 4}, "wrong calls"),
        (RunFacts(stop=Stop.DONE, cost_usd=0.5), {"max_cost": 0.25}, "wrong calls"),
        (
            RunFacts(stop=Stop.DONE, after=("nothing here",)),
            {"after": [{"tool": "read_note", "contains": "apples"}]},
            "failed after-check",
        ),
        # A `then` case whose first run made no progress fails, though its last passed.
        (
            RunFacts(stop=Stop.DONE, final="4711", earlier=((Stop.NO_PROGRESS, "stuck"),)),
            {"final_contains": "4711"},
            "no progress",
        ),
    ],
)
def test_each_failure_has_its_kind(facts: RunFacts, expect: dict[str, object], kind: str) -> None:
    verdict = judge(_expect(**expect), facts)
    assert not verdict.passed
    assert verdict.kind == kind
    assert verdict.kind in FAILURE_KINDS
    assert verdict.why
    assert all(verdict.why)


def test_a_catastrophic_pattern_is_matched_in_bounded_time() -> None:
    # Python's `re` takes 2**n steps for this pattern on n a's and no match: at 40 a's,
    # days. RE2 takes time linear in the answer, pattern or not.
    expect = _expect(final_matches="(a+)+$", final_contains="a")
    answer = "a" * 40 + "!"
    began = time.monotonic()
    verdict = judge(expect, RunFacts(stop=Stop.DONE, final=answer))
    assert time.monotonic() - began < 5
    assert (verdict.kind, verdict.why) == (
        "wrong final",
        ("the final answer does not match '(a+)+$'",),
    )
    assert judge(expect, RunFacts(stop=Stop.DONE, final="a" * 100_000)).passed
    # A lone surrogate (JSON allows one) is matched around, not an error.
    assert judge(_expect(final_matches="b+c$"), RunFacts(stop=Stop.DONE, final="a\ud800bbc")).passed
    assert judge(
        _expect(final_matches="^café"), RunFacts(stop=Stop.DONE, final="café au lait")
    ).passed


def test_a_failed_trial_says_what_its_run_said() -> None:
    failed = judge(
        _expect(),
        RunFacts(
            stop=Stop.MODEL_FAILED,
            final="The model could not be reached: route small answered 404",
            declined=("declined: call-2 pay (MONEY) needs approval; the suite approves read",),
        ),
    )
    assert failed.why == (
        "it stopped with model_failed, not done: The model could not be reached:"
        " route small answered 404",
        "declined: call-2 pay (MONEY) needs approval; the suite approves read",
    )
    invented = judge(
        _expect(),
        RunFacts(
            stop=Stop.BAD_REPLIES,
            final="The model's replies could not be used",
            retries=("there is no tool named 'calculator'",) * 2 + ("no JSON",),
        ),
    )
    assert invented.kind == "invented tool names"
    assert invented.why[1:] == ("there is no tool named 'calculator'",)
    said_once = judge(
        _expect(),
        RunFacts(
            stop=Stop.BAD_REPLIES,
            final="The model's replies could not be used: there is no tool named 'calculator'",
            retries=("there is no tool named 'calculator'", "there is no tool named 'calc'"),
        ),
    )
    assert said_once.why[1:] == ("there is no tool named 'calc'",)  # (the other is said)
    first = judge(
        _expect(), RunFacts(stop=Stop.DONE, earlier=((Stop.NO_PROGRESS, "the same calls"),))
    )
    assert first.why == ("its run 1 of 2 stopped with no_progress, not done: the same calls",)


# --- the report ---------------------------------------------------------------------------


def test_the_report_sums_per_route_and_case_and_names_the_cases_that_fall_short() -> None:
    suite = read_suite(
        b'[[case]]\nname = "a"\ntask = "t"\nmin_pass = 0.5\n[[case]]\nname = "b"\ntask = "u"\n',
        "s.toml",
        default_name="s",
    )
    trials = trials_of(suite, ["big", "small"], 2)
    assert len(trials) == 8

    def result(trial: Trial) -> TrialResult:
        # "small" fails b's second repeat by inventing a tool name, and a's first.
        fails = trial.route == "small" and (trial.case.name, trial.repeat) in (("b", 2), ("a", 1))
        facts = RunFacts(
            stop=Stop.BAD_REPLIES if fails else Stop.DONE,
            retries=("there is no tool named 'x'",) if fails else (),
            model_calls=3,
            tokens=100,
            cost_usd=0.001 if trial.route == "big" else 0.0001,
        )
        return TrialResult(trial, facts, judge(trial.case.expect, facts), ("r1",))

    report = build_report("s", [result(t) for t in trials])
    by_route = {line.route: line for line in report.routes}
    assert (by_route["big"].passed, by_route["small"].passed) == (4, 2)
    assert by_route["small"].failures == {"invented tool names": 2}
    assert by_route["small"].invented == 2
    assert [(line.route, line.case) for line in report.short] == [("small", "b")]
    data = json.loads(report.as_json())
    assert data["passed"] is False
    assert {t["failure"] for t in data["trials"]} == {None, "invented tool names"}
    junit = ET.fromstring(report.junit())
    suites = junit.findall("testsuite")
    assert [s.get("failures") for s in suites] == ["0", "2"]
    assert len(junit.findall(".//failure")) == 2
    page = report.html()
    # A dot per route, coloured by what its trials came to, and a legend that says so.
    assert re.findall(r'<circle[^>]*fill="(#\w+)" data-state="([\w ]+)"', page) == [
        (COLOURS["passed"][0], "passed"),
        (COLOURS["short"][0], "short"),
    ]
    assert all(meaning in page for _, meaning in COLOURS.values())
    assert "Pass rate against cost per trial" in page
    assert 'class="short"' in page
    assert "b on small" in page
    # Each failed trial, with why, in every form.
    assert "a #1 on small: invented tool names" in page
    assert "there is no tool named &#x27;x&#x27;" in page
    failure = junit.findall(".//failure")[0]
    assert failure.get("message", "").startswith("invented tool names: it stopped with")
    assert "there is no tool named 'x'" in (failure.text or "")
    assert "runs: r1" in (junit.findall(".//system-out")[0].text or "")
    assert data["runs_kept"] is True


def test_a_report_of_unpriced_routes_plots_model_calls_and_names_gone_runs() -> None:
    suite = read_suite(b'[[case]]\nname = "a"\ntask = "t"\n', "s.toml", default_name="s")

    def result(trial: Trial) -> TrialResult:
        ok = trial.route == "fine"
        facts = RunFacts(
            stop=Stop.DONE if ok else Stop.MODEL_FAILED,
            final="fine" if ok else "The model could not be reached: 404",
            model_calls=2 if ok else 4,
        )
        trace = () if ok else ("r-x model_failed: 404",)
        return TrialResult(trial, facts, judge(trial.case.expect, facts), ("r-x",), trace)

    results = [result(t) for t in trials_of(suite, ["fine", "broken"], 1)]
    report = build_report("s", results, runs_kept=False)
    page = report.html()
    assert "Pass rate against model calls per trial (no route has a price)" in page
    assert re.findall(r'<circle[^>]*data-state="([\w ]+)"><title>([^<]*)<', page) == [
        ("passed", "fine: 100%, 2.0 calls (every trial passed)"),
        ("short", "broken: 0%, 4.0 calls (a case fell below its min_pass)"),
    ]
    assert html.escape(RUNS_GONE) in page
    assert "r-x model_failed: 404" in page
    data = json.loads(report.as_json())
    assert data["runs_note"] == RUNS_GONE
    (broken,) = [t for t in data["trials"] if not t["passed"]]
    assert broken["why"] == [
        "it stopped with model_failed, not done: The model could not be reached: 404"
    ]
    assert broken["trace"] == ["r-x model_failed: 404"]
    outs = [e.text or "" for e in ET.fromstring(report.junit()).findall(".//system-out")]
    assert all(RUNS_GONE in text for text in outs)


HOSTILE = "hello \x1b]0;PWNED\x07\x1b[2J world \x00\x9b31m \ud800 \ufffe end"


def test_what_a_model_wrote_leaves_every_report_form_well_formed() -> None:
    """A final answer with terminal escapes, a NUL, an 8-bit CSI, a lone surrogate (JSON
    allows one) and U+FFFE: the JUnit file parses, the HTML page holds none of them, and
    the JSON still carries the answer exactly."""
    suite = read_suite(b'[[case]]\nname = "a"\ntask = "t"\n', "s.toml", default_name="s")
    (trial,) = trials_of(suite, ["r"], 1)
    facts = RunFacts(stop=Stop.FAILED, final=HOSTILE, declined=(f"declined: {HOSTILE}",))
    trace = (f"r-1 final: {HOSTILE}",)
    report = build_report(
        "s", [TrialResult(trial, facts, judge(trial.case.expect, facts), ("r-1",), trace)]
    )
    unsafe = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff\ufffe]")

    junit = report.junit()
    assert not unsafe.search(junit)
    junit.encode("utf-8")  # (a lone surrogate could not even be written to the file)
    failure = ET.fromstring(junit).findall(".//failure")[0]
    shown = "hello \ufffd]0;PWNED\ufffd\ufffd[2J world \ufffd\ufffd31m \ufffd \ufffd end"
    assert shown in failure.get("message", "")
    assert shown in (failure.text or "")
    out = ET.fromstring(junit).findall(".//system-out")[0].text or ""
    assert f"declined: {shown}" in out
    assert f"r-1 final: {shown}" in out

    page = report.html()
    assert not unsafe.search(page)
    page.encode("utf-8")
    assert html.escape(shown) in page

    text = report.as_json()
    text.encode("utf-8")
    assert "\x1b" not in text
    (data,) = json.loads(text)["trials"]
    assert data["final"] == HOSTILE  # the data is what it was, escaped


# --- a recorded case is TOML that reads back ---------------------------------------------

_SCALARS = (
    st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False)
    | st.text()
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


@given(_VALUES)
@settings(max_examples=300, deadline=None)
def test_a_value_written_as_toml_reads_back_the_same(value: object) -> None:
    assert tomllib.loads(f"x = {toml_value(value)}\n")["x"] == value
