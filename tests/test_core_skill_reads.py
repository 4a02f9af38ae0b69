"""Skills with files, played with a scripted model: `use_skill` lists a skill's files and
says how to read the rest of a long body; `read_skill_file` is checked by the agent and
carried out by the host (here the blocking driver, reading real folders)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from agent_core import (
    Agent,
    Ask,
    Config,
    Done,
    Kind,
    ModelRequest,
    Risk,
    Run,
    Skill,
    Stop,
    Tool,
    ToolOutput,
    run,
)
from agent_core.skills import DESCRIPTION_MAX
from agent_core.text import cut
from agent_core.toolbox import body_shown, part_chars
from agent_core.transitions import MAX_SKILL_READS
from tests.support.scripted import Script, batch, call, final, prompt_of
from tests.support.skill_repos import LONG_BODY, write_repo

READ = Tool("read_file", "Read a text file").arg("path", Kind.TEXT).risk(Risk.READ)
NO_PLAN = Config(require_plan=False)
TASK = "Fill in the expense form"

PDF = Skill(
    name="pdf",
    description="Fill PDF forms.",
    body="# PDF\nRead FORMS.md before filling a form.",
    folder="/skills/pdf",
    resources=("FORMS.md", "reference.md", "scripts/fill.py", "templates/forms/FORMS.md"),
)
LONG = Skill(name="creator", description="Create skills.", body=LONG_BODY.strip())
PLAIN = Skill(name="plain", description="No files.", body="Just do it.")


def started(*skills: Skill, config: Config = NO_PLAN) -> Agent:
    agent = Agent(config, [READ]).with_skills(skills)
    agent.start(TASK)
    return agent


def reads(skill: str, path: str, **more: object) -> str:
    return call("read_skill_file", skill=skill, path=path, **more)


# --- what the model is offered and shown --------------------------------------------------


def test_read_skill_file_is_offered_only_when_there_is_something_to_read() -> None:
    plain = Agent(NO_PLAN, [READ]).with_skills([PLAIN]).start(TASK)
    assert isinstance(plain, Ask)
    assert "read_skill_file" not in plain.request.system
    for skill in (PDF, LONG):
        step = Agent(NO_PLAN, [READ]).with_skills([PLAIN, skill]).start(TASK)
        assert isinstance(step, Ask)
        assert "- read_skill_file: Read a file of a skill" in step.request.system
        assert "    offset (integer, optional)" in step.request.system


def test_use_skill_shows_the_body_and_lists_the_files() -> None:
    agent = started(PDF)
    prompt = prompt_of(agent.reply(call("use_skill", name="pdf")))
    assert (
        "You loaded the skill pdf:\n# PDF\nRead FORMS.md before filling a form.\n"
        "Files of this skill (read one with read_skill_file): FORMS.md, reference.md,"
        " scripts/fill.py, templates/forms/FORMS.md"
    ) in prompt


def test_a_long_body_shows_its_first_part_and_how_to_read_on() -> None:
    agent = started(LONG)
    prompt = prompt_of(agent.reply(call("use_skill", name="creator")))
    shown = prompt.split("You loaded the skill creator:\n", 1)[1].split("\n(The SKILL.md")[0]
    limit = body_shown(NO_PLAN)
    assert len(LONG.body) > limit  # the body is longer than the 12,000 once cut to
    assert LONG.body.startswith(shown)
    assert limit // 2 <= len(shown) <= limit
    assert shown.endswith("\n")  # ends at a line break
    hint = re.search(r"read them with (\{.*\})\.\)", prompt)
    assert hint is not None
    assert json.loads(hint.group(1)) == {
        "tool": "read_skill_file",
        "args": {"skill": "creator", "path": "SKILL.md", "offset": len(shown)},
    }
    assert f"goes on for {len(LONG.body) - len(shown)} more characters" in prompt


def test_a_skill_without_instructions_says_so() -> None:
    empty = Skill(name="empty", description="Only scripts.", body="", resources=("run.sh",))
    prompt = prompt_of(started(empty).reply(call("use_skill", name="empty")))
    assert "You loaded the skill empty:\n(It has no instructions beyond its description.)" in prompt


def test_a_long_description_is_cut_in_the_prompt_but_kept() -> None:
    wordy = Skill(name="wordy", description="w" * 1068, body="b")
    step = Agent(NO_PLAN, [READ]).with_skills([wordy]).start(TASK)
    assert isinstance(step, Ask)
    shown = cut(wordy.description, DESCRIPTION_MAX)
    assert len(shown) <= DESCRIPTION_MAX
    assert shown.endswith("more characters]")
    assert step.request.system.endswith(f"- wordy: {shown}")
    assert "w" * 1068 not in step.request.system
    assert wordy.description == "w" * 1068


# --- a read is a call the host carries out --------------------------------------------------


def test_a_read_is_a_run_step_the_host_carries_out() -> None:
    agent = started(PDF)
    step = agent.reply(reads("pdf", "FORMS.md", limit=10**9))  # the model's limit is dropped
    assert isinstance(step, Run)
    assert step.call.model_dump() == {
        "id": "read-1",
        "tool": "read_skill_file",
        "args": {"skill": "pdf", "path": "FORMS.md", "limit": part_chars(NO_PLAN)},
        "risk": Risk.READ,
        "ask": False,
        "summary": "read_skill_file(pdf/FORMS.md)",
    }
    prompt = prompt_of(agent.result("read-1", ToolOutput.ok("# Forms\nStep one.")))
    assert '[read-1] read_skill_file {"skill": "pdf", "path": "FORMS.md"' in prompt
    assert "→ ok: # Forms\nStep one." in prompt
    assert "Calls left: 12." in prompt  # not counted against max_calls


def test_a_read_with_an_offset_keeps_it_and_numbers_reads_on_their_own() -> None:
    agent = started(PDF, config=Config(require_plan=False, history_chars=4_000))
    agent.reply(call("read_file", path="notes.txt"))
    agent.result("call-1", ToolOutput.ok("notes"))
    step = agent.reply(reads("pdf", "reference.md", offset=300))
    assert isinstance(step, Run)
    assert (step.call.id, step.call.args) == (
        "read-1",
        {"skill": "pdf", "path": "reference.md", "offset": 300, "limit": 800},
    )
    assert step.call.summary == "read_skill_file(pdf/reference.md from 300)"
    agent.result("read-1", ToolOutput.ok("part"))
    step = agent.reply(call("read_file", path="b.txt"))
    assert isinstance(step, Run)
    assert step.call.id == "call-2"  # reads take no number from the calls
    agent.result("call-2", ToolOutput.ok("b"))
    done = agent.reply(final("done"))
    assert isinstance(done, Done)
    assert done.outcome.calls == 2


@pytest.mark.parametrize(
    ("given", "path"),
    [
        ("FORMS.md", "FORMS.md"),
        ("./reference.md", "reference.md"),
        ("pdf/scripts/fill.py", "scripts/fill.py"),
        ("fill.py", "scripts/fill.py"),  # a bare name only one file has
        ("skill.md", "SKILL.md"),
        ("SKILL.md", "SKILL.md"),
    ],
)
def test_the_path_the_model_means_is_found(given: str, path: str) -> None:
    step = started(PDF).reply(reads("pdf", given))
    assert isinstance(step, Run)
    assert step.call.args["path"] == path


@pytest.mark.parametrize(
    ("reply", "problem"),
    [
        (reads("pdf", "../../etc/passwd"), "read_skill_file: '../../etc/passwd' is not a file"),
        (reads("pdf", "/etc/passwd"), "read_skill_file: '/etc/passwd' is not a file"),
        (reads("pdf", "missing.md"), "its files are: SKILL.md, FORMS.md, reference.md"),
        # FORMS.md is two files' name: the model must say which.
        (reads("pdf", "forms/FORMS.md"), "'forms/FORMS.md' is not a file of the skill pdf"),
        (reads("docx", "FORMS.md"), "there is no skill named 'docx'; the skills are: pdf"),
        (reads("pdf", "FORMS.md", offset=-5), "the offset must be 0 or more"),
        (reads("pdf", "FORMS.md", offset="soon"), "'offset' must be a number"),
        (call("read_skill_file", skill="pdf"), "'path' is required"),
        (
            batch(("read_skill_file", {"skill": "pdf", "path": "FORMS.md"}), ("read_file", {})),
            "read_skill_file goes in a reply of its own",
        ),
    ],
)
def test_a_wrong_read_is_explained_and_retried(reply: str, problem: str) -> None:
    agent = started(PDF, config=Config(require_plan=False, max_batch=4))
    step = agent.reply(reply)
    assert isinstance(step, Ask)
    assert problem in prompt_of(step)


def test_reads_are_capped_per_task() -> None:
    agent = started(PDF)
    for n in range(1, MAX_SKILL_READS + 1):
        step = agent.reply(reads("pdf", "FORMS.md"))
        assert isinstance(step, Run)
        # A new part each time: the same read with the same result would be no progress.
        agent.result(f"read-{n}", ToolOutput.ok(f"forms, part {n}"))
    step = agent.reply(reads("pdf", "FORMS.md"))
    assert f"a task may read at most {MAX_SKILL_READS} skill files" in prompt_of(step)


def test_without_skills_read_skill_file_is_unknown() -> None:
    agent = Agent(NO_PLAN, [READ])
    agent.start(TASK)
    assert "there is no tool named 'read_skill_file'" in prompt_of(agent.reply(reads("a", "b")))


def test_a_snapshot_mid_read_restores_with_the_skill_and_without_file_contents() -> None:
    agent = started(PDF)
    agent.reply(reads("pdf", "FORMS.md"))
    saved = agent.snapshot()
    assert '"folder":"/skills/pdf"' in saved
    assert '"resources":["FORMS.md"' in saved
    restored = Agent.restore(NO_PLAN, [READ], saved)
    assert restored.resume() == agent.resume()
    assert restored.skill("pdf") == PDF
    step = restored.result("read-1", ToolOutput.ok("the form text"))
    assert "→ ok: the form text" in prompt_of(step)


# --- the blocking driver reads real folders --------------------------------------------------


@pytest.fixture
def repo(tmp_path: Path) -> dict[str, Skill]:
    return {s.name: s for s in Skill.load_all(write_repo(tmp_path)).skills}


def test_run_reads_a_skill_file_from_its_folder(repo: dict[str, Skill]) -> None:
    host = Script(
        [
            call("use_skill", name="pdf"),
            reads("pdf", "FORMS.md"),
            final("Filled it in, following FORMS.md."),
        ]
    )
    agent = Agent(NO_PLAN, [READ]).with_skills(repo.values())
    outcome = run(agent, host, TASK)
    assert outcome.stop is Stop.DONE
    assert host.calls == []  # the host's run_tool never sees read_skill_file
    forms = (Path(repo["pdf"].folder) / "FORMS.md").read_text()
    assert f"→ ok: {forms.rstrip()}" in host.prompts[-1]


class PartReader(Script):
    """A model that loads a skill, then reads its SKILL.md on from each offset it is told,
    and answers once a part says it is the end."""

    def __init__(self, skill: str) -> None:
        super().__init__([call("use_skill", name=skill)])
        self.skill = skill

    def ask_model(self, request: ModelRequest) -> str:
        if self.replies:
            return super().ask_model(request)
        self.requests.append(request)
        if "\n[SKILL.md: the end," in request.prompt.rsplit("→ ", 1)[-1]:
            return final("read it all")
        told = re.findall(r'(?:"offset": |read on with offset )(\d+)', request.prompt)
        return reads(self.skill, "SKILL.md", offset=int(told[-1]))


def test_run_reads_a_long_body_in_parts(repo: dict[str, Skill]) -> None:
    creator = repo["skill-creator"]
    host = PartReader("skill-creator")
    outcome = run(Agent(NO_PLAN, [READ]).with_skills([creator]), host, TASK)
    assert outcome.stop is Stop.DONE
    first = host.prompts[1].split("You loaded the skill skill-creator:\n", 1)[1]
    first = first.split("\n(The SKILL.md goes on", 1)[0]
    parts = [p.rsplit("→ ok: ", 1)[1].rsplit("\n[SKILL.md: ", 1)[0] for p in host.prompts[2:]]
    assert len(first) <= body_shown(NO_PLAN)
    assert len(parts) >= 2
    assert all(len(part) <= part_chars(NO_PLAN) for part in parts)
    assert first + "".join(parts) == creator.body


def test_run_tells_the_model_when_a_file_cannot_be_read(
    repo: dict[str, Skill], tmp_path: Path
) -> None:
    pdf = repo["pdf"]
    (Path(pdf.folder) / "FORMS.md").unlink()
    (Path(pdf.folder) / "FORMS.md").symlink_to(tmp_path / "README.md")
    host = Script([reads("pdf", "FORMS.md"), final("gave up")])
    outcome = run(Agent(NO_PLAN, [READ]).with_skills([pdf]), host, TASK)
    assert outcome.summary == "gave up"
    assert "→ error: FORMS.md: leads outside the skill folder" in host.prompts[-1]
