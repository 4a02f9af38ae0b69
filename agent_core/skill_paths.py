"""What a skill's files may be: the rules both the format and the disk keep.

`agent_core.skills` checks a skill's listed files with them, and
`agent_core.skill_files` lists and reads the files by them; neither imports the
other's half of the work for it (the disk is read only by `skill_files`).
"""

from __future__ import annotations

__all__ = [
    "RESOURCES_MAX",
    "RESOURCE_PATH_MAX",
    "SKILL_MD",
    "SKILL_MD_NAMES",
    "resource_path_problem",
]

SKILL_MD = "SKILL.md"
"""The path `read_skill_file` takes for the skill's own body."""
SKILL_MD_NAMES = (SKILL_MD, "skill.md")
"""The file names a skill folder's SKILL.md may have: the reference implementation
accepts `skill.md` too, after `SKILL.md`."""
RESOURCES_MAX = 200
"""Files of one skill that are listed (and so readable); the rest are left out, with a warning."""
RESOURCE_PATH_MAX = 240


def resource_path_problem(path: object) -> str:
    """Return what makes `path` unusable as a file of a skill, or '' if it is fine.

    A resource is relative, in `/` form, without `.` or `..` parts, empty
    parts, backslashes or unprintable characters, and not too long.
    """
    if not isinstance(path, str) or not path:
        return "must be a non-empty path"
    if len(path) > RESOURCE_PATH_MAX:
        return f"is longer than {RESOURCE_PATH_MAX} characters"
    if path.startswith("/") or "\\" in path:
        return "must be relative to the skill folder, with / between parts"
    if any(part in ("", ".", "..") for part in path.split("/")):
        return "must not have empty, '.' or '..' parts"
    if not path.isprintable():
        return "has characters that cannot be shown"
    return ""
