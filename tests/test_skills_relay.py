"""`Relay(skills_dir=...)` and the worker's read_skill_file, without Redis or workers (the
end to end test is tests/test_runtime_skills.py)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from agent_core import Ask, Config, Skill
from tests.support.skill_repos import REPO_BROKEN, REPO_SKILLS, write_repo
from workers import Relay, RelayError, Settings, ToolRegistrationError

SETTINGS = Settings.from_env({})


def test_skills_dir_offers_every_skill_that_loads_and_logs_the_rest(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="workers.kit.skills"):
        relay = Relay("s", skills_dir=write_repo(tmp_path), settings=SETTINGS)
    assert {s.name for s in relay.skills} == REPO_SKILLS
    assert relay.skills_report is not None
    assert len(relay.skills_report.failed) == len(REPO_BROKEN)
    not_loaded = [m for m in caplog.messages if m.startswith("skill not loaded: ")]
    assert len(not_loaded) == len(REPO_BROKEN)
    assert f"skill not loaded: {tmp_path / 'skills' / 'no-description'}: " in "\n".join(not_loaded)
    assert any(m.startswith("skill warning: ") for m in caplog.messages)
    step = relay.kit.new_agent(Config(require_plan=False)).start("Fill in a form")
    assert isinstance(step, Ask)
    assert "- read_skill_file: " in step.request.system
    assert "- mcp-builder: Guide for creating high-quality MCP servers." in step.request.system


def test_skills_and_skills_dir_add_up(tmp_path: Path) -> None:
    extra = Skill(name="extra", description="d", body="b")
    relay = Relay("s", skills=[extra], skills_dir=write_repo(tmp_path), settings=SETTINGS)
    assert relay.skills[0] == extra
    assert len(relay.skills) == len(REPO_SKILLS) + 1


def test_the_worker_reads_a_skills_file_from_its_own_skills(tmp_path: Path) -> None:
    relay = Relay("s", skills_dir=write_repo(tmp_path), settings=SETTINGS)
    spec = relay.kit.spec("read_skill_file")
    assert spec is not None
    assert spec.idempotent
    forms = tmp_path / "document-skills" / "pdf" / "FORMS.md"
    assert spec.fn(skill="pdf", path="FORMS.md", limit=5_000).text == forms.read_text()
    missing = spec.fn(skill="nope", path="FORMS.md")
    assert (missing.status, missing.text) == (
        "error",
        "no skill named 'nope' is loaded on this worker",
    )
    outside = spec.fn(skill="pdf", path="../../README.md")
    assert outside.status == "error"


def test_a_part_leaves_room_for_its_note_within_the_output_cap(tmp_path: Path) -> None:
    settings = Settings.from_env({"RELAY_TOOL_OUTPUT_CHARS": "500"})
    relay = Relay("s", skills_dir=write_repo(tmp_path), settings=settings)
    spec = relay.kit.spec("read_skill_file")
    assert spec is not None
    part = spec.fn(skill="skill-creator", path="SKILL.md", limit=100_000).text
    assert len(part) <= 500
    assert "read on with offset " in part


def test_without_skills_there_is_no_reader() -> None:
    assert Relay("s", settings=SETTINGS).kit.spec("read_skill_file") is None


@pytest.mark.parametrize("where", ["missing", "file.txt"])
def test_a_skills_dir_that_is_not_a_folder_is_refused(tmp_path: Path, where: str) -> None:
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(RelayError, match=f"^skills_dir: {tmp_path / where}: "):
        Relay("s", skills_dir=tmp_path / where, settings=SETTINGS)


def test_two_skills_with_one_name_are_refused(tmp_path: Path) -> None:
    pdf = Skill(name="pdf", description="mine", body="b")
    with pytest.raises(RelayError, match="two skills are named 'pdf': \\(parsed\\) and /"):
        Relay("s", skills=[pdf], skills_dir=write_repo(tmp_path), settings=SETTINGS)


def test_read_skill_file_is_a_reserved_tool_name() -> None:
    relay = Relay("s", settings=SETTINGS)

    def read_skill_file(path: str) -> str:
        """Read."""
        return path

    with pytest.raises(ToolRegistrationError, match="reserved"):
        relay.tool(read_skill_file)


def test_the_readme_skills_example_runs_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    section = readme.split("\n## Skills\n", 1)[1].split("\n## ", 1)[0]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    (tmp_path / "skills").mkdir()
    write_repo(tmp_path / "skills")
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"Relay": Relay}
    exec(code, namespace)
    relay = namespace["relay"]
    assert isinstance(relay, Relay)
    assert {s.name for s in relay.skills} == REPO_SKILLS
