"""Skills on a worker: the skills a Relay offers, and the tool that reads their files.

The core checks each `read_skill_file` call (a skill it offers, one of that
skill's listed files or its `SKILL.md`) and sends it like any READ call; a
worker runs it with the `ToolSpec` made here, through
`agent_core.skill_files.read_part`, which confines it to the skill's folder.
The skill is looked up by name among the worker's own skills (its Relay's
`skills` and `skills_dir`), never taken from the run's snapshot: what a
worker reads is decided by its own configuration and disk.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

from agent_core import Skill, SkillReport, ToolOutput
from agent_core.errors import SkillError
from agent_core.skill_files import read_part
from agent_core.toolbox import READ_SKILL_FILE_TOOL
from workers.errors import RelayError
from workers.kit.tools import ToolSpec

__all__ = ["gather_skills", "skill_reader"]

log = logging.getLogger(__name__)

NOTE_ROOM = 200
"""Characters kept free in a tool output for the note that says where to read on."""


def gather_skills(
    skills: Sequence[Skill], skills_dir: str | os.PathLike[str] | None
) -> tuple[tuple[Skill, ...], SkillReport | None]:
    """Return `skills` and those under `skills_dir`, and the report of reading the folder.

    A folder under `skills_dir` that cannot be loaded is left out and logged
    (as is each warning); the report keeps them for a program to check.

    Raises:
        RelayError: `skills_dir` is not a readable folder, or two skills share a name.
    """
    if skills_dir is None:
        return _unique(tuple(skills)), None
    try:
        report = Skill.load_all(skills_dir)
    except SkillError as error:
        raise RelayError(f"skills_dir: {error}") from None
    for issue in report.failed:
        log.warning("skill not loaded: %s: %s", issue.path, issue.text)
    for issue in report.warnings:
        log.warning("skill warning: %s: %s", issue.path, issue.text)
    return _unique((*skills, *report.skills)), report


def _unique(skills: tuple[Skill, ...]) -> tuple[Skill, ...]:
    seen: dict[str, Skill] = {}
    for skill in skills:
        if not isinstance(skill, Skill):
            raise RelayError(f"skills must be Skill values, got {type(skill).__name__}")
        if skill.name in seen:
            where = [s.folder or "(parsed)" for s in (seen[skill.name], skill)]
            raise RelayError(f"two skills are named {skill.name!r}: {where[0]} and {where[1]}")
        seen[skill.name] = skill
    return skills


def skill_reader(skills: Sequence[Skill], output_chars: int) -> ToolSpec:
    """Return the spec that runs `read_skill_file` over `skills`.

    A part holds at most `output_chars` characters with its note, so the
    worker's cap on tool output never cuts off where to read on.
    """
    by_name = {skill.name: skill for skill in skills}
    most = max(1, output_chars - NOTE_ROOM)

    def read_skill_file(skill: str, path: str, offset: int = 0, limit: int = most) -> ToolOutput:
        found = by_name.get(skill)
        if found is None:
            return ToolOutput.error(f"no skill named {skill!r} is loaded on this worker")
        return read_part(found, path, offset, min(limit, most))

    return ToolSpec(READ_SKILL_FILE_TOOL, read_skill_file, idempotent=True)
