"""Skills: instruction packs in the open Agent Skills format (agentskills.io).

A skill is a folder: a `SKILL.md` (YAML front matter between two `---` lines,
then Markdown), and any files beside it (`references/`, `scripts/`, templates):

    pdf-processing/
    ├── SKILL.md          ---
    │                     name: pdf-processing
    │                     description: Extract text from PDFs. Use when ...
    │                     ---
    │                     # PDF processing ... (read FORMS.md to fill a form)
    ├── FORMS.md
    └── scripts/fill.py

`Skill.parse(text)` reads one SKILL.md's text; `Skill.load(path)` reads a
folder and `Skill.load_all(path)` every skill under a folder (both in
`agent_core.skill_files`, the one module of the core that touches the disk).
The model sees each skill's name and description; `use_skill` shows the body
and lists the files, which the model reads with `read_skill_file`.

What the format allows is accepted, and what breaks it is refused with a
`SkillError` saying why. Between the two, real repositories are met halfway:
a description over 1,024 characters is kept (and cut in the prompt), unknown
keys are dropped, and both are reported as warnings. The front matter is read
as the reference implementation reads it, every untagged scalar as text (`name: 2024`
is the name "2024", `description: yes` the text "yes"), and only `name` and
`description` are kept: arbitrary YAML (an alias bomb, a self-referencing list)
never reaches a snapshot.

The text may come from anywhere, so parsing is bounded: the front matter is
capped in size and in bracket depth before PyYAML sees it, and whatever PyYAML
raises on what remains becomes a `SkillError`.
"""

from __future__ import annotations

import json
import unicodedata
from typing import TYPE_CHECKING, Any, NoReturn

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator

from agent_core.errors import SkillError, UsageError
from agent_core.skill_paths import RESOURCES_MAX, SKILL_MD, resource_path_problem
from agent_core.text import clean, cut

if TYPE_CHECKING:  # for annotations only: this module never touches the disk
    from os import PathLike

    from agent_core.skill_files import FolderRead

__all__ = ["Skill", "SkillIssue", "SkillReport", "read_skill_md"]

FENCE = "---"
FILES_SHOWN = 100
"""Files of a loaded skill its note lists (the model may read any of its files)."""
NAME_MAX = 64
DESCRIPTION_MAX = 1024
"""The format's limit; a longer description is kept, warned about and cut in the prompt."""
COMPATIBILITY_MAX = 500
KNOWN_KEYS = frozenset(
    {"name", "description", "license", "compatibility", "metadata", "allowed-tools"}
)
# Real front matter is well under 4 KB; pure-Python PyYAML reads ~100 KB/s at worst.
FRONT_MATTER_MAX = 16_384
# PyYAML's scanner does work proportional to the open flow depth on every token,
# so a line of `[[[[…` costs seconds before the recursion limit stops it.
FLOW_DEPTH_MAX = 32


_USE_LOAD = "use Skill.load(path) for a skill folder, Skill.parse(text) for a SKILL.md's text"


class Skill(BaseModel):
    """A skill: the model sees `name` and `description`; `body` loads on `use_skill`.

    A skill read from a folder also knows the folder (`folder`, an absolute
    path) and the files in it (`resources`, paths relative to the folder, in
    `/` form, sorted); `read_skill_file` reads those and nothing else. A skill
    made by `parse` has neither. All of it travels in a snapshot, so a
    restored agent needs nothing more; file contents never do.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    description: str
    body: str
    folder: str = ""
    resources: tuple[str, ...] = Field(default=(), max_length=RESOURCES_MAX)

    @classmethod
    def parse_file(cls, *args: Any, **kwargs: Any) -> NoReturn:
        """Not how a skill is read (pydantic's, for JSON): raises `UsageError` saying what is."""
        del args, kwargs
        raise UsageError(f"Skill.parse_file reads JSON, not a skill: {_USE_LOAD}")

    @classmethod
    def parse_raw(cls, *args: Any, **kwargs: Any) -> NoReturn:
        """Not how a skill is read (pydantic's, for JSON): raises `UsageError` saying what is."""
        del args, kwargs
        raise UsageError(f"Skill.parse_raw reads JSON, not a skill: {_USE_LOAD}")

    @field_validator("resources")
    @classmethod
    def _relative_paths(cls, resources: tuple[str, ...]) -> tuple[str, ...]:
        for path in resources:
            problem = resource_path_problem(path)
            if problem:
                raise ValueError(f"resource {cut(path, 80)!r} {problem}")
        return resources

    @classmethod
    def parse(cls, text: str) -> Skill:
        """Read a SKILL.md: YAML front matter with `name` and `description`, then the body.

        A leading byte order mark and CRLF line endings are accepted. Other keys
        are accepted and dropped. The body is the rest of the text without its
        leading blank lines and trailing whitespace; it may be empty. The name
        is NFKC-normalised.

        Raises:
            SkillError: no front matter, or it is unclosed, too large, too deeply
                nested, not YAML or not a mapping; `name` or `description` is
                missing, empty or not text; or the name is not 1-64 lowercase
                letters, digits and single inner hyphens.
        """
        return read_skill_md(text)[0]

    def first_part(self, limit: int) -> str:
        """The body, or its first `limit` characters ending at a line break when one is near."""
        if len(self.body) <= limit:
            return self.body
        line_end = self.body.rfind("\n", 0, limit)
        return self.body[: line_end + 1 if line_end >= limit // 2 else limit]

    def note(self, shown: int, *, read_with: str) -> str:
        """What follows the body's first `shown` characters when the skill is loaded: how
        to read the rest with the tool `read_with`, and the skill's files."""
        lines = []
        if shown < len(self.body):
            read_on = {"skill": self.name, "path": SKILL_MD, "offset": shown}
            call = json.dumps({"tool": read_with, "args": read_on})
            lines.append(
                f"(The SKILL.md goes on for {len(self.body) - shown} more characters;"
                f" read them with {call}.)"
            )
        if self.resources:
            listed = ", ".join(self.resources[:FILES_SHOWN])
            more = len(self.resources) - FILES_SHOWN
            listed += f" and {more} more" if more > 0 else ""
            lines.append(f"Files of this skill (read one with {read_with}): {listed}")
        return "\n".join(lines)

    @classmethod
    def load(cls, path: str | PathLike[str]) -> Skill:
        """Read the skill folder `path` (or its SKILL.md): the skill, its folder and files.

        Warnings (a long description, a name that differs from its folder,
        files left out of `resources`) are logged on `agent_core.skill_files`.

        Raises:
            SkillError: the folder or its SKILL.md cannot be read, or the
                SKILL.md is refused; the message starts with the file's path.
        """
        from agent_core import skill_files  # noqa: PLC0415 - the state machine must not load it

        folder = skill_files.skill_folder(path)
        try:
            skill, warnings = _assembled(skill_files.read_folder(folder))
        except (skill_files.Unreadable, _Refused) as error:
            raise SkillError(str(error)) from None
        for warning in warnings:
            skill_files.log.warning("%s: %s", folder, warning)
        return skill

    @classmethod
    def load_all(cls, path: str | PathLike[str]) -> SkillReport:
        """Read every skill folder under `path` (a folder with a SKILL.md is one skill).

        Returns the skills that loaded, and for each folder that did not, its
        path and one line why; warnings come in the report too. Hidden folders
        are skipped, and a skill's own subfolders are its files, not skills.

        Raises:
            SkillError: `path` is not a folder that can be read.
        """
        from agent_core import skill_files  # noqa: PLC0415 - the state machine must not load it

        folders, walked = skill_files.skill_folders(path)
        skills: list[Skill] = []
        failed: list[SkillIssue] = []
        warnings = [SkillIssue(path=where, text=text) for where, text in walked]
        named: dict[str, str] = {}
        for folder in folders:
            where = str(folder)
            try:
                skill, notes = _assembled(skill_files.read_folder(folder))
            except (skill_files.Unreadable, _Refused) as error:
                failed.append(SkillIssue(path=where, text=" ".join(error.why.split())))
                continue
            if skill.name in named:
                twin = f"another skill is named {skill.name!r} ({named[skill.name]})"
                failed.append(SkillIssue(path=where, text=twin))
                continue
            named[skill.name] = where
            skills.append(skill)
            warnings.extend(SkillIssue(path=where, text=" ".join(n.split())) for n in notes)
        return SkillReport(skills=tuple(skills), failed=tuple(failed), warnings=tuple(warnings))


class SkillIssue(BaseModel):
    """One line about one skill folder: why it did not load, or a warning."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    path: str
    text: str


class SkillReport(BaseModel):
    """What `Skill.load_all` found: the skills, the folders it refused, and warnings."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    skills: tuple[Skill, ...] = ()
    failed: tuple[SkillIssue, ...] = ()
    warnings: tuple[SkillIssue, ...] = ()

    @property
    def ok(self) -> bool:
        """Whether every skill folder found was loaded."""
        return not self.failed


class _Refused(Exception):
    """Raised when a skill folder's SKILL.md is refused: the file, and why."""

    def __init__(self, where: object, why: str) -> None:
        super().__init__(f"{where}: {why}")
        self.why = why


def _assembled(found: FolderRead) -> tuple[Skill, list[str]]:
    """The skill in a folder read from disk, with its warnings.

    Raises:
        _Refused: its SKILL.md is refused (naming the file, and why).
    """
    try:
        skill, warnings = read_skill_md(found.text)
    except SkillError as error:
        raise _Refused(found.folder / found.file_name, str(error)) from None
    if found.file_name != SKILL_MD:
        warnings.append(f"the file is named {found.file_name}; the format names it {SKILL_MD}")
    if skill.name != found.folder_name:
        warnings.append(f"the name {skill.name!r} differs from its folder's, {found.folder_name!r}")
    loaded = Skill(
        name=skill.name,
        description=skill.description,
        body=skill.body,
        folder=found.real,
        resources=found.resources,
    )
    return loaded, warnings + list(found.warnings)


def read_skill_md(text: str) -> tuple[Skill, list[str]]:
    """Return the skill in a SKILL.md's text, and warnings about what was let pass.

    Raises:
        SkillError: as `Skill.parse` says.
    """
    front, rest = _split(text)
    fields = _load_front_matter(front)
    name = _checked_name(_text_field(fields, "name"))
    description = _text_field(fields, "description")
    skill = Skill(name=name, description=description, body=_body(rest))
    return skill, _warnings(fields, description)


def _warnings(fields: dict[Any, Any], description: str) -> list[str]:
    warnings = []
    if len(description) > DESCRIPTION_MAX:
        warnings.append(
            f"the description is {len(description)} characters long (the format allows"
            f" {DESCRIPTION_MAX}); the model is shown the first {DESCRIPTION_MAX}"
        )
    compatibility = fields.get("compatibility")
    if isinstance(compatibility, str) and len(compatibility) > COMPATIBILITY_MAX:
        warnings.append(
            f"'compatibility' is {len(compatibility)} characters long (the format allows"
            f" {COMPATIBILITY_MAX})"
        )
    unknown = sorted(str(key) for key in fields if key not in KNOWN_KEYS)
    if unknown:
        shown = ", ".join(cut(key, 40) for key in unknown[:8])
        more = f" and {len(unknown) - 8} more" if len(unknown) > 8 else ""
        warnings.append(f"keys the format does not define were dropped: {shown}{more}")
    return warnings


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
        fields = yaml.load(front, Loader=_TextLoader)  # a SafeLoader: builds no objects
    except RecursionError:
        raise SkillError("the SKILL.md front matter is nested too deeply to read") from None
    # Whatever PyYAML raises on hostile text means the same thing here.
    except Exception as error:
        raise SkillError(
            f"the SKILL.md front matter is not valid YAML: {_reason(error)}"
        ) from error
    if not isinstance(fields, dict):
        raise SkillError(
            f"the SKILL.md front matter must be a mapping of keys to values, got {_kind(fields)}"
        )
    return fields


class _TextLoader(yaml.SafeLoader):
    """PyYAML's SafeLoader, reading every untagged scalar as text, as the reference
    implementation (strictyaml) does: `yes`, `2024`, `2023-13-45` and `~` stay text,
    and `<<` is a plain key, not a merge."""


_TextLoader.yaml_implicit_resolvers = {}


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
    return cut(" ".join(str(error).split()), 200)


def _kind(value: object) -> str:
    """Return a short name for the type of a YAML value, for messages."""
    if isinstance(value, dict):
        return "a mapping"
    return "a list" if isinstance(value, list) else type(value).__name__


def _text_field(fields: dict[Any, Any], key: str) -> str:
    """Return the cleaned, stripped text under `key`, which must be there and not empty."""
    if key not in fields:
        raise SkillError(f"the SKILL.md front matter has no {key!r}")
    value = fields[key]
    if not isinstance(value, str):
        raise SkillError(f"the SKILL.md {key!r} must be text, got {_kind(value)}")
    # Cleaned again: a double-quoted YAML string can spell a lone surrogate as "\ud800".
    value = clean(value).strip()
    if not value:
        raise SkillError(f"the SKILL.md {key!r} is empty")
    return value


def _checked_name(name: str) -> str:
    """Return the NFKC form of `name` if the format allows it, as the reference checks it.

    Lowercase letters (any script), digits and hyphens; no hyphen at either end
    or two in a row; at most 64 characters.
    """
    name = unicodedata.normalize("NFKC", name)
    if (
        len(name) > NAME_MAX
        or name != name.lower()
        or not all(c.isalnum() or c == "-" for c in name)
        or name.startswith("-")
        or name.endswith("-")
        or "--" in name
    ):
        raise SkillError(
            f"the SKILL.md 'name' {cut(name, 80)!r} must be 1 to {NAME_MAX} lowercase"
            " letters, digits and hyphens, with no hyphen at either end or two in a row"
        )
    return name


def _body(rest: str) -> str:
    """Return the instructions after the front matter (empty if there are none)."""
    content = rest.lstrip(" \t\n")
    # Keep the indentation of the first line with content (it may open a code block).
    start = rest.rfind("\n", 0, len(rest) - len(content)) + 1
    return rest[start:].rstrip() if content else ""
