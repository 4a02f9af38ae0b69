"""Tools and their arguments: coercion, checks, summaries and refused definitions."""

from __future__ import annotations

from typing import Any

import pytest

from agent_core import (
    Agent,
    AgentError,
    Ask,
    Config,
    DefinitionError,
    Kind,
    Policy,
    Risk,
    Run,
    Tool,
    ToolArgsError,
    ToolOutput,
    UsageError,
)
from tests.support.scripted import call, prompt_of

NO_PLAN = Config(require_plan=False)


def started(*tools: Tool, config: Config = NO_PLAN) -> Agent:
    agent = Agent(config, list(tools))
    agent.start("Use the tool")
    return agent


def one_arg_tool(kind: Kind) -> Tool:
    return Tool("probe", "Probe a value").arg("value", kind, "the value").risk(Risk.READ)


# --- coercion, one Kind at a time ---------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "given", "expected"),
    [
        (Kind.NUMBER, "3.5", 3.5),
        (Kind.NUMBER, " 7 ", 7),
        (Kind.NUMBER, "-2e3", -2000.0),
        (Kind.NUMBER, 4, 4),
        (Kind.NUMBER, 0.25, 0.25),
        (Kind.INTEGER, 3, 3),
        (Kind.INTEGER, 3.0, 3),
        (Kind.INTEGER, "3", 3),
        (Kind.INTEGER, "-12", -12),
        (Kind.INTEGER, "4.0", 4),
        (Kind.BOOLEAN, True, True),
        (Kind.BOOLEAN, "true", True),
        (Kind.BOOLEAN, "false", False),
        (Kind.BOOLEAN, " TRUE ", True),
        (Kind.BOOLEAN, "False", False),
        (Kind.TEXT, "hello", "hello"),
        (Kind.TEXT, 5, "5"),
        (Kind.TEXT, 2.5, "2.5"),
        (Kind.TEXT, True, "true"),
        (Kind.LIST, [1, "two", None], [1, "two", None]),
        (Kind.LIST, [], []),
        (Kind.OBJECT, {"a": [1]}, {"a": [1]}),
        (Kind.OBJECT, {}, {}),
    ],
)
def test_each_kind_coerces_what_a_careful_reader_would(
    kind: Kind, given: Any, expected: Any
) -> None:
    agent = started(one_arg_tool(kind))
    step = agent.reply(call("probe", value=given))
    assert isinstance(step, Run)
    assert step.call.args == {"value": expected}
    assert type(step.call.args["value"]) is type(expected)


@pytest.mark.parametrize(
    ("kind", "given", "reason"),
    [
        (Kind.INTEGER, 2.5, "'value' must be a whole number, got 2.5"),
        (Kind.INTEGER, "2.5", "'value' must be a whole number"),
        (Kind.INTEGER, "three", "'value' must be a number"),
        (Kind.NUMBER, "abc", "'value' must be a number"),
        (Kind.NUMBER, "", "'value' must be a number"),
        (Kind.NUMBER, "nan", "'value' must be a finite number"),
        (Kind.NUMBER, "inf", "'value' must be a finite number"),
        (Kind.NUMBER, True, "'value' must be a number, got a boolean"),
        (Kind.NUMBER, [1], "'value' must be a number, got a list"),
        (Kind.NUMBER, "1" * 100, "'value' must be a number"),
        (Kind.BOOLEAN, "yes", "'value' must be true or false"),
        (Kind.BOOLEAN, 1, "'value' must be true or false"),
        (Kind.TEXT, ["a"], "'value' must be text, got a list"),
        (Kind.TEXT, {"a": 1}, "'value' must be text, got an object"),
        (Kind.LIST, "a, b", "'value' must be a JSON list, got text"),
        (Kind.OBJECT, [1], "'value' must be a JSON object, got a list"),
    ],
)
def test_a_wrong_value_is_explained_to_the_model(kind: Kind, given: Any, reason: str) -> None:
    agent = started(one_arg_tool(kind))
    step = agent.reply(call("probe", value=given))
    assert isinstance(step, Ask)
    assert "Your last reply could not be used: probe: " in prompt_of(step)
    assert reason in prompt_of(step)


def test_unknown_extras_are_dropped() -> None:
    agent = started(one_arg_tool(Kind.TEXT))
    step = agent.reply(call("probe", value="x", verbose=True, extra={"deep": [1]}))
    assert isinstance(step, Run)
    assert step.call.args == {"value": "x"}


def test_an_optional_left_out_or_null_is_absent() -> None:
    tool = (
        Tool("search", "Search")
        .arg("query", Kind.TEXT)
        .opt("limit", Kind.INTEGER, "how many")
        .opt("exact", Kind.BOOLEAN)
        .risk(Risk.READ)
    )
    agent = started(tool)
    step = agent.reply(call("search", query="cats", exact=None))
    assert isinstance(step, Run)
    assert step.call.args == {"query": "cats"}
    assert "limit" not in step.call.args
    assert "exact" not in step.call.args


def test_an_optional_given_is_coerced() -> None:
    tool = Tool("search", "Search").arg("query", Kind.TEXT).opt("limit", Kind.INTEGER)
    agent = started(tool.risk(Risk.READ))
    step = agent.reply(call("search", query="cats", limit="5"))
    assert isinstance(step, Run)
    assert step.call.args == {"query": "cats", "limit": 5}


@pytest.mark.parametrize("args", [{}, {"path": None}, {"other": "x"}])
def test_a_missing_required_argument_is_explained_and_the_model_tries_again(
    args: dict[str, Any],
) -> None:
    tool = Tool("read_file", "Read").arg("path", Kind.TEXT, "a relative path").risk(Risk.READ)
    agent = started(tool)
    step = agent.reply(call("read_file", **args))
    assert isinstance(step, Ask)
    assert "read_file: 'path' is required: text (a relative path)" in prompt_of(step)
    step = agent.reply(call("read_file", path="notes.txt"))
    assert isinstance(step, Run)
    assert step.call.args == {"path": "notes.txt"}


def test_arguments_that_are_not_an_object_are_explained() -> None:
    agent = started(one_arg_tool(Kind.TEXT))
    step = agent.reply('{"tool": "probe", "args": [1, 2]}')
    assert '"args" of probe must be a JSON object' in prompt_of(step)


# --- validate -------------------------------------------------------------------------------


def _relative(args: dict[str, Any]) -> dict[str, Any]:
    if args["path"].startswith("/"):
        raise ToolArgsError("the path must be relative to the project")
    return {**args, "path": args["path"].strip("./")}


VALIDATED = Tool("read_file", "Read").arg("path", Kind.TEXT).risk(Risk.READ).validate(_relative)


def test_validate_returns_the_args_to_use() -> None:
    step = started(VALIDATED).reply(call("read_file", path="./notes.txt"))
    assert isinstance(step, Run)
    assert step.call.args == {"path": "notes.txt"}


def test_validate_refusal_reaches_the_model_and_it_tries_again() -> None:
    agent = started(VALIDATED)
    step = agent.reply(call("read_file", path="/etc/passwd"))
    assert isinstance(step, Ask)
    assert "read_file: the path must be relative to the project" in prompt_of(step)
    step = agent.reply(call("read_file", path="notes.txt"))
    assert isinstance(step, Run)


def test_validate_sees_typed_arguments() -> None:
    seen: list[dict[str, Any]] = []

    def keep(args: dict[str, Any]) -> dict[str, Any]:
        seen.append(args)
        return args

    tool = Tool("wait", "Wait").arg("seconds", Kind.INTEGER).risk(Risk.READ).validate(keep)
    started(tool).reply(call("wait", seconds="10", junk=1))
    assert seen == [{"seconds": 10}]


@pytest.mark.parametrize("returned", [None, ["path"], {"path": object()}])
def test_validate_returning_no_usable_args_is_a_host_error(returned: Any) -> None:
    tool = Tool("read_file", "Read").arg("path", Kind.TEXT).validate(lambda _args: returned)
    agent = started(tool.risk(Risk.READ))
    with pytest.raises(UsageError):
        agent.reply(call("read_file", path="x"))


# --- summary --------------------------------------------------------------------------------


def test_the_default_summary_is_the_name_and_arguments() -> None:
    tool = Tool("copy", "Copy").arg("src", Kind.TEXT).arg("n", Kind.INTEGER).risk(Risk.READ)
    step = started(tool).reply(call("copy", src="a.txt", n="2"))
    assert isinstance(step, Run)
    assert step.call.summary == 'copy(src="a.txt", n=2)'


def test_a_summary_function_gives_the_readable_line() -> None:
    tool = (
        Tool("copy", "Copy")
        .arg("src", Kind.TEXT)
        .arg("dst", Kind.TEXT)
        .summary(lambda a: f"Copy {a['src']} to {a['dst']}")
    )
    step = started(tool).reply(call("copy", src="a.txt", dst="b.txt"))
    assert isinstance(step, Run)
    assert step.call.summary == "Copy a.txt to b.txt"


def _broken_summary(args: dict[str, Any]) -> str:
    raise KeyError("missing")


@pytest.mark.parametrize(
    "summary", [_broken_summary, lambda _a: "   ", lambda _a: 42], ids=["raises", "blank", "int"]
)
def test_a_failing_summary_falls_back_to_the_default(summary: Any) -> None:
    tool = Tool("copy", "Copy").arg("src", Kind.TEXT).risk(Risk.READ).summary(summary)
    step = started(tool).reply(call("copy", src="a.txt"))
    assert isinstance(step, Run)
    assert step.call.summary == 'copy(src="a.txt")'


def test_a_long_argument_is_shortened_in_the_default_summary() -> None:
    tool = Tool("write", "Write").arg("text", Kind.TEXT)
    step = started(tool).reply(call("write", text="x" * 5_000))
    assert isinstance(step, Run)
    assert len(step.call.summary) < 200
    assert step.call.args["text"] == "x" * 5_000


# --- definitions refused ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["", "1abc", "has space", "dot.name", "é", "x" * 65, "a/b", "-dash"]
)
def test_a_malformed_tool_name_is_refused(name: str) -> None:
    with pytest.raises(DefinitionError):
        Tool(name, "A tool")


@pytest.mark.parametrize("name", ["delegate", "remember", "use_skill", "ask_user"])
def test_a_reserved_tool_name_is_refused(name: str) -> None:
    with pytest.raises(DefinitionError, match="reserved"):
        Tool(name, "A tool")


def test_two_tools_with_one_name_are_refused() -> None:
    with pytest.raises(DefinitionError, match="two tools"):
        Agent(Config(), [Tool("read", "One"), Tool("read", "Two")])


@pytest.mark.parametrize("name", ["", "9lives", "with space", "x" * 65])
def test_a_malformed_argument_name_is_refused(name: str) -> None:
    with pytest.raises(DefinitionError):
        Tool("read", "Read").arg(name, Kind.TEXT)


def test_a_duplicate_argument_is_refused() -> None:
    with pytest.raises(DefinitionError):
        Tool("read", "Read").arg("path", Kind.TEXT).opt("path", Kind.TEXT)


def test_a_non_tool_in_the_list_is_refused() -> None:
    with pytest.raises(DefinitionError):
        Agent(Config(), ["read"])  # type: ignore[list-item]


@pytest.mark.parametrize(
    "fields", [{"max_calls": 0}, {"max_batch": 0}, {"max_retries": -1}, {"history_chars": 10}]
)
def test_impossible_config_values_are_refused(fields: dict[str, Any]) -> None:
    with pytest.raises(DefinitionError):
        Config(**fields)


def test_definition_errors_are_agent_errors() -> None:
    assert issubclass(DefinitionError, AgentError)
    assert issubclass(ToolArgsError, AgentError)


def test_the_builder_returns_new_values() -> None:
    base = Tool("read", "Read")
    with_arg = base.arg("path", Kind.TEXT)
    assert base.args == ()
    assert [a.name for a in with_arg.args] == ["path"]
    assert base.risk(Risk.READ).risk_class is Risk.READ
    assert base.risk_class is Risk.WRITE


# --- the system text describes every tool ----------------------------------------------------


def test_the_system_text_describes_each_tool_and_argument() -> None:
    tool = (
        Tool("search_web", "Search the web for pages")
        .arg("query", Kind.TEXT, "what to look for")
        .opt("limit", Kind.INTEGER, "at most this many")
    )
    step = Agent(Config(), [tool]).start("Find it")
    assert isinstance(step, Ask)
    system = step.request.system
    assert "- search_web: Search the web for pages" in system
    assert "query (text): what to look for" in system
    assert "limit (integer, optional): at most this many" in system


# --- who asks: the policy ----------------------------------------------------------------------

ALL_RISKS = list(Risk)


@pytest.mark.parametrize(
    ("policy", "asks"),
    [
        (Policy.CAUTIOUS, {Risk.WRITE, Risk.OUTSIDE, Risk.MONEY}),
        (Policy.TRUSTING, {Risk.OUTSIDE, Risk.MONEY}),
        (Policy(ask=frozenset({Risk.CREATE})), {Risk.CREATE, Risk.MONEY}),
        (Policy(ask=frozenset()), {Risk.MONEY}),
    ],
    ids=["cautious", "trusting", "custom", "none-but-money"],
)
def test_call_ask_follows_the_policy_and_money_always_asks(policy: Policy, asks: set[Risk]) -> None:
    tools = [Tool(f"t_{r.value}", f"{r.value} tool").risk(r) for r in ALL_RISKS]
    agent = started(*tools, config=Config(require_plan=False, policy=policy, max_calls=20))
    asked: dict[Risk, bool] = {}
    for risk in ALL_RISKS:
        step = agent.reply(call(f"t_{risk.value}"))
        assert isinstance(step, Run)
        assert step.call.risk is risk
        asked[risk] = step.call.ask
        agent.result(step.call.id, ToolOutput.ok("fine"))
    assert {r for r, a in asked.items() if a} == asks
