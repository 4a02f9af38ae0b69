"""Skills on a fleet: a model loads a skill and reads one of its files through a real worker
(`Relay(skills_dir=...)`, the worker's read_skill_file). Real Redis, real worker processes,
a real HTTP model server."""

from __future__ import annotations

from pathlib import Path

from agent_core import Stop
from tests.support.brain import call, final
from tests.support.fleet import fleet
from tests.support.skill_repos import write_skill

STYLE = "Every note starts with the date, as 2024-05-01.\n"


def test_a_model_uses_a_skill_and_reads_its_file_on_a_worker(tmp_path: Path) -> None:
    skills = tmp_path / "skills"
    write_skill(
        skills,
        "house-style",
        "name: house-style\ndescription: How notes are written here. Use before writing one.",
        "# House style\n\nRead references/STYLE.md before writing a note.\n",
        {"references/STYLE.md": STYLE, "scripts/check.py": "print('ok')\n"},
    )
    with fleet(tmp_path, extra_env={"RELAY_TEST_SKILLS": str(skills)}) as f:
        f.brain.script(
            "SKILL-A:",
            {
                # use_skill adds no result line, so turn 0 answers twice, in order.
                0: [
                    call("use_skill", name="house-style"),
                    call("read_skill_file", skill="house-style", path="references/STYLE.md"),
                ],
                1: call("write_note", name="a.txt", text="2024-05-01 hello"),
                2: final("wrote it in the house style"),
            },
        )
        f.worker("--concurrency", "2")
        run_id = f.relay.start("SKILL-A: write a note the house way")
        outcome = f.relay.wait(run_id, timeout=30)
        assert outcome.stop is Stop.DONE, f.logs()
        assert outcome.summary == "wrote it in the house style"
        assert outcome.calls == 1  # the read is not counted against max_calls
        trace = f.relay.trace(run_id)
        [read] = [e for e in trace if e.kind == "result" and e.tool == "read_skill_file"]
        assert (read.call_id, read.text) == ("read-1", STYLE)
        # The model saw the skill's body and file list, then the file itself.
        prompts = [c.prompt for c in f.model.calls if "SKILL-A:" in c.prompt]
        assert "Files of this skill (read one with read_skill_file):" in prompts[1]
        assert "references/STYLE.md, scripts/check.py" in prompts[1]
        assert f"→ ok: {STYLE.rstrip()}" in prompts[2]
        assert (tmp_path / "notes" / "a.txt").read_text() == "2024-05-01 hello"
