"""Steering a working agent, going on with a finished one, and replies cut by the length limit.

`tell` (a person's message for the next request), `follow_up` (a new turn
with the history so far) and `reply(text, truncated=True)` (ask for the rest,
join the parts) played against a scripted model.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from agent_core import (
    Agent,
    Ask,
    Config,
    Done,
    Kind,
    Plan,
    Question,
    Risk,
    Run,
    Step,
    Stop,
    Summarize,
    Tool,
    ToolOutput,
    UsageError,
)
from tests.support.scripted import begin, call, final, finish_batch, plan, prompt_of

READ = Tool("read_file", "Read a text file").arg("path", Kind.TEXT).risk(Risk.READ)
WRITE = (
    Tool("write_file", "Write a text file")
    .arg("path", Kind.TEXT)
    .arg("text", Kind.TEXT)
    .risk(Risk.WRITE)
)
TOOLS = [READ, WRITE]
TASK = "Sum the March figures in figures.csv"
NO_PLAN = Config(require_plan=False)
SO_FAR = "--- your reply so far ---"
CUT_HERE = "--- cut off here ---"


def agent_with(config: Config = NO_PLAN) -> Agent:
    return Agent(config, TOOLS)


def done(step: Step) -> Done:
    assert isinstance(step, Done), f"expected Done, got {step!r}"
    return step


def section_order(prompt: str, *markers: str) -> list[int]:
    return [prompt.index(m) for m in markers]


# --- tell: a person's message, seen at the next model request ---------------------------------


def test_a_message_shows_after_the_history_marked_as_from_the_person() -> None:
    agent = agent_with()
    agent.start(TASK)
    finish_batch(agent, agent.reply(call("read_file", path="figures.csv")))
    before = len(agent.trace())
    step = agent.tell("Use the March figures instead")
    prompt = prompt_of(step)
    assert "A message from the person, sent while you worked:\nUse the March figures instead" in (
        prompt
    )
    order = section_order(prompt, "What happened so far:", "A message from the person", "Reply")
    assert order == sorted(order)
    assert step == agent.resume()
    assert len(agent.trace()) == before  # the request due is the same one: nothing to trace


def test_a_message_moves_into_history_once_the_model_replied() -> None:
    agent = agent_with()
    agent.start(TASK)
    agent.tell("Use the March figures")
    step = finish_batch(agent, agent.reply(call("read_file", path="march.csv")))
    prompt = prompt_of(step)
    assert "A message from the person" not in prompt
    assert prompt.count("Use the March figures") == 1
    assert "The person told you: Use the March figures" in prompt
    told = prompt.index("The person told you:")
    assert told < prompt.index("[call-1] read_file")
    assert [e.kind for e in agent.trace()][1:3] == ["message", "call"]


def test_messages_accumulate_oldest_first_and_stay_bounded() -> None:
    agent = agent_with()
    agent.start(TASK)
    agent.tell("first")
    step = agent.tell("second")
    assert "Messages from the person, sent while you worked (oldest first):\n- first\n- second" in (
        prompt_of(step)
    )
    for n in range(12):
        step = agent.tell(f"msg {n:02d} " + "x" * (5_000 if n == 11 else 0))
    prompt = prompt_of(step)
    assert "- first" not in prompt
    assert "- msg 01" not in prompt
    assert "- msg 02" in prompt
    newest = prompt[prompt.index("- msg 11") :].split("\n", 1)[0]
    assert len(newest) < 2_100
    assert "more characters]" in prompt


@pytest.mark.parametrize("text", ["", "   \n", "\t"])
def test_a_blank_message_changes_nothing(text: str) -> None:
    agent = agent_with()
    agent.start(TASK)
    before = agent.snapshot()
    assert agent.tell(text) == agent.resume()
    assert agent.snapshot() == before


def test_a_message_while_a_batch_runs_waits_for_the_next_request() -> None:
    agent = agent_with(Config(require_plan=False, max_batch=2))
    agent.start(TASK)
    step = agent.reply(
        '{"tools": [{"tool": "read_file", "args": {"path": "a"}},'
        ' {"tool": "read_file", "args": {"path": "b"}}]}'
    )
    assert isinstance(step, Run)
    assert agent.tell("Skip file b") == step
    assert agent.queued()[0].id == "call-2"
    step = finish_batch(agent, step)
    assert "A message from the person, sent while you worked:\nSkip file b" in prompt_of(step)


def test_a_message_while_a_question_waits_keeps_the_question() -> None:
    agent = Agent(NO_PLAN, TOOLS).with_questions()
    agent.start(TASK)
    question = agent.reply('{"ask_user": "Which month?"}')
    assert agent.tell("Also check April") == question == Question(text="Which month?")
    step = agent.answer("March")
    prompt = prompt_of(step)
    assert "they answered: March" in prompt
    assert "A message from the person, sent while you worked:\nAlso check April" in prompt


def test_a_message_while_the_plan_is_reviewed_keeps_the_plan() -> None:
    agent = agent_with(Config())
    agent.start(TASK)
    review = agent.reply(plan("Read", "Sum"))
    assert isinstance(review, Plan)
    assert agent.tell("Round to cents") == review
    assert "Round to cents" in prompt_of(agent.approve_plan(True))


def test_a_message_is_not_shown_to_a_summary_and_waits_for_the_ask_after_it() -> None:
    config = Config(require_plan=False, summarize=True, history_chars=1_000)
    agent = agent_with(config)
    agent.start(TASK)
    finish_batch(
        agent, agent.reply(call("read_file", path="a")), lambda _c: ToolOutput.ok("A" * 600)
    )
    step = finish_batch(
        agent, agent.reply(call("read_file", path="b")), lambda _c: ToolOutput.ok("B" * 600)
    )
    assert isinstance(step, Summarize)
    assert agent.tell("Only March") == step
    assert "Only March" not in prompt_of(agent.resume())
    step = agent.reply("Read a and b.")
    assert "A message from the person, sent while you worked:\nOnly March" in prompt_of(step)


def test_a_failed_model_call_keeps_the_message_waiting() -> None:
    agent = agent_with()
    agent.start(TASK)
    agent.tell("Use March")
    step = agent.fail("timeout")
    assert "A message from the person, sent while you worked:\nUse March" in prompt_of(step)
    assert "The person told you" not in prompt_of(step)


def test_a_message_to_a_finished_agent_changes_nothing() -> None:
    agent = agent_with()
    agent.start(TASK)
    finished = agent.reply(final("Sum is 42"))
    before = agent.snapshot()
    assert agent.tell("Too late") == finished
    assert agent.snapshot() == before


def test_a_message_survives_a_snapshot() -> None:
    agent = agent_with()
    agent.start(TASK)
    agent.tell("Use March")
    restored = Agent.restore(NO_PLAN, TOOLS, agent.snapshot())
    assert restored.resume() == agent.resume()
    assert "Use March" in prompt_of(restored.resume())


# --- follow_up: a new turn on a finished agent ------------------------------------------------


def _finished(config: Config = NO_PLAN) -> Agent:
    agent = agent_with(config)
    agent.start(TASK, "Files: figures.csv")
    finish_batch(agent, agent.reply(call("read_file", path="figures.csv")))
    done(agent.reply(final("The March total is 42")))
    return agent


def test_a_follow_up_starts_a_new_turn_with_the_history() -> None:
    agent = _finished()
    step = agent.follow_up("Now do the same for April")
    prompt = prompt_of(step)
    assert f"Task:\n{TASK}\n" in prompt
    assert "Context:\nFiles: figures.csv" in prompt
    assert "[call-1] read_file" in prompt
    assert (
        "Your turn ended (done): The March total is 42\n→ then the person asked: Now do the same"
        " for April"
    ) in prompt
    assert (
        "The person's current request (the task above is where this began):\n"
        "Now do the same for April"
    ) in prompt
    order = section_order(prompt, "Task:", "What happened so far:", "current request", "Reply")
    assert order == sorted(order)
    assert agent.trace()[-1].kind == "follow_up"
    assert agent.trace()[-1].text == "Now do the same for April"


def test_a_follow_up_gets_a_whole_turn_of_calls_and_call_ids_count_on() -> None:
    agent = agent_with(Config(require_plan=False, max_calls=2))
    agent.start(TASK)
    for path in ("a", "b"):
        finish_batch(agent, agent.reply(call("read_file", path=path)))
    assert done(agent.reply(call("read_file", path="c"))).outcome.stop is Stop.CALL_LIMIT
    step = agent.follow_up("Carry on with c")
    assert "Calls left: 2." in prompt_of(step)
    step = agent.reply(call("read_file", path="c"))
    assert isinstance(step, Run)
    assert step.call.id == "call-3"
    finish_batch(agent, step)
    outcome = done(agent.reply(final("c read"))).outcome
    assert outcome.stop is Stop.DONE
    assert outcome.calls == 3  # every turn


def test_a_follow_up_asks_for_a_new_plan_when_plans_are_required() -> None:
    agent = agent_with(Config())
    begin(agent, TASK, "Read figures.csv", "Sum March")
    finish_batch(agent, agent.reply(call("read_file", path="figures.csv")))
    done(agent.reply(final("42")))
    step = agent.follow_up("Now April")
    assert "Reply now with your plan" in prompt_of(step)
    assert "Plan:\n" not in prompt_of(step)
    assert agent.reply(plan("Read April")) == Plan(steps=("Read April",))


def test_a_follow_up_starts_the_loop_counters_again() -> None:
    agent = agent_with()
    agent.start(TASK)
    for _ in range(6):
        step = finish_batch(
            agent, agent.reply(call("read_file", path="x")), lambda _c: ToolOutput.error("gone")
        )
    assert done(step).outcome.stop is Stop.NO_PROGRESS
    agent.follow_up("The file is back now, try again")
    step = finish_batch(
        agent, agent.reply(call("read_file", path="x")), lambda _c: ToolOutput.error("gone")
    )
    assert isinstance(step, Ask)


def test_a_follow_up_starts_the_model_call_allowance_again() -> None:
    agent = agent_with(Config(require_plan=False, max_model_calls=2, max_retries=5))
    agent.start(TASK)
    agent.reply("garbage")
    assert done(agent.reply("garbage")).outcome.stop is Stop.MODEL_CALL_LIMIT
    step = agent.follow_up("Try again")
    assert "This is your last reply" not in prompt_of(step)
    assert "Your last reply could not be used" not in prompt_of(step)
    assert isinstance(agent.reply("garbage"), Ask)


@pytest.mark.parametrize(
    "end",
    [
        lambda a: a.cancel("stop"),
        lambda a: [a.reply("bad") for _ in range(4)][-1],
        lambda a: a.reply(final("42")),
    ],
    ids=["cancelled", "bad replies", "done"],
)
def test_any_stop_can_be_followed_up(end: Callable[[Agent], Step]) -> None:
    agent = agent_with()
    agent.start(TASK)
    stop = done(end(agent)).outcome.stop
    prompt = prompt_of(agent.follow_up("Go on"))
    assert f"Your turn ended ({stop.label()}):" in prompt


def test_a_message_sent_before_the_end_is_shown_in_the_follow_up() -> None:
    agent = agent_with()
    agent.start(TASK)
    agent.reply(call("read_file", path="a"))
    agent.tell("Use cents")
    done(agent.cancel("paused by the operator"))
    assert "Use cents" in prompt_of(agent.follow_up("Carry on"))


def test_a_follow_up_turn_can_be_sent_back_like_any_other() -> None:
    agent = _finished()
    agent.follow_up("Now April")
    done(agent.reply(final("April is 40")))
    step = agent.reject_final("April is 41")
    assert "You answered: April is 40\n→ sent back: April is 41" in prompt_of(step)


def test_the_summary_request_shows_the_current_request() -> None:
    agent = _finished(Config(require_plan=False, summarize=True, history_chars=1_000))
    step = agent.follow_up("Now April")
    for path in ("april-1", "april-2"):
        step = finish_batch(
            agent, agent.reply(call("read_file", path=path)), lambda _c: ToolOutput.ok("A" * 600)
        )
    assert isinstance(step, Summarize)
    assert "The person's current request:\nNow April" in prompt_of(step)


def _asking(agent: Agent) -> None:
    agent.start(TASK)


def _running(agent: Agent) -> None:
    agent.start(TASK)
    agent.reply(call("read_file", path="a"))


def _reviewing(agent: Agent) -> None:
    agent.start(TASK)
    agent.reply(plan("a"))


def _questioning(agent: Agent) -> None:
    agent.start(TASK)
    agent.reply('{"ask_user": "Which?"}')


@pytest.mark.parametrize("reach", [_asking, _running, _reviewing, _questioning])
def test_a_follow_up_to_a_working_agent_changes_nothing(reach: Callable[[Agent], None]) -> None:
    agent = Agent(Config(), TOOLS).with_questions()
    reach(agent)
    before_step, before = agent.resume(), agent.snapshot()
    assert agent.follow_up("Now April") == before_step
    assert agent.snapshot() == before


def test_a_blank_follow_up_changes_nothing() -> None:
    agent = _finished()
    before_step, before = agent.resume(), agent.snapshot()
    assert agent.follow_up("  ") == before_step
    assert agent.snapshot() == before


@pytest.mark.parametrize(
    "method",
    [lambda a: a.tell("x"), lambda a: a.follow_up("x"), lambda a: a.reply("x", truncated=True)],
    ids=["tell", "follow_up", "reply-cut"],
)
def test_steering_before_start_raises_usage_error(method: Callable[[Agent], Step]) -> None:
    with pytest.raises(UsageError):
        method(agent_with())


@pytest.mark.parametrize(
    "misuse", [lambda a: a.tell(None), lambda a: a.follow_up(b"x")], ids=["tell", "follow_up"]
)
def test_steering_with_what_is_not_text_raises_usage_error(misuse: Callable[[Agent], Step]) -> None:
    agent = _finished()
    before = agent.snapshot()
    with pytest.raises(UsageError):
        misuse(agent)
    assert agent.snapshot() == before


# --- replies cut by the length limit ------------------------------------------------------------

WRITE_REPLY = call("write_file", path="report.md", text="March: 42. " * 20)


def test_a_cut_reply_is_continued_and_the_parts_joined() -> None:
    agent = agent_with()
    agent.start(TASK)
    step = agent.reply(WRITE_REPLY[:70], truncated=True)
    prompt = prompt_of(step)
    assert "Your last reply was cut off by the length limit." in prompt
    assert f"{SO_FAR}\n{WRITE_REPLY[:70]}\n{CUT_HERE}" in prompt
    assert prompt.endswith("write only the rest, without repeating anything above.")
    assert agent.trace()[-1].kind == "continued"
    step = agent.reply(WRITE_REPLY[70:150], truncated=True)
    assert f"{SO_FAR}\n{WRITE_REPLY[:150]}\n{CUT_HERE}" in prompt_of(step)
    step = agent.reply(WRITE_REPLY[150:])
    assert isinstance(step, Run)
    assert step.call.args == {"path": "report.md", "text": "March: 42. " * 20}
    assert SO_FAR not in prompt_of(finish_batch(agent, step))


def test_a_cut_reply_that_is_whole_already_is_used() -> None:
    agent = agent_with()
    agent.start(TASK)
    step = agent.reply(
        call("read_file", path="a") + "\nAnd now I will explain at leng", truncated=True
    )
    assert isinstance(step, Run)
    assert step.call.args == {"path": "a"}
    assert "continued" not in [e.kind for e in agent.trace()]


def test_a_model_that_starts_over_is_read_on_its_own() -> None:
    agent = agent_with()
    agent.start(TASK)
    agent.reply(WRITE_REPLY[:40], truncated=True)
    step = agent.reply(call("read_file", path="figures.csv"))
    assert isinstance(step, Run)
    assert step.call.args == {"path": "figures.csv"}


def test_a_final_cut_inside_thinking_is_continued() -> None:
    agent = agent_with()
    agent.start(TASK)
    step = agent.reply("<think>The total is 4", truncated=True)
    assert isinstance(step, Ask)
    assert SO_FAR in prompt_of(step)
    outcome = done(agent.reply('2.</think>{"final": "The March total is 42"}')).outcome
    assert outcome.summary == "The March total is 42"


def test_a_reply_cut_too_often_is_unusable() -> None:
    agent = agent_with()
    agent.start(TASK)
    for piece in range(3):
        step = agent.reply(WRITE_REPLY[piece * 20 : piece * 20 + 20], truncated=True)
        assert SO_FAR in prompt_of(step)
    step = agent.reply(WRITE_REPLY[60:80], truncated=True)
    prompt = prompt_of(step)
    assert SO_FAR not in prompt
    assert (
        "Your last reply could not be used: your reply was cut off by the length limit 4 times"
        in (prompt)
    )
    assert agent.trace()[-1].kind == "retry"


def test_a_reply_too_long_joined_is_unusable() -> None:
    agent = agent_with()
    agent.start(TASK)
    agent.reply('{"final": "' + "x" * 40_000, truncated=True)
    step = agent.reply("y" * 30_000, truncated=True)
    assert SO_FAR not in prompt_of(step)
    assert "cut off by the length limit 2 times" in prompt_of(step)
    assert len(agent.snapshot()) < 60_000


def test_a_joined_reply_that_is_whole_but_wrong_is_retried_with_its_reason() -> None:
    agent = agent_with()
    agent.start(TASK)
    wrong = call("delete_all")
    agent.reply(wrong[:10], truncated=True)
    step = agent.reply(wrong[10:])
    assert "there is no tool named 'delete_all'" in prompt_of(step)
    assert SO_FAR not in prompt_of(step)


def test_a_failure_while_continuing_asks_for_the_rest_again() -> None:
    agent = agent_with()
    agent.start(TASK)
    agent.reply(WRITE_REPLY[:50], truncated=True)
    step = agent.fail("timeout")
    assert f"{SO_FAR}\n{WRITE_REPLY[:50]}\n{CUT_HERE}" in prompt_of(step)
    assert isinstance(agent.reply(WRITE_REPLY[50:]), Run)


def test_a_cut_summary_is_used_as_it_is() -> None:
    config = Config(require_plan=False, summarize=True, history_chars=1_000)
    agent = agent_with(config)
    agent.start(TASK)
    finish_batch(
        agent, agent.reply(call("read_file", path="a")), lambda _c: ToolOutput.ok("A" * 600)
    )
    step = finish_batch(
        agent, agent.reply(call("read_file", path="b")), lambda _c: ToolOutput.ok("B" * 600)
    )
    assert isinstance(step, Summarize)
    step = agent.reply("Read a and b; both hold lett", truncated=True)
    assert "Summary of earlier work:\nRead a and b; both hold lett" in prompt_of(step)


def test_every_part_of_a_cut_reply_is_a_model_call() -> None:
    agent = agent_with(Config(require_plan=False, max_model_calls=3))
    agent.start(TASK)
    agent.reply(WRITE_REPLY[:20], truncated=True)
    step = agent.reply(WRITE_REPLY[20:40], truncated=True)
    assert "This is your last reply" not in prompt_of(step)  # the rest is asked for, not a final
    outcome = done(agent.reply(WRITE_REPLY[40:60], truncated=True)).outcome
    assert outcome.stop is Stop.MODEL_CALL_LIMIT


def test_a_cut_reply_at_the_wrong_time_changes_nothing() -> None:
    agent = agent_with()
    agent.start(TASK)
    running = agent.reply(call("read_file", path="a"))
    before = agent.snapshot()
    assert agent.reply('{"final": "x', truncated=True) == running
    assert agent.snapshot() == before


def test_a_continuation_survives_a_snapshot() -> None:
    agent = agent_with()
    agent.start(TASK)
    agent.reply(WRITE_REPLY[:70], truncated=True)
    restored = Agent.restore(NO_PLAN, TOOLS, agent.snapshot())
    assert restored.resume() == agent.resume()
    assert restored.reply(WRITE_REPLY[70:]) == agent.reply(WRITE_REPLY[70:])
    assert restored.snapshot() == agent.snapshot()
