"""A turn that goes nowhere is told once, then stopped; model calls are capped per turn.

Played against a scripted model: the same call with the same result, failures
in a row, the agent's own turns (notes, questions) repeated, and turns that do
not count against `max_calls` bounded by `max_model_calls`.
"""

from __future__ import annotations

import pytest

from agent_core import (
    Agent,
    Ask,
    Config,
    DefinitionError,
    Done,
    Kind,
    Question,
    Risk,
    Run,
    Skill,
    Step,
    Stop,
    Summarize,
    Tool,
    ToolOutput,
    run,
)
from tests.support.scripted import Script, batch, call, final, finish_batch, prompt_of

READ = Tool("read_file", "Read a text file").arg("path", Kind.TEXT).risk(Risk.READ)
FETCH = Tool("fetch", "Fetch a web page").arg("url", Kind.TEXT).risk(Risk.READ)
TOOLS = [READ, FETCH]
TASK = "Find the March figures"
REPEAT_WARNING = "You have made the same call"
FAILURE_WARNING = "calls failed. Doing more of the same will not help"


def agent_with(**fields: object) -> Agent:
    return Agent(Config(require_plan=False, **fields), TOOLS)  # type: ignore[arg-type]


def play(agent: Agent, reply: str, output: ToolOutput) -> Step:
    """The model replies `reply`; every call of the batch it asks for gets `output`."""
    step = agent.reply(reply)
    if isinstance(step, Run):
        return finish_batch(agent, step, lambda _c: output)
    return step


def done(step: Step) -> Done:
    assert isinstance(step, Done), f"expected Done, got {step!r}"
    return step


def notices(step: Step) -> int:
    return prompt_of(step).count("Notice: ")


# --- the same call, the same result ---------------------------------------------------------


def test_the_same_failing_call_is_told_once_then_stopped_at_twice_the_limit() -> None:
    agent = agent_with()
    agent.start(TASK)
    missing = ToolOutput.error("no such file")
    step: Step = agent.resume()
    for made in range(1, 6):
        step = play(agent, call("read_file", path="march.csv"), missing)
        assert isinstance(step, Ask)
        assert notices(step) == (0 if made < 3 else 1), f"after {made} calls"
    prompt = prompt_of(step)
    assert (
        "Notice: You have made the same call 3 times and got the same result each time:"
        ' read_file(path="march.csv"). Doing it again will not change the result.'
    ) in prompt
    outcome = done(play(agent, call("read_file", path="march.csv"), missing)).outcome
    assert outcome.stop is Stop.NO_PROGRESS
    assert outcome.calls == 6
    assert outcome.summary == (
        'No progress: the same call got the same result 6 times: read_file(path="march.csv").'
    )


def test_the_warning_is_traced_where_it_was_given() -> None:
    agent = agent_with()
    agent.start(TASK)
    for _ in range(3):
        play(agent, call("read_file", path="a"), ToolOutput.ok("same"))
    kinds = [e.kind for e in agent.trace()]
    assert kinds.count("warning") == 1
    assert kinds[-1] == "warning"
    assert REPEAT_WARNING in agent.trace()[-1].text


def test_identical_successful_calls_count_too() -> None:
    agent = agent_with(max_calls=30)
    agent.start(TASK)
    for _ in range(5):
        step = play(agent, call("fetch", url="https://x"), ToolOutput.ok("status: pending"))
    assert isinstance(step, Ask)
    assert REPEAT_WARNING in prompt_of(step)
    assert done(play(agent, call("fetch", url="https://x"), ToolOutput.ok("status: pending")))


def test_the_same_call_with_a_new_result_each_time_is_progress() -> None:
    agent = agent_with(max_calls=10)
    agent.start(TASK)
    for n in range(10):
        step = play(agent, call("fetch", url="https://x"), ToolOutput.ok(f"{n} rows so far"))
        assert isinstance(step, Ask)
    assert "Notice:" not in prompt_of(step)
    assert "No tool calls are left" in prompt_of(step)


def test_other_arguments_are_another_call() -> None:
    agent = agent_with(max_calls=10)
    agent.start(TASK)
    for n in range(8):
        step = play(agent, call("read_file", path=f"part-{n}"), ToolOutput.ok("empty"))
    assert isinstance(step, Ask)
    assert "Notice:" not in prompt_of(step)


def test_a_cycle_of_two_calls_is_caught() -> None:
    agent = agent_with(max_calls=20)
    agent.start(TASK)
    replies = [call("read_file", path="a"), call("read_file", path="b")] * 6
    steps = [play(agent, reply, ToolOutput.ok("same")) for reply in replies]
    assert [notices(s) for s in steps[:4]] == [0, 0, 0, 0]
    assert REPEAT_WARNING in prompt_of(steps[4])  # the third read of a
    assert all(isinstance(s, Ask) for s in steps[:10])
    assert done(steps[10]).outcome.stop is Stop.NO_PROGRESS  # the sixth read of a


def test_identical_calls_in_one_batch_count_each() -> None:
    agent = agent_with(max_batch=3)
    agent.start(TASK)
    same = batch(*[("read_file", {"path": "a"})] * 3)
    step = play(agent, same, ToolOutput.ok("same"))
    assert REPEAT_WARNING in prompt_of(step)
    assert done(play(agent, same, ToolOutput.ok("same"))).outcome.calls == 6


@pytest.mark.parametrize("limit", [2, 4])
def test_max_repeats_sets_both_thresholds(limit: int) -> None:
    agent = agent_with(max_repeats=limit, max_calls=50)
    agent.start(TASK)
    steps = [play(agent, call("read_file", path="a"), ToolOutput.ok("x")) for _ in range(2 * limit)]
    warned = [REPEAT_WARNING in prompt_of(s) for s in steps[:-1]]
    assert warned.index(True) == limit - 1
    assert done(steps[-1]).outcome.stop is Stop.NO_PROGRESS


# --- failures in a row ------------------------------------------------------------------------


def test_failures_in_a_row_are_told_once_then_stopped() -> None:
    agent = agent_with(max_calls=20)
    agent.start(TASK)
    steps = [
        play(agent, call("read_file", path=f"try-{n}"), ToolOutput.error(f"denied {n}"))
        for n in range(6)
    ]
    assert [FAILURE_WARNING in prompt_of(s) for s in steps[:5]] == [
        False,
        False,
        True,
        True,
        True,
    ]
    assert "Notice: Your last 3 calls failed." in prompt_of(steps[2])
    outcome = done(steps[5]).outcome
    assert outcome.stop is Stop.NO_PROGRESS
    assert outcome.summary == "No progress: 6 calls failed in a row."


def test_a_call_that_works_ends_the_run_of_failures() -> None:
    agent = agent_with(max_calls=20)
    agent.start(TASK)
    for n in range(12):
        output = ToolOutput.ok("found") if n % 3 == 2 else ToolOutput.error(f"denied {n}")
        step = play(agent, call("read_file", path=f"try-{n}"), output)
        assert isinstance(step, Ask)
    assert "Notice:" not in prompt_of(step)


@pytest.mark.parametrize(
    "output", [ToolOutput.declined("no"), ToolOutput.unknown("worker died")], ids=str
)
def test_only_errors_are_failures(output: ToolOutput) -> None:
    agent = agent_with(max_calls=20)
    agent.start(TASK)
    for n in range(8):
        step = play(agent, call("read_file", path=f"p{n}"), output)
    assert isinstance(step, Ask)
    assert FAILURE_WARNING not in prompt_of(step)


def test_the_model_is_told_only_once_a_turn() -> None:
    agent = agent_with(max_calls=30)
    agent.start(TASK)
    for n in range(3):
        play(agent, call("read_file", path=f"f{n}"), ToolOutput.error("denied"))
    play(agent, call("fetch", url="u0"), ToolOutput.ok("fine"))
    for _ in range(3):
        step = play(agent, call("fetch", url="same"), ToolOutput.ok("same"))
    assert isinstance(step, Ask)
    assert notices(step) == 1
    assert FAILURE_WARNING in prompt_of(step)
    assert [e.kind for e in agent.trace()].count("warning") == 1


# --- the agent's own turns --------------------------------------------------------------------


def test_the_same_note_again_and_again_stops_the_run() -> None:
    agent = agent_with().with_memory([])
    agent.start(TASK)
    steps = [agent.reply(call("remember", note="March is in q1.csv")) for _ in range(6)]
    assert REPEAT_WARNING in prompt_of(steps[2])
    assert "remember('March is in q1.csv')" in prompt_of(steps[2])
    outcome = done(steps[5]).outcome
    assert outcome.stop is Stop.NO_PROGRESS
    assert outcome.calls == 0


def test_the_same_question_answered_the_same_way_stops_the_run() -> None:
    agent = agent_with().with_questions()
    agent.start(TASK)
    step: Step = agent.resume()
    for _ in range(6):
        question = agent.reply('{"ask_user": "Which month?"}')
        assert question == Question(text="Which month?")
        step = agent.answer("March")
    assert done(step).outcome.stop is Stop.NO_PROGRESS


def test_reading_the_same_skill_file_again_and_again_stops_the_run() -> None:
    pdf = Skill(
        name="pdf",
        description="Fill PDF forms.",
        body="# PDF",
        folder="/skills/pdf",
        resources=("FORMS.md",),
    )
    agent = agent_with().with_skills([pdf])
    agent.start(TASK)
    steps = []
    for _ in range(6):
        step = agent.reply(call("read_skill_file", skill="pdf", path="FORMS.md"))
        assert isinstance(step, Run)
        steps.append(agent.result(step.call.id, ToolOutput.ok("the forms")))
    assert REPEAT_WARNING in prompt_of(steps[2])
    outcome = done(steps[5]).outcome
    assert outcome.stop is Stop.NO_PROGRESS
    assert outcome.calls == 0  # skill reads are not counted against max_calls


def test_own_turns_do_not_break_a_run_of_failures() -> None:
    agent = agent_with(max_calls=20).with_memory([])
    agent.start(TASK)
    play(agent, call("read_file", path="a"), ToolOutput.error("denied"))
    agent.reply(call("remember", note="a is locked"))
    play(agent, call("read_file", path="b"), ToolOutput.error("denied"))
    step = play(agent, call("read_file", path="c"), ToolOutput.error("denied"))
    assert "Notice: Your last 3 calls failed." in prompt_of(step)


def test_run_stops_a_model_calling_the_same_failing_tool_long_before_max_calls() -> None:
    script = Script(
        [call("read_file", path="march.csv")] * 12,
        tools={"read_file": lambda _a: ToolOutput.error("permission denied")},
    )
    outcome = run(agent_with(max_calls=12), script, TASK)
    assert outcome.stop is Stop.NO_PROGRESS
    assert len(script.calls) == 6
    assert REPEAT_WARNING in script.prompts[3]


# --- the model-call cap -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "allowed"),
    [({}, 44), ({"max_calls": 5}, 30), ({"max_model_calls": 7}, 7), ({"max_calls": 1}, 22)],
)
def test_the_model_call_allowance_defaults_from_max_calls(
    fields: dict[str, int], allowed: int
) -> None:
    assert Config(**fields).allowed_model_calls == allowed  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "fields", [{"max_repeats": 1}, {"max_repeats": 0}, {"max_model_calls": 0}], ids=str
)
def test_impossible_loop_limits_are_refused(fields: dict[str, int]) -> None:
    with pytest.raises(DefinitionError):
        Config(**fields)  # type: ignore[arg-type]


def test_five_hundred_new_notes_end_at_the_model_call_limit() -> None:
    script = Script([call("remember", note=f"fact {n}") for n in range(500)])
    outcome = run(agent_with().with_memory([]), script, TASK)
    assert outcome.stop is Stop.MODEL_CALL_LIMIT
    assert len(script.requests) == 44
    assert outcome.summary == "The limit of 44 model calls was reached before the task was done."


def test_unusable_replies_between_usable_ones_end_at_the_limit() -> None:
    replies: list[str | BaseException] = []
    for n in range(50):
        replies += ["no json here", call("read_file", path=f"p{n}")]
    script = Script(replies)
    outcome = run(agent_with(max_calls=100, max_model_calls=15), script, TASK)
    assert outcome.stop is Stop.MODEL_CALL_LIMIT
    assert len(script.requests) == 15


def test_the_last_model_call_asks_for_the_final_answer_and_takes_it() -> None:
    agent = Agent(Config(max_model_calls=4), TOOLS)
    agent.start(TASK)
    agent.reply('{"plan": ["a", "b", "c", "d"]}')
    agent.approve_plan(True)
    step = play(agent, call("read_file", path="a"), ToolOutput.ok("x"))
    assert "This is your last reply" not in prompt_of(step)
    step = play(agent, call("read_file", path="b"), ToolOutput.ok("y"))
    assert "This is your last reply: no model calls are left after it." in prompt_of(step)
    outcome = done(agent.reply(final("Half done: a and b read"))).outcome
    assert outcome.stop is Stop.DONE  # not sent back as too early: no call is left to redo it
    assert outcome.summary == "Half done: a and b read"


def test_a_call_asked_for_on_the_last_model_call_never_runs() -> None:
    agent = agent_with(max_model_calls=2)
    agent.start(TASK)
    play(agent, call("read_file", path="a"), ToolOutput.ok("x"))
    agent.take_trace()
    outcome = done(agent.reply(call("read_file", path="b"))).outcome
    assert outcome.stop is Stop.MODEL_CALL_LIMIT
    assert outcome.calls == 1
    assert [e.kind for e in agent.take_trace()] == ["stop"]


@pytest.mark.parametrize(
    "last",
    [
        lambda a: a.fail("timeout"),
        lambda a: a.reply("garbage"),
        lambda a: a.reply('{"plan": ["x"]}'),
    ],
    ids=["failure", "unusable", "plan"],
)
def test_every_answer_from_the_model_counts(last: object) -> None:
    agent = agent_with(max_model_calls=2, max_retries=5).with_questions()
    agent.start(TASK)
    assert isinstance(agent.reply('{"ask_user": "Which month?"}'), Question)
    agent.answer("March")
    outcome = done(last(agent)).outcome  # type: ignore[operator]
    assert outcome.stop is Stop.MODEL_CALL_LIMIT


def test_no_summary_is_asked_for_with_one_model_call_left() -> None:
    config = Config(require_plan=False, summarize=True, history_chars=1_000, max_model_calls=3)
    agent = Agent(config, TOOLS)
    agent.start(TASK)
    step = play(agent, call("read_file", path="a"), ToolOutput.ok("A" * 600))
    assert isinstance(step, Ask)
    step = play(agent, call("read_file", path="b"), ToolOutput.ok("B" * 600))
    assert isinstance(step, Ask)  # history is over history_chars, but this is the last call
    assert "This is your last reply" in prompt_of(step)


def test_summaries_count_as_model_calls() -> None:
    config = Config(require_plan=False, summarize=True, history_chars=1_000, max_model_calls=4)
    agent = Agent(config, TOOLS)
    agent.start(TASK)
    play(agent, call("read_file", path="a"), ToolOutput.ok("A" * 600))
    step = play(agent, call("read_file", path="b"), ToolOutput.ok("B" * 600))
    assert isinstance(step, Summarize)
    step = agent.reply("Read a and b.")
    assert "This is your last reply" in prompt_of(step)


def test_tool_calls_and_model_calls_are_separate_limits() -> None:
    agent = agent_with(max_calls=1, max_model_calls=10)
    agent.start(TASK)
    play(agent, call("read_file", path="a"), ToolOutput.ok("x"))
    assert done(agent.reply(call("read_file", path="b"))).outcome.stop is Stop.CALL_LIMIT


def test_new_stops_read_as_people_expect() -> None:
    assert Stop.NO_PROGRESS.label() == "no progress"
    assert Stop.MODEL_CALL_LIMIT.label() == "model call limit reached"
    assert Stop("no_progress") is Stop.NO_PROGRESS
    assert Stop("model_call_limit") is Stop.MODEL_CALL_LIMIT
