"""Skills: instruction packs in the open Agent Skills `SKILL.md` format.

A SKILL.md is YAML front matter between two `---` lines, then Markdown:

    ---
    name: pdf-processing
    description: Extract text from PDFs. Use when the user mentions PDFs.
    license: Apache-2.0
    ---
    # PDF processing
    ...

`Skill.parse` keeps the name, the description and the body. Other keys
(`license`, `compatibility`, `metadata`, `allowed-tools`, ...) are accepted and
dropped: the model is shown only the name and description, and arbitrary YAML
(possibly an alias bomb or a self-referencing list) must not reach a snapshot.

The text may come from anywhere, so parsing is bounded: the front matter is
capped in size and in bracket depth before PyYAML sees it, and whatever PyYAML
raises on what remains becomes a `SkillError`.
"""

from __future__ import annotations

import re
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict

from agent_core.errors import SkillError
from agent_core.text import clean, cut

__all__ = ["Skill"]

FENCE = "---"
NAME_MAX = 64
DESCRIPTION_MAX = 1024
# Real front matter is well under 4 KB; pure-Python PyYAML reads ~100 KB/s at worst.
FRONT_MATTER_MAX = 16_384
# PyYAML's scanner does work proportional to the open flow depth on every token,
# so a line of `[[[[…` costs seconds before the recursion limit stops it.
FLOW_DEPTH_MAX = 32

# Agent Skills names: lowercase ASCII letters and digits in runs joined by single
# hyphens. Each hyphen must be followed by a letter or digit, so no backtracking.
_NAME = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")


class Skill(BaseModel):
    """A skill: the model sees `name` and `description`; `body` loads on `use_skill`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    description: str
    body: str

    @classmethod
    def parse(cls, text: str) -> Skill:
        """Read a SKILL.md: YAML front matter with `name` and `description`, then the body.

        A leading byte order mark and CRLF line endings are accepted. Keys other
        than `name` and `description` are accepted and dropped. The body is the
        rest of the text without its leading blank lines and trailing whitespace.

        Raises:
            SkillError: no front matter, or it is unclosed, too large, too deeply
                nested, not YAML or not a mapping; `name` or `description` is
                missing, empty or not text; the name is not 1-64 lowercase
                letters, digits and single inner hyphens; the description is
                over 1024 characters; or the body is empty.
        """
        front, rest = _split(text)
        fields = _load_front_matter(front)
        return cls(
            name=_checked_name(_text_field(fields, "name")),
            description=_checked_description(_text_field(fields, "description")),
            body=_body(rest),
        )


def _split(text: object) -> tuple[str, str]:
    """Return (front matter, rest) of a SKILL.md, with line endings made `\\n`."""
    if not isinstance(text, str):
        raise SkillError(f"a SKILL.md must be text, got {type(text).__name__}")
    text = clean(text).removeprefix("\ufeff").replace("\r\n", "\n").replace("\r", "\n")
    lines = text.split("\n")
    if lines[0].rstrip(" \t") != FENCE:
        raise SkillError("a SKILL.md must start with a '---' line opening its YAML front matter")
    for index in range(1, len(lines)):
        if lines[index].rstrip(" \t") == FENCE:
            return "\n".join(lines[1:index]), "\n".join(lines[index + 1 :])
    raise SkillError("the SKILL.md front matter has no closing '---' line")


def _load_front_matter(front: str) -> dict[Any, Any]:
    """Return the front matter as a mapping, or raise `SkillError` saying why not."""
    if len(front) > FRONT_MATTER_MAX:
        raise SkillError(
            f"the SKILL.md front matter is {len(front)} characters long;"
            f" at most {FRONT_MATTER_MAX} are read"
        )
    if _flow_depth(front) > FLOW_DEPTH_MAX:
        raise SkillError(
            f"the SKILL.md front matter nests '[' and '{{' more than {FLOW_DEPTH_MAX} deep"
        )
    try:
        fields = yaml.safe_load(front)
    except RecursionError:
        raise SkillError("the SKILL.md front matter is nested too deeply to read") from None
    # PyYAML raises more than YAMLError on hostile text: ValueError for a date
    # like 2023-13-45 or an integer over Python's digit limit, and perhaps
    # others. Every one of them means the same thing here.
    except Exception as error:
        raise SkillError(
            f"the SKILL.md front matter is not valid YAML: {_reason(error)}"
        ) from error
    if not isinstance(fields, dict):
        raise SkillError(
            f"the SKILL.md front matter must be a mapping of keys to values, got {_kind(fields)}"
        )
    return fields


def _flow_depth(front: str) -> int:
    """Return the deepest run of unclosed `[` and `{`, counting brackets in quotes too.

    Brackets inside quoted strings make this over-count (a refusal of an odd
    but valid file) or under-count (left to the recursion limit): it is a cheap
    guard against the cheapest attack, not a YAML parser.
    """
    depth = deepest = 0
    for char in front:
        if char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}" and depth:
            depth -= 1
    return deepest


def _reason(error: Exception) -> str:
    """Return a short account of a PyYAML failure, with the line in the SKILL.md."""
    if isinstance(error, yaml.MarkedYAMLError) and error.problem_mark is not None:
        mark = error.problem_mark
        # Marks count from 0, and the front matter starts on the file's second line.
        return f"{error.problem} at line {mark.line + 2}, column {mark.column + 1}"
    return cut(str(error), 200)


def _kind(value: object) -> str:
    """Return a short name for the type of a YAML value, for messages."""
    return "nothing" if value is None else type(value).__name__


def _text_field(fields: dict[Any, Any], key: str) -> str:
    """Return the cleaned, stripped text under `key`, which must be there and not empty."""
    if key not in fields:
        raise SkillError(f"the SKILL.md front matter has no {key!r}")
    value = fields[key]
    if value is None:
        raise SkillError(f"the SKILL.md {key!r} is empty")
    if not isinstance(value, str):
        raise SkillError(f"the SKILL.md {key!r} must be text, got {_kind(value)}")
    # Cleaned again: a double-quoted YAML string can spell a lone surrogate as "\ud800".
    value = clean(value).strip()
    if not value:
        raise SkillError(f"the SKILL.md {key!r} is empty")
    return value


def _checked_name(name: str) -> str:
    if len(name) > NAME_MAX or not _NAME.fullmatch(name):
        raise SkillError(
            f"the SKILL.md 'name' {cut(name, 80)!r} must be 1 to {NAME_MAX} lowercase"
            " letters (a-z), digits and hyphens, with no hyphen at either end or two in a row"
        )
    return name


def _checked_description(description: str) -> str:
    if len(description) > DESCRIPTION_MAX:
        raise SkillError(
            f"the SKILL.md 'description' is {len(description)} characters long;"
            f" at most {DESCRIPTION_MAX} are allowed"
        )
    return description


def _body(rest: str) -> str:
    """Return the instructions after the front matter, or raise if there are none."""
    content = rest.lstrip(" \t\n")
    # Keep the indentation of the first line with content (it may open a code block).
    start = rest.rfind("\n", 0, len(rest) - len(content)) + 1
    body = rest[start:].rstrip()
    if not body:
        raise SkillError("the SKILL.md has no instructions after its front matter")
    return body
