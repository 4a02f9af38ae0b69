"""The reply parser under attack: arbitrary text never escapes `reply()`, hostile text is linear."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from agent_core import Agent, Ask, Config, Done, Kind, Risk, Run, Step, Tool, ToolOutput
from agent_core.reply import ends_inside_object
from tests.support.scripted import prompt_of

TOOLS = [
    Tool("read_file", "Read").arg("path", Kind.TEXT).risk(Risk.READ),
    Tool("store", "Store").arg("items", Kind.LIST).opt("meta", Kind.OBJECT).risk(Risk.READ),
]
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SLOW_BOUND = 5.0  # seconds; each input below takes well under 0.5 s when parsing is linear


NO_PLAN = Config(require_plan=False)
BATCH = Config(require_plan=False, max_batch=3)


def fresh(config: Config = NO_PLAN) -> Agent:
    agent = Agent(config, TOOLS)
    agent.start("Parse whatever comes")
    return agent


def assert_healthy(agent: Agent, step: Step, config: Config = NO_PLAN) -> None:
    """The step is a defined step and the snapshot encodes and restores."""
    assert isinstance(step, Ask | Run | Done)
    saved = agent.snapshot()
    saved.encode("utf-8")  # lone surrogates would fail here
    restored = Agent.restore(config, TOOLS, saved)
    assert restored.resume() == step


# --- arbitrary text --------------------------------------------------------------------------

JSON_SCALARS = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text()
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
PROTOCOLISH = st.fixed_dictionaries(
    {},
    optional={
        "plan": JSON_VALUES,
        "tool": st.sampled_from(["read_file", "store", "nope", ""]) | JSON_VALUES,
        "tools": st.lists(
            st.fixed_dictionaries(
                {"tool": st.sampled_from(["read_file", "store"]), "args": JSON_VALUES}
            ),
            max_size=3,
        )
        | JSON_VALUES,
        "args": JSON_VALUES,
        "final": st.text() | JSON_VALUES,
        "ask_user": JSON_VALUES,
    },
)
NOISE = st.sampled_from(
    ["", "```json\n", "```", "\n", "<think>", "</think>", "{", "}", "[", '"', "\\", "prose "]
)


@FUZZ
@given(text=st.text())
def test_arbitrary_text_never_raises(text: str) -> None:
    agent = fresh()
    assert_healthy(agent, agent.reply(text))


@FUZZ
@given(
    obj=PROTOCOLISH,
    before=st.lists(NOISE | st.text(max_size=5), max_size=4),
    after=st.lists(NOISE, max_size=4),
)
def test_protocol_shaped_objects_in_noise_never_raise(
    obj: dict[str, Any], before: list[str], after: list[str]
) -> None:
    agent = fresh(BATCH)
    text = "".join(before) + json.dumps(obj) + "".join(after)
    assert_healthy(agent, agent.reply(text), BATCH)


@FUZZ
@given(
    text=st.text(),
    prose=st.text(alphabet=st.characters(blacklist_characters="{<")),
    fenced=st.booleans(),
)
def test_a_final_in_prose_is_found_and_kept_exactly(text: str, prose: str, fenced: bool) -> None:
    body = json.dumps({"final": text})
    if fenced:
        body = f"```json\n{body}\n```"
    agent = fresh()
    step = agent.reply(f"{prose}\n{body}\n{prose}")
    assert isinstance(step, Done)
    expected = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    assert step.outcome.summary == expected
    assert_healthy(agent, step)


@pytest.mark.parametrize(
    ("reply", "final"),
    [
        ('{"final": "<think>"}', "<think>"),  # a final may quote the tags
        ('{"final": "wrap it in </think>"}', "wrap it in </think>"),
        ('<think>maybe {"final": "no"}</think>{"final": "yes"}', "yes"),  # a thought is no reply
        ('<think>a</think>{"final": "quote <think> here"}', "quote <think> here"),
        ('dropped opening {"final": "no"} </think>{"final": "yes"}', "yes"),
        ('{"final": "a </think> b"} trailing', "a </think> b"),
    ],
)
def test_thinking_tags_count_outside_the_reply_object_only(reply: str, final: str) -> None:
    step = fresh().reply(reply)
    assert isinstance(step, Done)
    assert step.outcome.summary == final


def test_an_unclosed_think_hides_an_object_inside_it() -> None:
    step = fresh().reply('<think>I could say {"final": "too soon"}')
    assert not isinstance(step, Done)


@FUZZ
@given(blob=st.binary(max_size=200))
def test_bytes_decoded_any_way_never_raise(blob: bytes) -> None:
    agent = fresh()
    text = blob.decode("utf-8", "surrogateescape")  # lone surrogates, as a lax reader gives them
    assert_healthy(agent, agent.reply(text))


# --- hostile inputs, each a stated reason in linear time ---------------------------------------

HOSTILE: dict[str, tuple[str, str]] = {
    "100k open brackets": ("[" * 100_000, "no complete JSON object"),
    "100k nested objects": ('{"a":' * 100_000, "no complete JSON object"),
    "100k closed nesting": ('{"a":' * 100_000 + "1" + "}" * 100_000, "no complete JSON object"),
    "deep list in a final": (
        '{"final": "x", "d": ' + "[" * 100_000 + "]" * 100_000 + "}",
        "no complete JSON object",
    ),
    "unclosed fence x20000": ("```json\n{" * 20_000, "no complete JSON object"),
    "unclosed fences and quotes": ('```json\n{"' * 20_000, "no complete JSON object"),
    "1 MB of prose": ("lorem ipsum " * 87_382, "no complete JSON object"),
    "1 MB unterminated string": ('{"final": "' + "x" * 1_000_000, "no complete JSON object"),
    "many candidate objects": ('{"a": 1, ' * 100_000, "no complete JSON object"),
    "think openers": ("<think>" * 100_000, "no complete JSON object"),
    "think pairs": ("</think><think>" * 50_000, "no complete JSON object"),
    "spaced braces": ("{ " * 300_000, "no complete JSON object"),
    "5000-digit integer": (
        '{"tool": "read_file", "args": {"path": ' + "9" * 5_000 + "}}",
        "a number has 5000 digits",
    ),
    "5000-digit fraction": ('{"final": "x", "n": 0.' + "1" * 5_000 + "}", "digits"),
    "NaN": ('{"final": "x", "n": NaN}', "NaN is not a JSON number"),
    "Infinity": ('{"final": "x", "n": Infinity}', "Infinity is not a JSON number"),
    "-Infinity": ('{"final": "x", "n": -Infinity}', "-Infinity is not a JSON number"),
    "duplicate keys": ('{"final": "a", "final": "b"}', "the key 'final' appears twice"),
    "duplicate nested keys": (
        '{"tool": "store", "args": {"items": [], "items": [1]}}',
        "appears twice",
    ),
}


@pytest.mark.parametrize(("text", "reason"), HOSTILE.values(), ids=HOSTILE.keys())
def test_hostile_input_gives_a_stated_reason_quickly(text: str, reason: str) -> None:
    agent = fresh()
    began = time.perf_counter()
    step = agent.reply(text)
    assert time.perf_counter() - began < SLOW_BOUND
    assert isinstance(step, Ask)
    assert reason in prompt_of(step)
    assert_healthy(agent, step)


def test_a_million_characters_of_mixed_garbage_is_linear() -> None:
    chunk = '```json\n{"tool": [{"a": "\\"' + "[{" * 20 + "</think>"
    text = (chunk * (1_000_000 // len(chunk)))[:1_000_000]
    agent = fresh()
    began = time.perf_counter()
    step = agent.reply(text)
    assert time.perf_counter() - began < SLOW_BOUND
    assert_healthy(agent, step)


def test_a_reply_of_one_megabyte_with_a_valid_object_at_the_end() -> None:
    text = "x" * 1_000_000 + '{"final": "found it"}'
    agent = fresh()
    began = time.perf_counter()
    step = agent.reply(text)
    assert time.perf_counter() - began < SLOW_BOUND
    assert isinstance(step, Done)
    assert step.outcome.summary == "found it"


# --- lone surrogates ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reply", "summary"),
    [
        ('{"final": "a\ud800b"}', "a\ufffdb"),
        ('{"final": "a\\ud800b"}', "a\ufffdb"),
        ('{"final": "\\udfff"}', "\ufffd"),
        ('{"final": "pair \\ud83d\\ude00"}', "pair \U0001f600"),
        ('{"final": "ok", "\\ud800key": ["\\udc00", {"\\udbff": "\\ud800"}]}', "ok"),
    ],
)
def test_lone_surrogates_are_replaced_and_the_snapshot_encodes(reply: str, summary: str) -> None:
    agent = fresh()
    step = agent.reply(reply)
    assert isinstance(step, Done)
    assert step.outcome.summary == summary
    json.dumps(step.outcome.data, ensure_ascii=False).encode("utf-8")
    assert_healthy(agent, step)


def test_lone_surrogates_in_arguments_are_replaced() -> None:
    agent = fresh()
    step = agent.reply('{"tool": "read_file", "args": {"path": "a\\udc80.txt"}}')
    assert isinstance(step, Run)
    assert step.call.args == {"path": "a\ufffd.txt"}
    assert_healthy(agent, step)


def test_a_surrogate_in_a_reason_still_encodes() -> None:
    agent = fresh()
    step = agent.reply('{"tool": "\ud800nope", "args": {}}')
    assert isinstance(step, Ask)
    assert "there is no tool named" in prompt_of(step)
    assert_healthy(agent, step)


# --- what the parser accepts, the snapshot must hold --------------------------------------------


@pytest.mark.parametrize("depth", [50, 150, 200, 300, 600])
def test_deeply_nested_data_in_a_final_survives_the_snapshot(depth: int) -> None:
    # pydantic cannot save and restore data nested a few hundred levels deep, so
    # the parser refuses deep nesting with a stated reason: whatever it accepts
    # must round-trip through the snapshot.
    agent = fresh()
    step = agent.reply('{"final": "x", "d": ' + "[" * depth + "]" * depth + "}")
    assert isinstance(step, Ask | Done)
    assert_healthy(agent, step)


@pytest.mark.parametrize("depth", [150, 200, 300])
def test_deeply_nested_arguments_survive_the_snapshot(depth: int) -> None:
    # The same, through a LIST argument that enters the batch and history.
    agent = fresh()
    step = agent.reply('{"tool": "store", "args": {"items": ' + "[" * depth + "]" * depth + "}}")
    assert isinstance(step, Ask | Run)
    assert_healthy(agent, step)


def test_the_retry_reason_does_not_echo_a_huge_reply() -> None:
    # A retry reason quotes the model's text; a 1 MB tool name or key must not
    # put 1 MB into every later prompt and the snapshot.
    for reply in (
        '{"tool": "' + "n" * 1_000_000 + '", "args": 5}',
        '{"' + "k" * 1_000_000 + '": 1, "' + "k" * 1_000_000 + '": 2}',
    ):
        agent = fresh()
        step = agent.reply(reply)
        assert isinstance(step, Ask)
        assert len(prompt_of(step)) < 10_000
        assert len(agent.snapshot()) < 30_000


# --- every text that enters the agent -----------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(texts=st.lists(st.text(), min_size=7, max_size=7))
def test_any_text_from_outside_leaves_a_snapshot_that_encodes(texts: list[str]) -> None:
    task, context, output, error, answer, problem, reason = texts
    config = Config(require_plan=False)
    agent = Agent(config, TOOLS).with_questions().with_memory([answer, task])
    agent.start(task, context)
    step = agent.reply(json.dumps({"tool": "read_file", "args": {"path": output}}))
    assert isinstance(step, Run)
    agent.result(step.call.id, ToolOutput.ok(output))
    agent.fail(error)
    agent.reply(json.dumps({"ask_user": f"{answer}?"}))
    agent.answer(answer)
    agent.reply(json.dumps({"final": output}))
    agent.reject_final(problem)
    step = agent.cancel(reason)
    saved = agent.snapshot()
    saved.encode("utf-8")
    restored = Agent.restore(config, TOOLS, saved)
    assert restored.resume() == step
    assert restored.snapshot() == saved


@pytest.mark.parametrize(
    ("text", "cut"),
    [
        ('{"tool": "sea', True),
        ('Calling it now: {"final": "x"', True),
        ('{"final": "a \\" quote and a } brace', True),  # inside a string: still open
        ('{"tools": [{"tool": "a", "args": {}}', True),
        ('{"final": "done"}', False),
        ("plain prose", False),
        ("{not an object at all", False),  # no `{"` opens an object here
        ('{"final": "a", "data": {"k": "{}', True),  # braces inside the cut string
        ('{"a": 1} {"b"', True),  # the whole object is no reply; the next is cut
        ('{"final": "done"} {"b"', False),  # a usable reply came first: the rest is chatter
        ('<think>{"plan"</think>no object here', False),  # thinking is not the reply
        # A `</think>` inside the cut object's string is text, not a dropped opening tag:
        ('{"final": "</think>', True),
        ('{"final": "use </think> to close', True),
        ('thought it over</think>{"final": "x', True),  # the tag closes thinking here
        ("thought it over</think>no object here", False),
    ],
)
def test_a_reply_that_ends_inside_its_object_is_told_from_one_the_model_got_wrong(
    text: str, cut: bool
) -> None:
    assert ends_inside_object(text) is cut


@given(st.text(max_size=300))
@example("</think>")  # (found by this test in CI: the tag was read as a dropped opening)
@FUZZ
def test_any_prefix_of_a_whole_reply_ends_inside_its_object(tail: str) -> None:
    whole = json.dumps({"final": tail, "data": {"k": [1, "}"]}})
    assert not ends_inside_object(whole)
    for end in range(1, len(whole) - 1):
        assert ends_inside_object(whole[:end]), whole[:end]


def test_finding_a_cut_object_is_linear() -> None:
    hostile = '{"a": ' * 20_000 + "[" * 20_000 + '"open'
    started = time.perf_counter()
    assert ends_inside_object(hostile)
    assert ends_inside_object('{"x": "' + "} " * 30_000)
    assert ends_inside_object('{"' * 30_000)
    assert not ends_inside_object("{ " * 30_000 + "text")
    assert time.perf_counter() - started < SLOW_BOUND
