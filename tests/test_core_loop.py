"""The core loop played against a scripted model: plan, calls, batches, limits, retries, stops."""

from __future__ import annotations

import json
import re
from collections.abc import Callable

import pytest

from agent_core import (
    Agent,
    Ask,
    Config,
    DefinitionError,
    Done,
    Kind,
    Plan,
    Policy,
    Risk,
    Run,
    Step,
    Stop,
    Tool,
    ToolCall,
    ToolOutput,
    UsageError,
    run,
)
from tests.support.scripted import (
    Script,
    batch,
    begin,
    call,
    final,
    finish_batch,
    plan,
    prompt_of,
)

READ = Tool("read_file", "Read a text file").arg("path", Kind.TEXT, "relative path").risk(Risk.READ)
WRITE = (
    Tool("write_file", "Write a text file")
    .arg("path", Kind.TEXT)
    .arg("text", Kind.TEXT)
    .risk(Risk.WRITE)
)
PAY = Tool("pay", "Pay an invoice").arg("amount", Kind.NUMBER).risk(Risk.MONEY)
TOOLS = [READ, WRITE, PAY]
TASK = "Copy notes.txt to backup.txt"


def agent_with(**fields: object) -> Agent:
    return Agent(Config(**fields), TOOLS)


def read(path: str = "notes.txt") -> str:
    return call("read_file", path=path)


def done(step: Step) -> Done:
    assert isinstance(step, Done), f"expected Done, got {step!r}"
    return step


# --- the plan ------------------------------------------------------------------------------


def test_the_plan_comes_first_and_is_reviewed() -> None:
    agent = agent_with()
    step = agent.start(TASK, "Files: notes.txt")
    assert isinstance(step, Ask)
    assert "Reply now with your plan" in prompt_of(step)
    assert f"Task:\n{TASK}" in prompt_of(step)
    assert "Context:\nFiles: notes.txt" in prompt_of(step)
    step = agent.reply(plan("Read notes.txt", "Write backup.txt"))
    assert step == Plan(steps=("Read notes.txt", "Write backup.txt"))
    step = agent.approve_plan(True)
    assert isinstance(step, Ask)
    assert "Plan:\n1. Read notes.txt\n2. Write backup.txt\n(0 calls made so far, 12 left)" in (
        prompt_of(step)
    )
    assert "Reply now with your plan" not in prompt_of(step)


def test_a_plan_over_max_plan_steps_is_sent_back() -> None:
    agent = agent_with(max_plan_steps=3)
    agent.start(TASK)
    step = agent.reply(plan("a", "b", "c", "d"))
    assert isinstance(step, Ask)
    assert "your plan has 4 steps; shorten it to at most 3" in prompt_of(step)
    assert isinstance(agent.reply(plan("a", "b", "c")), Plan)


def test_a_declined_plan_stops_the_run() -> None:
    agent = agent_with()
    agent.start(TASK)
    agent.reply(plan("Read", "Write"))
    outcome = done(agent.approve_plan(False)).outcome
    assert outcome.stop is Stop.PLAN_DECLINED
    assert outcome.calls == 0


def test_a_call_before_the_plan_is_retried() -> None:
    agent = agent_with()
    agent.start(TASK)
    step = agent.reply(read())
    assert isinstance(step, Ask)
    assert "first reply with your plan" in prompt_of(step)


def test_an_unasked_for_plan_is_retried() -> None:
    agent = agent_with()
    begin(agent, TASK, "Read", "Write")
    step = agent.reply(plan("Something else"))
    assert isinstance(step, Ask)
    assert "the plan is already settled" in prompt_of(step)


def test_without_require_plan_the_first_ask_is_for_a_move() -> None:
    step = agent_with(require_plan=False).start(TASK)
    assert "Reply now with your plan" not in prompt_of(step)
    assert "Calls left: 12" in prompt_of(step)


# --- calls and batches -------------------------------------------------------------------------


def test_a_call_runs_and_its_result_is_shown() -> None:
    agent = agent_with(require_plan=False)
    agent.start(TASK)
    step = agent.reply(read())
    assert isinstance(step, Run)
    assert step.call == ToolCall(
        id="call-1",
        tool="read_file",
        args={"path": "notes.txt"},
        risk=Risk.READ,
        ask=False,
        summary='read_file(path="notes.txt")',
    )
    assert agent.queued() == []
    step = agent.result("call-1", ToolOutput.ok("hello"))
    assert '[call-1] read_file {"path": "notes.txt"}\n→ ok: hello' in prompt_of(step)
    assert "Calls left: 11" in prompt_of(step)


@pytest.mark.parametrize(
    ("output", "shown"),
    [
        (ToolOutput.ok("fine"), "→ ok: fine"),
        (ToolOutput.error("disk full"), "→ error: disk full"),
        (ToolOutput.declined("not now"), "→ declined by the person (not now)."),
        (ToolOutput.declined(), "→ declined by the person. Do not ask"),
        (ToolOutput.unknown("worker died"), "→ outcome unknown: worker died."),
    ],
)
def test_each_output_status_reads_to_the_model(output: ToolOutput, shown: str) -> None:
    agent = agent_with(require_plan=False)
    agent.start(TASK)
    step = agent.reply(read())
    assert isinstance(step, Run)
    assert shown in prompt_of(agent.result(step.call.id, output))


def test_a_batch_runs_together_and_is_seen_together() -> None:
    agent = agent_with(require_plan=False, max_batch=3, policy=Policy.TRUSTING)
    agent.start(TASK)
    step = agent.reply(
        batch(("read_file", {"path": "a"}), ("read_file", {"path": "b"}), ("pay", {"amount": 3}))
    )
    assert isinstance(step, Run)
    assert step.call.id == "call-1"
    assert [c.id for c in agent.queued()] == ["call-2", "call-3"]
    assert [c.ask for c in [step.call, *agent.queued()]] == [False, False, True]
    # results in any order: the agent waits for all of them
    step = agent.result("call-3", ToolOutput.ok("paid"))
    assert isinstance(step, Run)
    assert step.call.id == "call-1"
    assert [c.id for c in agent.queued()] == ["call-2"]
    step = agent.result("call-1", ToolOutput.ok("A"))
    assert isinstance(step, Run)
    assert step.call.id == "call-2"
    assert agent.queued() == []
    step = agent.result("call-2", ToolOutput.ok("B"))
    prompt = prompt_of(step)
    lines = [line for line in prompt.splitlines() if line.startswith(("[call-", "→"))]
    assert lines == [
        '[call-1] read_file {"path": "a"}',
        "→ ok: A",
        '[call-2] read_file {"path": "b"}',
        "→ ok: B",
        '[call-3] pay {"amount": 3}',
        "→ ok: paid",
    ]
    assert "Calls left: 9" in prompt


def test_the_batch_form_is_offered_only_when_max_batch_is_above_one() -> None:
    one = agent_with(require_plan=False).start(TASK)
    many = agent_with(require_plan=False, max_batch=4).start(TASK)
    assert isinstance(one, Ask)
    assert isinstance(many, Ask)
    assert '{"tools": [' not in one.request.system
    assert '{"tools": [' in many.request.system
    assert "up to 4 calls at once" in many.request.system


def test_a_batch_is_cut_at_max_batch_with_a_note() -> None:
    agent = agent_with(require_plan=False, max_batch=2)
    agent.start(TASK)
    step = agent.reply(batch(*[("read_file", {"path": p}) for p in "abcd"]))
    assert isinstance(step, Run)
    assert [c.args["path"] for c in [step.call, *agent.queued()]] == ["a", "b"]
    step = finish_batch(agent, step)
    assert "(You asked for 4 calls in one reply; only the first 2 ran.)" in prompt_of(step)
    assert "Calls left: 10" in prompt_of(step)


def test_a_batch_is_cut_at_the_call_limit() -> None:
    agent = agent_with(require_plan=False, max_batch=5, max_calls=3)
    agent.start(TASK)
    step = finish_batch(agent, agent.reply(read("first")))
    step = agent.reply(batch(*[("read_file", {"path": p}) for p in "abcd"]))
    assert isinstance(step, Run)
    assert [c.id for c in [step.call, *agent.queued()]] == ["call-2", "call-3"]
    step = finish_batch(agent, step)
    assert "only the first 2 ran" in prompt_of(step)
    assert "No tool calls are left" in prompt_of(step)


def test_a_batch_with_one_bad_call_is_retried_whole() -> None:
    agent = agent_with(require_plan=False, max_batch=3)
    agent.start(TASK)
    step = agent.reply(batch(("read_file", {"path": "a"}), ("read_file", {})))
    assert isinstance(step, Ask)
    assert "read_file: 'path' is required" in prompt_of(step)
    assert "Calls left: 12" in prompt_of(step)


def test_a_call_when_none_are_left_stops_with_call_limit() -> None:
    agent = agent_with(require_plan=False, max_calls=2)
    agent.start(TASK)
    for _ in range(2):
        step = finish_batch(agent, agent.reply(read()))
    assert "No tool calls are left" in prompt_of(step)
    outcome = done(agent.reply(read())).outcome
    assert outcome.stop is Stop.CALL_LIMIT
    assert outcome.calls == 2
    assert "2 calls" in outcome.summary


def test_the_call_limit_still_accepts_a_final() -> None:
    agent = agent_with(require_plan=False, max_calls=1)
    agent.start(TASK)
    finish_batch(agent, agent.reply(read()))
    outcome = done(agent.reply(final("Copied, but backup not verified"))).outcome
    assert outcome.stop is Stop.DONE
    assert outcome.calls == 1


def test_an_unknown_tool_is_explained_with_the_tool_list() -> None:
    agent = agent_with(require_plan=False)
    agent.start(TASK)
    step = agent.reply(call("delete_everything"))
    assert (
        "there is no tool named 'delete_everything'; the tools are: read_file, write_file, pay"
        in (prompt_of(step))
    )


# --- unusable replies and failed model calls -------------------------------------------------


def test_unusable_replies_are_retried_with_the_reason_then_stop() -> None:
    agent = agent_with(require_plan=False, max_retries=2)
    agent.start(TASK)
    step = agent.reply("Sure, I will copy the file now.")
    assert "Your last reply could not be used: no complete JSON object was found" in (
        prompt_of(step)
    )
    step = agent.reply('{"answer": 42}')
    assert 'has none of the keys "plan", "tool", "tools", "final"' in prompt_of(step)
    outcome = done(agent.reply("still nothing")).outcome
    assert outcome.stop is Stop.BAD_REPLIES
    assert "no complete JSON object" in outcome.summary


def test_zero_retries_stops_at_the_first_unusable_reply() -> None:
    agent = agent_with(require_plan=False, max_retries=0)
    agent.start(TASK)
    assert done(agent.reply("nope")).outcome.stop is Stop.BAD_REPLIES


def test_a_usable_reply_resets_the_retry_budget() -> None:
    agent = agent_with(require_plan=False, max_retries=2)
    agent.start(TASK)
    agent.reply("bad")
    agent.reply("bad")
    step = finish_batch(agent, agent.reply(read()))
    assert "could not be used" not in prompt_of(step)
    agent.reply("bad")
    step = agent.reply("bad")
    assert isinstance(step, Ask)
    assert done(agent.reply("bad")).outcome.stop is Stop.BAD_REPLIES


def test_failed_model_calls_spend_the_budget_and_stop_with_model_failed() -> None:
    agent = agent_with(require_plan=False, max_retries=2)
    agent.start(TASK)
    assert isinstance(agent.fail("timeout"), Ask)
    assert isinstance(agent.fail("HTTP 503"), Ask)
    outcome = done(agent.fail("connection refused")).outcome
    assert outcome.stop is Stop.MODEL_FAILED
    assert "connection refused" in outcome.summary


def test_a_failed_call_is_traced_as_a_failure_not_as_an_unusable_reply() -> None:
    agent = agent_with(require_plan=False, max_retries=2)
    agent.start(TASK)
    agent.fail("could not connect to 127.0.0.1:9: connection refused")
    agent.reply("prose only")
    retries = [(e.kind, e.text) for e in agent.trace() if e.kind in ("retry", "model_failed")]
    assert retries == [
        ("model_failed", "could not connect to 127.0.0.1:9: connection refused"),
        ("retry", retries[1][1]),
    ]
    assert "no complete JSON object" in retries[1][1]


def test_failures_and_unusable_replies_share_one_budget() -> None:
    agent = agent_with(require_plan=False, max_retries=2)
    agent.start(TASK)
    agent.reply("bad")
    agent.fail("timeout")
    assert done(agent.reply("bad")).outcome.stop is Stop.BAD_REPLIES


def test_a_failure_keeps_the_last_reason_shown() -> None:
    agent = agent_with(require_plan=False)
    agent.start(TASK)
    agent.reply("prose only")
    step = agent.fail("timeout")
    assert "no complete JSON object was found" in prompt_of(step)


# --- finals ---------------------------------------------------------------------------------


def test_outcome_data_is_the_whole_final_object() -> None:
    agent = agent_with(require_plan=False)
    agent.start(TASK)
    finish_batch(agent, agent.reply(read()))
    outcome = done(agent.reply(final("Copied", files=["backup.txt"], bytes=120))).outcome
    assert outcome.stop is Stop.DONE
    assert outcome.summary == "Copied"
    assert outcome.data == {"final": "Copied", "files": ["backup.txt"], "bytes": 120}
    assert outcome.calls == 1


def test_a_final_too_early_is_sent_back_once() -> None:
    agent = agent_with()
    begin(agent, TASK, "Read notes", "Write backup", "Check backup", "Report")
    finish_batch(agent, agent.reply(read()))
    step = agent.reply(final("All done"))
    assert isinstance(step, Ask)
    prompt = prompt_of(step)
    assert "You answered: All done\n→ sent back: you answered after 1 call," in prompt
    assert "most of your plan is untouched" in prompt
    outcome = done(agent.reply(final("All done, really"))).outcome
    assert outcome.stop is Stop.DONE
    assert outcome.summary == "All done, really"


@pytest.mark.parametrize(
    ("steps", "calls", "sent_back"),
    [(4, 1, True), (4, 2, False), (3, 1, True), (2, 1, False), (1, 0, True)],
)
def test_too_early_means_fewer_calls_than_half_the_plan(
    steps: int, calls: int, sent_back: bool
) -> None:
    agent = agent_with()
    begin(agent, TASK, *[f"step {i}" for i in range(steps)])
    for _ in range(calls):
        finish_batch(agent, agent.reply(read()))
    step = agent.reply(final("Done"))
    assert isinstance(step, Ask) == sent_back


def test_declined_and_failed_calls_count_towards_the_plan() -> None:
    agent = agent_with(max_batch=2)
    begin(agent, TASK, "a", "b", "c", "d")
    step = agent.reply(
        batch(("write_file", {"path": "x", "text": "y"}), ("read_file", {"path": "z"}))
    )
    finish_batch(agent, step, lambda c: ToolOutput.declined() if c.ask else ToolOutput.error("no"))
    assert isinstance(agent.reply(final("Could not")), Done)


def test_reject_final_sends_the_model_back_with_the_problem() -> None:
    agent = agent_with(require_plan=False)
    agent.start(TASK)
    finish_batch(agent, agent.reply(read()))
    done(agent.reply(final("Copied")))
    step = agent.reject_final("backup.txt is still empty")
    assert "You answered: Copied\n→ sent back: backup.txt is still empty" in prompt_of(step)
    outcome = done(agent.reply(final("Copied and checked"))).outcome
    assert outcome.stop is Stop.DONE
    assert outcome.summary == "Copied and checked"


def test_cancel_stops_with_the_reason() -> None:
    agent = agent_with(require_plan=False)
    agent.start(TASK)
    outcome = done(agent.cancel("the person changed their mind")).outcome
    assert outcome.stop is Stop.CANCELLED
    assert outcome.summary == "the person changed their mind"


def _at_plan(agent: Agent) -> Step:
    agent.start(TASK)
    return agent.reply(plan("a"))


def _at_run(agent: Agent) -> Step:
    return begin(agent, TASK, "a") and agent.reply(read())


@pytest.mark.parametrize("reach", [lambda a: a.start(TASK), _at_plan, _at_run])
def test_cancel_works_in_every_live_phase(reach: Callable[[Agent], Step]) -> None:
    agent = agent_with()
    reach(agent)
    outcome = done(agent.cancel()).outcome
    assert outcome.stop is Stop.CANCELLED
    assert outcome.summary == "Cancelled."


@pytest.mark.parametrize("stop", list(Stop))
def test_every_stop_has_a_short_distinct_label(stop: Stop) -> None:
    label = stop.label()
    assert label
    assert len(label) <= 40
    assert label == label.strip()
    assert sum(1 for other in Stop if other.label() == label) == 1


def test_labels_read_as_people_expect() -> None:
    assert Stop.DONE.label() == "done"
    assert Stop.CALL_LIMIT.label() == "call limit reached"
    assert Stop.CANCELLED.label() == "cancelled"


# --- messy replies -----------------------------------------------------------------------------

MESSY = {
    "fence": '```json\n{"tool": "read_file", "args": {"path": "notes.txt"}}\n```',
    "bare fence": '```\n{"tool": "read_file", "args": {"path": "notes.txt"}}\n```',
    "think": '<think>I should read it. {"final": "decoy"}</think>\n'
    '{"tool": "read_file", "args": {"path": "notes.txt"}}',
    "close without open": 'reading first... {"final": "decoy"}</think>'
    '{"tool": "read_file", "args": {"path": "notes.txt"}}',
    "prose around": 'Let me look at the file {first}.\n{"tool": "read_file", "args": {"path":'
    ' "notes.txt"}}\nThat should do it.',
    "two objects": '{"tool": "read_file", "args": {"path": "notes.txt"}} {"final": "second"}',
    "two fences": '```json\n{"tool": "read_file", "args": {"path": "notes.txt"}}\n```\n'
    '```json\n{"tool": "write_file", "args": {"path": "x", "text": "y"}}\n```',
    "broken then good": '{"tool": "read_file", "args": {"path": } oops\n'
    '{"tool": "read_file", "args": {"path": "notes.txt"}}',
    "raw newline in string": '{"tool": "read_file", "args": {"path": "notes.txt"}}',
    "spoken thinking": "Thinking: the user wants a copy; the args are {path}.\n"
    'Answer: {"tool": "read_file", "args": {"path": "notes.txt"}}',
}


@pytest.mark.parametrize("reply", MESSY.values(), ids=MESSY.keys())
def test_messy_replies_yield_the_first_complete_object(reply: str) -> None:
    agent = agent_with(require_plan=False)
    agent.start(TASK)
    step = agent.reply(reply)
    assert isinstance(step, Run)
    assert (step.call.tool, step.call.args) == ("read_file", {"path": "notes.txt"})


def test_an_unclosed_think_hides_the_rest() -> None:
    agent = agent_with(require_plan=False)
    agent.start(TASK)
    step = agent.reply('<think>maybe {"final": "decoy"} and then I never stop')
    assert isinstance(step, Ask)
    assert "no complete JSON object" in prompt_of(step)


def test_a_final_with_a_raw_newline_keeps_it() -> None:
    agent = agent_with(require_plan=False)
    agent.start(TASK)
    outcome = done(agent.reply('{"final": "line one\nline two"}')).outcome
    assert outcome.summary == "line one\nline two"


@pytest.mark.parametrize(
    ("reply", "reason"),
    [
        ('{"final": "x", "tool": "read_file"}', 'has "tool", "final": use exactly one'),
        ('{"plan": []}', '"plan" must be a non-empty list'),
        ('{"plan": ["ok", ""]}', 'every step of "plan" must be a non-empty text'),
        ('{"tool": 5}', '"tool" must be the name of a tool'),
        ('{"tools": []}', '"tools" must be a non-empty list'),
        ('{"tools": [5]}', "each call must be an object"),
        ('{"final": 5}', '"final" must be text'),
        ("[1, 2, 3]", "no complete JSON object"),
        ("", "no complete JSON object"),
    ],
)
def test_malformed_protocol_objects_give_a_stated_reason(reply: str, reason: str) -> None:
    agent = agent_with(require_plan=False)
    agent.start(TASK)
    assert reason in prompt_of(agent.reply(reply))


# --- history within history_chars ----------------------------------------------------------

CALL_LINE = re.compile(r"^\[call-(\d+)\] ")


def history_of(prompt: str) -> str:
    start = prompt.index("What happened so far:\n") + len("What happened so far:\n")
    end = prompt.index("\n\nReply with one JSON object")
    return prompt[start:end]


def test_old_turns_are_dropped_whole_and_calls_keep_their_results() -> None:
    agent = agent_with(require_plan=False, max_batch=3, max_calls=200, history_chars=2_000)
    agent.start(TASK)
    step: Step
    for turn in range(12):
        calls = [("read_file", {"path": f"t{turn}-{i}"}) for i in range(1 + turn % 3)]
        step = agent.reply(batch(*calls))
        step = finish_batch(
            agent, step, lambda c: ToolOutput.ok(f"content of {c.args['path']} " + "." * 150)
        )
    history = history_of(prompt_of(step))
    assert len(history) <= 2_000
    lines = history.splitlines()
    ids = []
    for index, line in enumerate(lines):
        found = CALL_LINE.match(line)
        if found:
            ids.append(int(found.group(1)))
            assert lines[index + 1].startswith("→ ok: content of"), "a call lost its result"
    assert lines[0].startswith("[call-"), "history must start at a whole turn"
    # a suffix of all calls, in order: the oldest turns went whole
    made = 12 + 12 // 3 * 3  # 1 + 2 + 3 calls in every three turns
    assert ids == list(range(made - len(ids) + 1, made + 1))
    assert ids[0] > 1
    # the first kept turn is complete: each turn's calls share its turn number
    first_turn = int(re.search(r'"t(\d+)-', lines[0]).group(1))  # type: ignore[union-attr]
    assert f'"t{first_turn}-0"' in lines[0]


def test_a_huge_output_is_cut_with_a_visible_marker() -> None:
    agent = agent_with(require_plan=False, history_chars=4_000)
    agent.start(TASK)
    step = agent.reply(read())
    assert isinstance(step, Run)
    step = agent.result(step.call.id, ToolOutput.ok("x" * 1_000_000))
    prompt = prompt_of(step)
    assert len(prompt) < 6_000
    assert re.search(r"\[… cut: \d+ more characters\]", prompt)
    assert len(agent.snapshot()) < 10_000


def test_the_newest_turn_stays_even_when_it_is_large() -> None:
    agent = agent_with(require_plan=False, history_chars=1_000, max_batch=8)
    agent.start(TASK)
    step = agent.reply(batch(*[("read_file", {"path": str(i)}) for i in range(8)]))
    step = finish_batch(agent, step, lambda _c: ToolOutput.ok("y" * 400))
    assert prompt_of(step).count("→ ok: ") == 8


def test_the_snapshot_stays_bounded_over_a_long_run() -> None:
    agent = agent_with(require_plan=False, max_calls=10_000, history_chars=4_000)
    agent.start(TASK)
    sizes = []
    for number in range(300):
        step = agent.reply(read(f"file-{number}.txt"))
        agent.result(step.call.id, ToolOutput.ok(f"{number}: " + "z" * 3_000))  # type: ignore[union-attr]
        agent.take_trace()
        sizes.append(len(agent.snapshot()))
    assert max(sizes) < 20_000
    assert sizes[-1] <= max(sizes[50:100]) * 1.1
    assert isinstance(agent.resume(), Ask)


def test_the_snapshot_stays_bounded_when_the_model_writes_huge_arguments() -> None:
    # History is trimmed by its rendered size, so what it stores must be cut the
    # same way: 100 KB arguments must not keep the snapshot far above history_chars.
    agent = agent_with(require_plan=False, max_calls=10_000)
    agent.start(TASK)
    for number in range(40):
        step = agent.reply(call("write_file", path=f"f{number}", text="w" * 100_000))
        assert isinstance(step, Run)
        agent.result(step.call.id, ToolOutput.ok("written"))
        agent.take_trace()
    assert len(prompt_of(agent.resume())) < 30_000
    assert len(agent.snapshot()) < 4 * 24_000 + 20_000


def test_take_trace_hands_events_over_once() -> None:
    agent = agent_with()
    begin(agent, TASK, "Read")
    finish_batch(agent, agent.reply(read()))
    agent.reply("garbage")
    done(agent.reply(final("Done")))
    events = agent.take_trace()
    assert [e.kind for e in events] == [
        "started",
        "plan",
        "plan_approved",
        "call",
        "result",
        "retry",
        "stop",
    ]
    assert [e.seq for e in events] == list(range(1, 8))
    assert events[3].call is not None
    assert events[3].call.id == "call-1"
    assert events[-1].stop is Stop.DONE
    assert agent.trace() == []
    assert agent.take_trace() == []
    agent.reject_final("no")
    assert [e.seq for e in agent.trace()] == [8]


# --- determinism --------------------------------------------------------------------------------


def _play(agent: Agent) -> list[str]:
    seen = [agent.start(TASK, "ctx").model_dump_json()]
    moves: list[Callable[[], Step]] = [
        lambda: agent.reply("garbage"),
        lambda: agent.reply(plan("Read", "Write")),
        lambda: agent.approve_plan(True),
        lambda: agent.reply(
            batch(("read_file", {"path": "a"}), ("write_file", {"path": "b", "text": "c"}))
        ),
        lambda: agent.result("call-2", ToolOutput.declined()),
        lambda: agent.result("call-1", ToolOutput.ok("A")),
        lambda: agent.reply(final("done", note="n")),
        lambda: agent.reject_final("check again"),
        lambda: agent.reply(final("done again")),
    ]
    for move in moves:
        seen.append(move().model_dump_json())
        seen.append(agent.snapshot())
    return seen


def test_the_same_inputs_give_byte_equal_steps_and_snapshots() -> None:
    first = _play(agent_with(max_batch=2))
    second = _play(agent_with(max_batch=2))
    assert first == second
    assert '"id":"call-1"' in first[7]


def test_call_ids_count_up_over_the_run() -> None:
    agent = agent_with(require_plan=False, max_batch=2)
    agent.start(TASK)
    ids = []
    for _ in range(3):
        step = agent.reply(batch(("read_file", {"path": "a"}), ("read_file", {"path": "b"})))
        assert isinstance(step, Run)
        ids += [step.call.id, *[c.id for c in agent.queued()]]
        finish_batch(agent, step)
    assert ids == [f"call-{n}" for n in range(1, 7)]


# --- wrong-time calls: harmless ---------------------------------------------------------------


def _asking(agent: Agent) -> None:
    agent.start(TASK)


def _reviewing(agent: Agent) -> None:
    agent.start(TASK)
    agent.reply(plan("a", "b"))


def _running(agent: Agent) -> None:
    begin(agent, TASK, "a")
    agent.reply(batch(("read_file", {"path": "a"}), ("read_file", {"path": "b"})))


def _mid_batch(agent: Agent) -> None:
    _running(agent)
    agent.result("call-2", ToolOutput.ok("B"))


def _finished(agent: Agent) -> None:
    begin(agent, TASK, "a")
    finish_batch(agent, agent.reply(read()))
    done(agent.reply(final("done")))


def _cancelled(agent: Agent) -> None:
    agent.start(TASK)
    agent.cancel("stop")


def _stopped(agent: Agent) -> None:
    agent.start(TASK)
    for _ in range(4):
        agent.reply("bad")


PHASES: dict[str, Callable[[Agent], None]] = {
    "asking": _asking,
    "reviewing": _reviewing,
    "running": _running,
    "mid-batch": _mid_batch,
    "finished": _finished,
    "cancelled": _cancelled,
    "stopped": _stopped,
}

WRONG: dict[str, tuple[list[str], Callable[[Agent], Step]]] = {
    "result for an unknown id": (
        ["asking", "reviewing", "running", "mid-batch", "finished"],
        lambda a: a.result("call-99", ToolOutput.ok("?")),
    ),
    "duplicate result": (["mid-batch"], lambda a: a.result("call-2", ToolOutput.ok("again"))),
    "approval when none is asked": (
        ["asking", "running", "mid-batch", "finished", "cancelled"],
        lambda a: a.approve_plan(True),
    ),
    "refusal when none is asked": (
        ["asking", "running", "finished"],
        lambda a: a.approve_plan(False),
    ),
    "answer when no question": (
        ["asking", "reviewing", "running", "finished"],
        lambda a: a.answer("September"),
    ),
    "reply while reviewing or running": (
        ["reviewing", "running", "mid-batch", "finished", "cancelled"],
        lambda a: a.reply(final("sneaky")),
    ),
    "fail while not asking": (["reviewing", "running", "finished"], lambda a: a.fail("timeout")),
    "reject_final when not done or not DONE": (
        ["asking", "reviewing", "running", "cancelled", "stopped"],
        lambda a: a.reject_final("no"),
    ),
    "cancel after the end": (["finished", "cancelled", "stopped"], lambda a: a.cancel("late")),
    "a second start": (["asking", "running", "finished"], lambda a: a.start("another task")),
    "a message after the end": (["finished", "cancelled", "stopped"], lambda a: a.tell("late")),
    "a blank message": (["asking", "running", "mid-batch"], lambda a: a.tell(" ")),
    "a follow-up while working": (
        ["asking", "reviewing", "running", "mid-batch"],
        lambda a: a.follow_up("and April"),
    ),
    "a cut reply while not asking": (
        ["reviewing", "running", "mid-batch", "finished", "cancelled"],
        lambda a: a.reply('{"final": "x', truncated=True),
    ),
    "resume": (list(PHASES), lambda a: a.resume()),
}

WRONG_CASES = [
    pytest.param(phase, move, id=f"{name}@{phase}")
    for name, (phases, move) in WRONG.items()
    for phase in phases
]


@pytest.mark.parametrize(("phase", "move"), WRONG_CASES)
def test_a_wrong_time_call_returns_the_current_step_and_changes_nothing(
    phase: str, move: Callable[[Agent], Step]
) -> None:
    agent = agent_with(max_batch=2)
    PHASES[phase](agent)
    before_step, before = agent.resume(), agent.snapshot()
    assert move(agent) == before_step
    assert agent.snapshot() == before


def test_queued_outside_a_batch_is_empty() -> None:
    agent = agent_with()
    assert agent.queued() == []
    agent.start(TASK)
    assert agent.queued() == []


@pytest.mark.parametrize(
    "method",
    [
        lambda a: a.resume(),
        lambda a: a.reply(final("x")),
        lambda a: a.fail("x"),
        lambda a: a.approve_plan(True),
        lambda a: a.result("call-1", ToolOutput.ok("x")),
        lambda a: a.answer("x"),
        lambda a: a.reject_final("x"),
        lambda a: a.cancel("x"),
        lambda a: a.tell("x"),
        lambda a: a.follow_up("x"),
    ],
    ids=[
        "resume",
        "reply",
        "fail",
        "approve_plan",
        "result",
        "answer",
        "reject_final",
        "cancel",
        "tell",
        "follow_up",
    ],
)
def test_methods_before_start_raise_usage_error(method: Callable[[Agent], Step]) -> None:
    agent = agent_with()
    with pytest.raises(UsageError):
        method(agent)


@pytest.mark.parametrize(
    "misuse",
    [
        lambda a: a.reply(None),
        lambda a: a.reply(b"{}"),
        lambda a: a.fail(None),
        lambda a: a.result("call-1", "ok"),
        lambda a: a.result("call-1", None),
        lambda a: a.result(1, ToolOutput.ok("x")),
        lambda a: a.answer(3),
        lambda a: a.reject_final(None),
        lambda a: a.cancel(None),
    ],
    ids=[
        "reply-none",
        "reply-bytes",
        "fail",
        "result-str",
        "result-none",
        "result-id",
        "answer",
        "reject",
        "cancel",
    ],
)
def test_bad_argument_types_raise_usage_error(misuse: Callable[[Agent], Step]) -> None:
    agent = agent_with()
    begin(agent, TASK, "a")
    before = agent.snapshot()
    with pytest.raises(UsageError):
        misuse(agent)
    assert agent.snapshot() == before


@pytest.mark.parametrize(
    "misuse",
    [lambda a: a.start(None), lambda a: a.start("t", 5), lambda a: a.start_with("t", "", ["f"])],
    ids=["task", "context", "attachment"],
)
def test_bad_start_arguments_raise_usage_error(misuse: Callable[[Agent], Step]) -> None:
    with pytest.raises(UsageError):
        misuse(agent_with())


def test_config_must_be_a_config() -> None:
    with pytest.raises(DefinitionError, match="Config"):
        Agent({"max_calls": 3}, TOOLS)  # type: ignore[arg-type]


# --- the blocking driver ------------------------------------------------------------------------


def test_run_plays_a_whole_task_with_host_defaults() -> None:
    files = {"notes.txt": "hello"}

    def write(args: dict[str, object]) -> str:
        files[str(args["path"])] = str(args["text"])
        return "written"

    script = Script(
        [
            plan("Read notes.txt", "Write backup.txt"),
            read(),
            call("write_file", path="backup.txt", text="hello"),
            final("Copied notes.txt to backup.txt", bytes=5),
        ],
        tools={"read_file": lambda a: files[a["path"]], "write_file": write},
    )
    outcome = run(agent_with(), script, TASK, "Files: notes.txt")
    assert outcome.stop is Stop.DONE
    assert outcome.data == {"final": "Copied notes.txt to backup.txt", "bytes": 5}
    assert outcome.calls == 2
    assert files["backup.txt"] == "hello"
    assert [c.tool for c in script.calls] == ["read_file", "write_file"]
    assert all(TASK in p for p in script.prompts)
    assert "→ ok: hello" in script.prompts[2]


def test_run_asks_the_host_to_approve_plans_and_calls() -> None:
    asked: list[str] = []

    def approve(call_: ToolCall) -> bool:
        asked.append(call_.summary)
        return False

    script = Script(
        [plan("Write"), call("write_file", path="b", text="x"), read(), final("Could not write")],
        approve_plan=lambda steps: steps == ["Write"],
        approve_call=approve,
    )
    outcome = run(agent_with(), script, TASK)
    assert outcome.stop is Stop.DONE
    assert asked == ['write_file(path="b", text="x")']
    assert [c.tool for c in script.calls] == ["read_file"]
    assert "→ declined by the person" in script.prompts[2]


def test_run_stops_when_the_host_declines_the_plan() -> None:
    script = Script([plan("Delete everything")], approve_plan=lambda _s: False)
    assert run(agent_with(), script, TASK).stop is Stop.PLAN_DECLINED


def test_run_turns_model_and_tool_exceptions_into_data() -> None:
    def broken(_args: dict[str, object]) -> str:
        raise OSError("disk on fire")

    script = Script(
        [TimeoutError("read timed out"), plan("Read"), read(), final("The disk failed")],
        tools={"read_file": broken},
    )
    outcome = run(agent_with(), script, TASK)
    assert outcome.stop is Stop.DONE
    assert "→ error: disk on fire" in script.prompts[-1]


def test_run_stops_with_model_failed_when_the_model_keeps_failing() -> None:
    script = Script([ConnectionError("refused")] * 4)
    outcome = run(agent_with(max_retries=3), script, TASK)
    assert outcome.stop is Stop.MODEL_FAILED
    assert "refused" in outcome.summary


def test_run_reports_a_tool_returning_the_wrong_type() -> None:
    script = Script(
        [read(), final("done")],
        tools={"read_file": lambda _a: 42},  # type: ignore[dict-item,return-value]
    )
    script.run_tool = lambda _call: 42  # type: ignore[method-assign,assignment,return-value]
    run(agent_with(require_plan=False), script, TASK)
    assert "→ error: the tool returned int, not a ToolOutput" in script.prompts[-1]


def test_every_prompt_holds_the_task_verbatim() -> None:
    task = 'Find  the\tfile \u2018notes\u2019 \u2014 then {copy} it; don\'t lose "quotes"\nor lines'
    script = Script(["bad", plan("a", "b", "c"), read(), "bad", final("x"), final("y")])
    assert run(agent_with(), script, task).summary == "y"
    assert len(script.prompts) == 6
    assert all(f"Task:\n{task}\n" in p for p in script.prompts)


def test_json_in_history_is_rendered_as_json() -> None:
    agent = agent_with(require_plan=False)
    agent.start(TASK)
    step = finish_batch(agent, agent.reply(call("write_file", path="ü.txt", text='say "hi"')))
    assert json.dumps({"path": "ü.txt", "text": 'say "hi"'}, ensure_ascii=False) in prompt_of(step)
