"""Recipes: filling blanks, literal braces, hostile values, refusals, JSON and tools."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from agent_core.errors import AgentError, DefinitionError, RecipeError
from agent_core.recipes import Recipe, RecipeParam
from agent_core.text import clean
from agent_core.tools import Risk, Tool

SPEND = (
    Recipe("monthly-spend", "Total the spend for {month}; flag items over {limit}.")
    .param("month", "which month, in words")
    .param("limit", "the amount that needs a flag")
)


def recipe(template: str, *params: str) -> Recipe:
    made = Recipe("r", template)
    for name in params:
        made = made.param(name)
    return made


# --- filling ----------------------------------------------------------------------------


def test_fill_replaces_every_blank() -> None:
    filled = SPEND.fill({"month": "last month", "limit": "50,000"})
    assert filled == "Total the spend for last month; flag items over 50,000."


def test_a_blank_used_twice_takes_the_same_value() -> None:
    assert recipe("{a} and {a}", "a").fill({"a": "x"}) == "x and x"


@pytest.mark.parametrize(
    ("template", "values", "expected"),
    [
        ("{{literal}}", {}, "{literal}"),
        ("{{{a}}}", {"a": "x"}, "{x}"),
        ('JSON: {{"month": "{a}"}}', {"a": "May"}, 'JSON: {"month": "May"}'),
        ("}}{{", {}, "}{"),
        ("no blanks at all", {}, "no blanks at all"),
        ("", {}, ""),
        ("{a}{b}", {"a": "1", "b": "2"}, "12"),
        ("{spend-limit} {_x} {A9}", {"spend-limit": "1", "_x": "2", "A9": "3"}, "1 2 3"),
    ],
)
def test_doubled_braces_are_literal(template: str, values: dict[str, str], expected: str) -> None:
    assert recipe(template, *values).fill(values) == expected


@pytest.mark.parametrize(
    "value",
    [
        "{month}",
        "{limit}",
        "{{month}}",
        "{",
        "}",
        "{0}",
        "%s %(month)s $month ${month}",
        "\x00\n\r\t\u202e",
        "{month}" * 10_000,
        "",
    ],
)
def test_values_are_inserted_literally_and_never_read_for_blanks(value: str) -> None:
    filled = SPEND.fill({"month": value, "limit": "5"})
    assert filled == f"Total the spend for {value}; flag items over 5."


@pytest.mark.timeout(20)
def test_fill_is_linear_in_huge_values_and_templates() -> None:
    template = "{{" * 100_000 + "{a}" * 100_000 + "}}" * 100_000
    value = "{a}" * 10
    filled = recipe(template, "a").fill({"a": value})
    assert filled == "{" * 100_000 + value * 100_000 + "}" * 100_000
    huge = "{{a}" * 1_000_000
    assert recipe("[{a}]", "a").fill({"a": huge}) == f"[{huge}]"


def test_lone_surrogates_in_values_are_replaced() -> None:
    assert recipe("[{a}]", "a").fill({"a": "x\ud800y"}) == "[x\ufffdy]"


@given(
    st.dictionaries(st.from_regex(r"[a-z][a-z0-9_-]{0,10}", fullmatch=True), st.text(), max_size=5),
    st.text(alphabet=st.characters(blacklist_characters="{}")),
)
def test_any_values_are_inserted_literally(values: dict[str, str], glue: str) -> None:
    names = list(values)
    template = glue + glue.join("{" + n + "}" for n in names) + glue
    expected = glue + glue.join(values[n] for n in names) + glue
    assert recipe(template, *names).fill(values) == clean(expected)


@given(st.text())
def test_a_doubled_template_comes_back_as_it_was(text: str) -> None:
    template = text.replace("{", "{{").replace("}", "}}")
    assert recipe(template).fill({}) == clean(text)


# --- refusals when filling --------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"month": "May", "limit": "5", "mnth": "x"}, "'mnth'"),
        ({"month": "May", "limit": "5", "{month}": "x"}, "'{month}'"),
        ({"month": "May", "limit": "5", 3: "x"}, "3"),
        ({"month": "May"}, "'limit'"),
        ({}, "'month', 'limit'"),
        ({"month": "May", "limit": 5}, "'limit'"),
        ({"month": None, "limit": "5"}, "'month'"),
    ],
    ids=["unknown", "unknown-braced", "unknown-int-key", "missing", "all-missing", "int", "none"],
)
def test_fill_refuses_with_the_blank_named(values: Mapping[Any, Any], named: str) -> None:
    with pytest.raises(RecipeError, match=re.escape(named)):
        SPEND.fill(values)


def test_a_blank_never_declared_is_named() -> None:
    with pytest.raises(RecipeError, match=re.escape("'month'")):
        Recipe("r", "Spend for {month}").fill({})


def test_an_unknown_value_names_the_blanks_there_are() -> None:
    with pytest.raises(RecipeError, match=re.escape("its blanks are 'month', 'limit'")):
        SPEND.fill({"month": "May", "limit": "5", "extra": "x"})


def test_a_huge_number_of_unknown_values_gives_a_short_message() -> None:
    with pytest.raises(RecipeError) as caught:
        SPEND.fill({f"k{i}": "x" for i in range(100_000)} | {"month": "May", "limit": "5"})
    assert "and 99995 more" in str(caught.value)
    assert len(str(caught.value)) < 1_000


@pytest.mark.parametrize("values", [["month", "limit"], "month=May", None])
def test_fill_needs_a_mapping(values: Any) -> None:
    with pytest.raises(RecipeError, match="mapping"):
        SPEND.fill(values)


def test_recipe_error_is_bad_data_in_the_agent_tree() -> None:
    with pytest.raises(AgentError):
        SPEND.fill({})


# --- refusals when building -------------------------------------------------------------


@pytest.mark.parametrize(
    ("template", "where"),
    [
        ("Spend for {month", "character 10"),
        ("Spend for month}", "character 15"),
        ("{}", "character 0"),
        ("{ month }", "character 0"),
        ("{month name}", "character 0"),
        ("{9lives}", "character 0"),
        ("{{{month}}}}", "character 11"),
        ("ok {a} then }", "character 12"),
        ('{"json": 1}', "character 0"),
        ("{" + "a" * 65 + "}", "character 0"),
    ],
)
def test_a_lone_brace_is_refused_when_built(template: str, where: str) -> None:
    with pytest.raises(DefinitionError, match=where):
        Recipe("r", template)


@pytest.mark.timeout(20)
def test_an_unclosed_brace_in_a_huge_template_is_refused_quickly() -> None:
    with pytest.raises(DefinitionError, match="character 0"):
        Recipe("r", "{" + "a" * 1_000_000)


@pytest.mark.parametrize(
    ("build", "problem"),
    [
        (lambda: Recipe("", "t"), "recipe name"),
        (lambda: Recipe("has space", "t"), "recipe name"),
        (lambda: Recipe(7, "t"), "recipe name"),  # type: ignore[arg-type]
        (lambda: Recipe("r", None), "text template"),  # type: ignore[arg-type]
        (lambda: Recipe("r", b"bytes"), "text template"),  # type: ignore[arg-type]
        (lambda: Recipe("r"), "needs a name and a template"),
        (lambda: SPEND.param("month"), "already has a param 'month'"),
        (lambda: SPEND.param("bad name"), "recipe param name"),
        (lambda: SPEND.param("x", help=3), "text help"),  # type: ignore[arg-type]
        (lambda: SPEND.only_tools("read_ledger"), "not one text"),
        (lambda: SPEND.only_tools(["a", "a"]), "twice"),
        (lambda: SPEND.only_tools(["bad name"]), "tool name"),
    ],
)
def test_impossible_definitions_are_refused(build: Any, problem: str) -> None:
    with pytest.raises(DefinitionError, match=re.escape(problem)):
        build()


def test_builders_return_new_values() -> None:
    base = Recipe("r", "{a}")
    with_param = base.param("a", "help")
    assert base.params == ()
    assert with_param.params == (RecipeParam(name="a", help="help"),)
    assert base.only_tools(["x"]).tool_names == ("x",)
    assert base.tool_names is None


def test_blanks_are_listed_in_order_of_first_use() -> None:
    assert Recipe("r", "{b} {{c}} {a} {b} {c}").blanks() == ["b", "a", "c"]


def test_declared_params_need_not_all_be_used_but_all_need_values() -> None:
    unused = recipe("nothing here", "a")
    assert unused.fill({"a": "x"}) == "nothing here"
    with pytest.raises(RecipeError, match="'a'"):
        unused.fill({})


# --- plain data -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "made",
    [SPEND, SPEND.only_tools(["read_ledger"]), SPEND.only_tools([]), Recipe("r", "{{x}}")],
)
def test_json_round_trip(made: Recipe) -> None:
    back = Recipe.model_validate_json(made.model_dump_json())
    assert back == made
    assert back.tool_names == made.tool_names  # None (every tool) is not () (no tool)
    values = {p.name: "v" for p in made.params}
    assert back.fill(values) == made.fill(values)


def test_recipes_are_frozen() -> None:
    with pytest.raises(ValidationError):
        SPEND.name = "other"  # type: ignore[misc]


@pytest.mark.parametrize(
    "text",
    [
        '{"template": "t"}',
        '{"name": "r"}',
        '{"name": "bad name", "template": "t"}',
        '{"name": "r", "template": "{lone"}',
        '{"name": "r", "template": "t", "params": [{"help": "no name"}]}',
        '{"name": "r", "template": "t", "tool_names": "all"}',
    ],
)
def test_corrupt_json_is_a_validation_error(text: str) -> None:
    with pytest.raises(ValidationError):
        Recipe.model_validate_json(text)


# --- tools ------------------------------------------------------------------------------

READ = Tool("read_ledger", "Read the ledger").risk(Risk.READ)
MAIL = Tool("send_mail", "Send an email").risk(Risk.OUTSIDE)
NOTE = Tool("write_note", "Write a note")
ALL_TOOLS = [READ, MAIL, NOTE]


def test_every_tool_until_only_tools_is_called() -> None:
    assert SPEND.tools_for(ALL_TOOLS) == ALL_TOOLS


def test_only_tools_keeps_the_order_of_all_tools() -> None:
    limited = SPEND.only_tools(["write_note", "read_ledger"])
    assert limited.tools_for(ALL_TOOLS) == [READ, NOTE]


def test_only_tools_with_no_names_means_no_tools() -> None:
    assert SPEND.only_tools([]).tools_for(ALL_TOOLS) == []


def test_only_tools_called_again_replaces_the_list() -> None:
    assert SPEND.only_tools(["send_mail"]).only_tools(["write_note"]).tools_for(ALL_TOOLS) == [NOTE]


def test_a_tool_that_does_not_exist_is_named() -> None:
    limited = SPEND.only_tools(["read_ledger", "delete_everything"])
    with pytest.raises(DefinitionError, match=re.escape("'delete_everything'")):
        limited.tools_for(ALL_TOOLS)
