"""The agent's extras played with a scripted model: specialists, memory, questions, skills,
attachments and summaries."""

from __future__ import annotations

import re

import pytest

from agent_core import (
    Agent,
    Ask,
    Attachment,
    Config,
    DefinitionError,
    Done,
    Kind,
    Policy,
    Question,
    Risk,
    Run,
    Skill,
    Specialist,
    Step,
    Stop,
    Summarize,
    Tool,
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

READ = Tool("read_file", "Read a text file").arg("path", Kind.TEXT).risk(Risk.READ)
WRITE = Tool("write_file", "Write a text file").arg("path", Kind.TEXT).arg("text", Kind.TEXT)
SEARCH = Tool("search_web", "Search the web").arg("query", Kind.TEXT).risk(Risk.OUTSIDE)
TOOLS = [READ, WRITE, SEARCH]
NO_PLAN = Config(require_plan=False)
TASK = "Tidy the notes folder"

READER = (
    Specialist("reader", "Reads files and quotes them")
    .tools(["read_file"])
    .instructions("Quote every line exactly; never paraphrase.")
)
MANAGER = (
    Specialist("manager", "Reorganises files")
    .tools(["read_file", "write_file"])
    .instructions("Plan the moves, then do them.")
)


def delegate(specialist: str, task: str) -> str:
    return call("delegate", specialist=specialist, task=task)


def system_of(step: Step) -> str:
    assert isinstance(step, Ask | Summarize), f"expected a model request, got {step!r}"
    return step.request.system


def tool_names_in(system: str) -> set[str]:
    tools = system.split("Tools:\n", 1)[1].split("\n\n", 1)[0]
    return set(re.findall(r"^- ([a-z_]+):", tools, flags=re.MULTILINE))


# --- specialists ------------------------------------------------------------------------------


def test_the_parent_sees_the_delegate_tool_with_names_and_descriptions() -> None:
    step = Agent(Config(), TOOLS).with_specialists([READER, MANAGER]).start(TASK)
    system = system_of(step)
    assert tool_names_in(system) == {"read_file", "write_file", "search_web", "delegate"}
    assert "reader: Reads files and quotes them" in system
    assert "manager: Reorganises files" in system
    assert "specialist (text)" in system
    assert "task (text)" in system
    assert "Quote every line exactly" not in system
    assert "Plan the moves" not in system


def test_without_specialists_there_is_no_delegate_tool() -> None:
    agent = Agent(NO_PLAN, TOOLS)
    step = agent.start(TASK)
    assert "delegate" not in tool_names_in(system_of(step))
    assert "there is no tool named 'delegate'" in prompt_of(agent.reply(delegate("reader", "x")))


def test_a_delegate_call_counts_and_never_asks() -> None:
    everything = Policy(ask=frozenset(Risk))
    agent = Agent(Config(require_plan=False, policy=everything), TOOLS).with_specialists([READER])
    agent.start(TASK)
    step = agent.reply(delegate("reader", "Quote notes.txt"))
    assert isinstance(step, Run)
    assert step.call.tool == "delegate"
    assert step.call.args == {"specialist": "reader", "task": "Quote notes.txt"}
    assert step.call.ask is False
    step = agent.result(step.call.id, ToolOutput.ok("quoted"))
    assert "Calls left: 11" in prompt_of(step)


def test_start_child_gives_a_started_child_with_only_its_tools() -> None:
    parent = Agent(Config(), TOOLS).with_specialists([READER, MANAGER])
    begin(parent, TASK, "Ask the reader")
    step = parent.reply(delegate("reader", "Quote notes.txt"))
    assert isinstance(step, Run)
    child = parent.start_child(step.call)
    first = child.resume()
    assert isinstance(first, Ask)
    assert tool_names_in(system_of(first)) == {"read_file"}
    for absent in ("write_file", "search_web", "delegate", "manager"):
        assert absent not in system_of(first)
    assert "You are the specialist reader" in system_of(first)
    assert "Quote every line exactly; never paraphrase." in system_of(first)
    prompt = prompt_of(first)
    assert "Task:\nQuote notes.txt" in prompt
    assert TASK in prompt  # the larger task, as context
    assert "Reply now with your plan" not in prompt  # no plan of its own
    assert parent.resume() == step  # the parent still waits for the delegate call


def test_a_child_asking_for_a_tool_it_lacks_is_told_it_is_unknown() -> None:
    parent = Agent(NO_PLAN, TOOLS).with_specialists([READER])
    parent.start(TASK)
    child = parent.start_child(parent.reply(delegate("reader", "Quote it")).call)  # type: ignore[union-attr]
    step = child.reply(call("write_file", path="x", text="y"))
    assert isinstance(step, Ask)
    assert "there is no tool named 'write_file'; the tools are: read_file" in prompt_of(step)
    assert isinstance(child.reply(call("read_file", path="notes.txt")), Run)


def test_an_unknown_specialist_is_explained_to_the_model() -> None:
    agent = Agent(NO_PLAN, TOOLS).with_specialists([READER, MANAGER])
    agent.start(TASK)
    step = agent.reply(delegate("ghost", "Boo"))
    assert isinstance(step, Ask)
    assert "there is no specialist named 'ghost'; the specialists are: reader, manager" in (
        prompt_of(step)
    )


def test_grandchildren_cannot_delegate_further() -> None:
    parent = Agent(NO_PLAN, TOOLS).with_specialists([READER, MANAGER])
    parent.start(TASK)
    child = parent.start_child(parent.reply(delegate("manager", "Reorganise")).call)  # type: ignore[union-attr]
    child_step = child.resume()
    assert tool_names_in(system_of(child_step)) == {"read_file", "write_file", "delegate"}
    assert "reader: Reads files" in system_of(child_step)
    assert "manager: Reorganises" not in system_of(child_step)  # not itself
    grandchild = child.start_child(child.reply(delegate("reader", "Quote a.txt")).call)  # type: ignore[union-attr]
    step = grandchild.resume()
    assert tool_names_in(system_of(step)) == {"read_file"}
    step = grandchild.reply(delegate("reader", "Quote b.txt"))
    assert "there is no tool named 'delegate'" in prompt_of(step)


def test_a_child_cannot_delegate_to_a_specialist_with_tools_it_lacks() -> None:
    parent = Agent(NO_PLAN, TOOLS).with_specialists([READER, MANAGER])
    parent.start(TASK)
    child = parent.start_child(parent.reply(delegate("reader", "Quote")).call)  # type: ignore[union-attr]
    assert "delegate" not in tool_names_in(system_of(child.resume()))


def test_start_child_refuses_what_is_not_a_delegate_call() -> None:
    agent = Agent(NO_PLAN, TOOLS).with_specialists([READER])
    agent.start(TASK)
    step = agent.reply(call("read_file", path="a"))
    assert isinstance(step, Run)
    with pytest.raises(UsageError):
        agent.start_child(step.call)
    with pytest.raises(UsageError):
        agent.start_child("delegate")  # type: ignore[arg-type]


def test_a_specialist_listing_a_tool_the_agent_lacks_is_refused() -> None:
    stranger = Specialist("mailer", "Sends mail").tools(["send_mail"])
    with pytest.raises(DefinitionError):
        Agent(NO_PLAN, TOOLS).with_specialists([stranger])
    with pytest.raises(DefinitionError):
        Agent(NO_PLAN, TOOLS).with_specialists([READER, READER])
    with pytest.raises(DefinitionError):
        Specialist("x", "y").tools(["read_file", "read_file"])


def test_run_drives_the_child_and_its_summary_becomes_the_result() -> None:
    script = Script(
        [
            plan("Ask the reader", "Report"),
            delegate("reader", "Quote notes.txt"),
            # the child:
            call("read_file", path="notes.txt"),
            final("notes.txt says: buy milk"),
            # the parent again:
            final("The notes say to buy milk"),
        ],
        tools={"read_file": lambda _a: "buy milk"},
    )
    outcome = run(Agent(Config(), TOOLS).with_specialists([READER]), script, TASK)
    assert outcome.stop is Stop.DONE
    assert outcome.summary == "The notes say to buy milk"
    assert outcome.calls == 1  # the child's own calls are its own
    assert [r.system.startswith("You are the specialist reader") for r in script.requests] == [
        False,
        False,
        True,
        True,
        False,
    ]
    assert "→ ok: notes.txt says: buy milk" in script.prompts[-1]
    assert [c.tool for c in script.calls] == ["read_file"]


def test_run_reports_a_child_that_stopped_as_an_error() -> None:
    script = Script(
        [
            delegate("reader", "Quote it"),
            "junk",
            "junk",
            "junk",
            "junk",
            final("The reader failed"),
        ],
    )
    outcome = run(Agent(NO_PLAN, TOOLS).with_specialists([READER]), script, TASK)
    assert outcome.summary == "The reader failed"
    assert "→ error: the specialist stopped: too many unusable replies" in script.prompts[-1]


# --- memory -------------------------------------------------------------------------------------


def test_memory_shows_the_newest_twenty_notes_each_cut() -> None:
    notes = [f"note-{n:02d} " + "x" * (50 if n != 29 else 1_000) for n in range(30)]
    step = Agent(NO_PLAN, TOOLS).with_memory(notes).start(TASK)
    prompt = prompt_of(step)
    shown = re.findall(r"^- (note-\d\d)", prompt, flags=re.MULTILINE)
    assert shown == [f"note-{n:02d}" for n in range(10, 30)]
    newest = prompt[prompt.index("- note-29") + 2 :].split("\n\n", 1)[0]
    assert len(newest) <= 300
    assert re.search(r"\n\[… cut: \d+ more characters\]$", newest)


def test_remember_is_handled_by_the_agent_and_not_counted() -> None:
    agent = Agent(Config(require_plan=False, max_calls=1), TOOLS).with_memory([])
    step = agent.start(TASK)
    assert "remember" in tool_names_in(system_of(step))
    for note in ("Backups go in /bak", "The user prefers short answers"):
        step = agent.reply(call("remember", note=note))
        assert isinstance(step, Ask)
        assert f"You noted: {note}" in prompt_of(step)
    assert "Calls left: 1" in prompt_of(step)
    assert agent.new_notes() == ["Backups go in /bak", "The user prefers short answers"]
    step = agent.reply(call("read_file", path="a"))
    assert isinstance(step, Run)
    assert step.call.id == "call-1"


def test_a_long_note_is_cut_and_an_empty_one_refused() -> None:
    agent = Agent(NO_PLAN, TOOLS).with_memory(["old"])
    agent.start(TASK)
    agent.reply(call("remember", note="n" * 1_000))
    assert len(agent.new_notes()[0]) <= 300
    step = agent.reply(call("remember", note="   "))
    assert "remember: the note is empty" in prompt_of(step)
    assert len(agent.new_notes()) == 1


def test_without_memory_remember_is_unknown() -> None:
    agent = Agent(NO_PLAN, TOOLS)
    step = agent.start(TASK)
    assert "remember" not in tool_names_in(system_of(step))
    assert "there is no tool named 'remember'" in prompt_of(agent.reply(call("remember", note="x")))
    assert agent.new_notes() == []


# --- questions -------------------------------------------------------------------------------


def test_ask_user_becomes_a_question_and_the_answer_continues() -> None:
    agent = Agent(Config(require_plan=False, max_calls=1), TOOLS).with_questions()
    step = agent.start(TASK)
    assert '{"ask_user": "question"}' in system_of(step)
    step = agent.reply('{"ask_user": "Which folder?"}')
    assert step == Question(text="Which folder?")
    step = agent.answer("The one called notes")
    assert "You asked the person: Which folder?\n→ they answered: The one called notes" in (
        prompt_of(step)
    )
    assert "Calls left: 1" in prompt_of(step)


def test_without_with_questions_ask_user_is_retried() -> None:
    agent = Agent(NO_PLAN, TOOLS)
    step = agent.start(TASK)
    assert "ask_user" not in system_of(step)
    step = agent.reply('{"ask_user": "Which folder?"}')
    assert isinstance(step, Ask)
    assert "you cannot ask the person here" in prompt_of(step)


def test_run_without_ask_person_tells_the_model_it_cannot_ask() -> None:
    script = Script(['{"ask_user": "Which folder?"}', final("Assumed notes/")])
    outcome = run(Agent(NO_PLAN, TOOLS).with_questions(), script, TASK)
    assert outcome.summary == "Assumed notes/"
    assert "→ they answered: (The person cannot be asked right now." in script.prompts[-1]


def test_run_with_ask_person_passes_the_answer() -> None:
    asked: list[str] = []

    def person(question: str) -> str:
        asked.append(question)
        return "notes/"

    script = Script(['{"ask_user": "Which folder?"}', final("Tidied notes/")], ask_person=person)
    run(Agent(NO_PLAN, TOOLS).with_questions(), script, TASK)
    assert asked == ["Which folder?"]
    assert "→ they answered: notes/" in script.prompts[-1]


def test_children_may_ask_when_the_parent_may() -> None:
    parent = Agent(NO_PLAN, TOOLS).with_questions().with_specialists([READER])
    parent.start(TASK)
    child = parent.start_child(parent.reply(delegate("reader", "Quote")).call)  # type: ignore[union-attr]
    assert isinstance(child.reply('{"ask_user": "Which file?"}'), Question)


# --- skills ---------------------------------------------------------------------------------

SKILLS = [
    Skill.parse(
        f"---\nname: skill-{n}\ndescription: How to handle {n} files\n---\n# {n}\nSECRET-{n} steps."
    )
    for n in ("csv", "pdf", "xml", "png", "zip", "tar", "ods")
]


def test_only_names_and_descriptions_show_until_use_skill() -> None:
    agent = Agent(NO_PLAN, TOOLS).with_skills(SKILLS)
    step = agent.start(TASK)
    assert "use_skill" in tool_names_in(system_of(step))
    assert "- skill-csv: How to handle csv files" in system_of(step)
    assert "SECRET" not in system_of(step)
    assert "SECRET" not in prompt_of(step)
    step = agent.reply(call("use_skill", name="skill-csv"))
    assert isinstance(step, Ask)
    assert "You loaded the skill skill-csv:\n# csv\nSECRET-csv steps." in prompt_of(step)
    assert "SECRET-pdf" not in prompt_of(step)
    assert "Calls left: 12" in prompt_of(step)


def test_at_most_six_skills_a_task() -> None:
    agent = Agent(NO_PLAN, TOOLS).with_skills(SKILLS)
    agent.start(TASK)
    for skill in SKILLS[:6]:
        step = agent.reply(call("use_skill", name=skill.name))
        assert "could not be used" not in prompt_of(step)
    step = agent.reply(call("use_skill", name=SKILLS[6].name))
    assert "a task may load at most 6 skills" in prompt_of(step)
    assert "SECRET-ods" not in prompt_of(step)


def test_an_unknown_or_repeated_skill_is_explained() -> None:
    agent = Agent(NO_PLAN, TOOLS).with_skills(SKILLS[:2])
    agent.start(TASK)
    step = agent.reply(call("use_skill", name="skill-doc"))
    assert "there is no skill named 'skill-doc'; the skills are: skill-csv, skill-pdf" in (
        prompt_of(step)
    )
    agent.reply(call("use_skill", name="skill-pdf"))
    step = agent.reply(call("use_skill", name="skill-pdf"))
    assert "the skill skill-pdf is already loaded above" in prompt_of(step)


def test_without_skills_use_skill_is_unknown() -> None:
    agent = Agent(NO_PLAN, TOOLS)
    agent.start(TASK)
    assert "there is no tool named 'use_skill'" in prompt_of(
        agent.reply(call("use_skill", name="skill-csv"))
    )


def test_two_skills_with_one_name_are_refused() -> None:
    with pytest.raises(DefinitionError):
        Agent(NO_PLAN, TOOLS).with_skills([SKILLS[0], SKILLS[0]])


def test_configuring_after_start_is_refused() -> None:
    agent = Agent(NO_PLAN, TOOLS)
    agent.start(TASK)
    with pytest.raises(UsageError):
        agent.with_questions()
    for configure in (agent.with_memory, agent.with_skills, agent.with_specialists):
        with pytest.raises(UsageError):
            configure([])


# --- the agent's own tools go in a reply of their own -------------------------------------------

MIXED = {
    "remember": (("remember", {"note": "x"}), "remember goes in a reply of its own"),
    "use_skill": (("use_skill", {"name": "skill-csv"}), "use_skill goes in a reply of its own"),
    "ask_user": (("ask_user", {"question": "?"}), 'ask_user is not a tool: reply {"ask_user"'),
}


@pytest.mark.parametrize(("own", "reason"), MIXED.values(), ids=MIXED.keys())
def test_own_tools_mixed_into_a_batch_are_explained(
    own: tuple[str, dict[str, str]], reason: str
) -> None:
    agent = (
        Agent(Config(require_plan=False, max_batch=3), TOOLS)
        .with_memory([])
        .with_skills(SKILLS)
        .with_questions()
    )
    agent.start(TASK)
    step = agent.reply(batch(("read_file", {"path": "a"}), own))
    assert isinstance(step, Ask)
    assert reason in prompt_of(step)
    assert agent.new_notes() == []
    assert "You loaded the skill" not in prompt_of(step)


# --- attachments ------------------------------------------------------------------------------

PHOTO = Attachment("photo.png", "image/png", b"\x89PNG\r\n\x1a\n\x00\xff\xfe" + bytes(range(256)))
SHEET = Attachment("sheet.csv", "text/csv", b"a,b\n1,2\n")


def test_attachments_go_on_every_model_request() -> None:
    agent = Agent(Config(max_batch=2), TOOLS)
    requests = []
    step = agent.start_with(TASK, "context", [PHOTO, SHEET])
    requests.append(step)
    step = agent.reply("garbage")
    requests.append(step)
    agent.reply(plan("Look", "Think", "Answer"))
    step = agent.approve_plan(True)
    requests.append(step)
    step = finish_batch(agent, agent.reply(call("read_file", path="a")))
    requests.append(step)
    done = agent.reply(final("Seen"))
    assert isinstance(done, Ask)  # too early, sent back
    requests.append(done)
    for each in requests:
        assert isinstance(each, Ask)
        assert each.request.attachments == (PHOTO, SHEET)
        assert "Files attached: photo.png (image/png), sheet.csv (text/csv)" in each.request.prompt


def test_attachments_round_trip_through_the_snapshot() -> None:
    agent = Agent(NO_PLAN, TOOLS)
    agent.start_with(TASK, "", [PHOTO])
    saved = agent.snapshot()
    assert "photo.png" in saved
    restored = Agent.restore(NO_PLAN, TOOLS, saved)
    step = restored.resume()
    assert isinstance(step, Ask)
    assert step.request.attachments[0].data == PHOTO.data
    assert restored.snapshot() == saved


def test_a_child_gets_no_attachments_it_was_not_given() -> None:
    parent = Agent(NO_PLAN, TOOLS).with_specialists([READER])
    parent.start_with(TASK, "", [PHOTO])
    step = parent.reply(delegate("reader", "Quote"))
    assert isinstance(step, Run)
    child = parent.start_child(step.call)
    first = child.resume()
    assert isinstance(first, Ask)
    assert first.request.attachments == ()
    assert "photo.png" not in first.request.prompt
    assert "Files attached" not in first.request.prompt
    assert "photo.png" not in child.snapshot()


# --- summaries --------------------------------------------------------------------------------

SUMMARIZING = Config(require_plan=False, summarize=True, history_chars=1_000, max_calls=50)


def _grow(agent: Agent, turns: int, size: int = 300) -> Step:
    step: Step = agent.resume()
    for turn in range(turns):
        if not isinstance(step, Ask):
            return step
        step = agent.reply(call("read_file", path=f"part-{turn}.txt"))
        step = agent.result(step.call.id, ToolOutput.ok(f"PART-{turn} " + "p" * size))  # type: ignore[union-attr]
    return step


def test_a_summary_is_asked_for_once_history_passes_history_chars() -> None:
    agent = Agent(SUMMARIZING, TOOLS)
    agent.start(TASK)
    step = _grow(agent, 10)
    assert isinstance(step, Summarize)
    prompt = prompt_of(step)
    assert "Earlier work to fold in:" in prompt
    assert "PART-0 " in prompt
    assert f"Task:\n{TASK}" in prompt
    assert "plain text (not JSON)" in prompt
    step = agent.reply("Read parts 0 to 1; nothing odd.")
    assert isinstance(step, Ask)
    after = prompt_of(step)
    assert "Summary of earlier work:\nRead parts 0 to 1; nothing odd." in after
    assert "PART-0 " not in after
    newest = max(int(n) for n in re.findall(r"PART-(\d+) ", after))
    assert "PART-" in after
    assert f"PART-{newest} " in after


def test_without_summarize_old_turns_are_dropped_instead() -> None:
    agent = Agent(Config(require_plan=False, history_chars=1_000), TOOLS)
    agent.start(TASK)
    step = _grow(agent, 10)
    assert isinstance(step, Ask)
    assert "PART-0 " not in prompt_of(step)
    assert "PART-9 " in prompt_of(step)


def test_a_summary_folds_into_the_one_before() -> None:
    agent = Agent(SUMMARIZING, TOOLS)
    agent.start(TASK)
    step = _grow(agent, 10)
    agent.reply("FIRST SUMMARY")
    step = _grow(agent, 10)
    assert isinstance(step, Summarize)
    assert "Summary so far:\nFIRST SUMMARY" in prompt_of(step)
    step = agent.reply("SECOND SUMMARY")
    assert "Summary of earlier work:\nSECOND SUMMARY" in prompt_of(step)
    assert "FIRST SUMMARY" not in prompt_of(step)


def test_an_empty_summary_is_retried() -> None:
    agent = Agent(SUMMARIZING, TOOLS)
    agent.start(TASK)
    step = _grow(agent, 10)
    assert isinstance(step, Summarize)
    again = agent.reply("   ")
    assert isinstance(again, Summarize)
    assert isinstance(agent.reply("A summary."), Ask)


def test_failed_summaries_stop_the_run_like_failed_asks() -> None:
    agent = Agent(SUMMARIZING, TOOLS)
    agent.start(TASK)
    assert isinstance(_grow(agent, 10), Summarize)
    for _ in range(3):
        assert isinstance(agent.fail("timeout"), Summarize)
    step = agent.fail("timeout")
    assert isinstance(step, Done)
    assert step.outcome.stop is Stop.MODEL_FAILED


def test_a_snapshot_at_a_summary_resumes_there() -> None:
    agent = Agent(SUMMARIZING, TOOLS)
    agent.start(TASK)
    step = _grow(agent, 10)
    assert isinstance(step, Summarize)
    restored = Agent.restore(SUMMARIZING, TOOLS, agent.snapshot())
    assert restored.resume() == step
    assert restored.reply("Folded.") == agent.reply("Folded.")


def test_run_uses_the_host_summarize_when_present() -> None:
    summaries: list[str] = []

    def summarize(request: object) -> str:
        summaries.append("asked")
        return "Folded by the host."

    replies = [call("read_file", path=f"p{n}") for n in range(10)] + [final("done")]
    script = Script(
        replies, tools={"read_file": lambda a: f"{a['path']} " + "q" * 300}, summarize=summarize
    )
    outcome = run(Agent(SUMMARIZING, TOOLS), script, TASK)
    assert outcome.stop is Stop.DONE
    assert summaries
    assert any("Summary of earlier work:\nFolded by the host." in p for p in script.prompts)


def test_run_asks_the_model_for_summaries_by_default() -> None:
    replies: list[str | BaseException] = [call("read_file", path=f"p{n}") for n in range(5)]
    replies += ["Model summary.", *[call("read_file", path=f"q{n}") for n in range(2)], final("ok")]
    script = Script(replies, tools={"read_file": lambda _a: "r" * 400})
    outcome = run(Agent(SUMMARIZING, TOOLS), script, TASK)
    assert outcome.stop is Stop.DONE
    assert any(r.system.startswith("You keep an agent's notes short") for r in script.requests)


def test_the_summary_request_carries_the_attachments() -> None:
    # DESIGN §2: attachments go on every ModelRequest, summaries included.
    agent = Agent(SUMMARIZING, TOOLS)
    agent.start_with(TASK, "", [SHEET])
    step = _grow(agent, 10)
    assert isinstance(step, Summarize)
    assert step.request.attachments == (SHEET,)
