"""Skill.parse: real SKILL.md shapes, what the format allows, refusals that say why, and
hostile YAML. (Skill folders on disk: tests/test_skill_folders.py.)"""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from agent_core.errors import DataError, SkillError, UsageError
from agent_core.skills import DESCRIPTION_MAX, FRONT_MATTER_MAX, Skill, read_skill_md

# --- real files -------------------------------------------------------------------------

PLAIN = """\
---
name: pdf-processing
description: Extract text and tables from PDF files. Use when handling PDFs.
---

# PDF processing

Use pdfplumber to extract text.
"""

FOLDED_WITH_EXTRAS = """\
---
name: data-analysis
description: >
  Analyse CSV and spreadsheet data: summaries,
  pivots and charts. Use when the user shares a table.
license: Apache-2.0
compatibility: Requires Python 3.11+ and pandas
metadata:
  author: example-org
  version: "1.0"
  tags: [csv, excel]
allowed-tools: Bash(python3:*) Read
---
## Steps
1. Load the file.
2. Summarise it.
"""

LITERAL_QUOTED_TOOL_LIST = """\
---
name: "code-review"
description: |
  Review a diff for bugs.
  Use when asked to review code.
allowed-tools:
  - Bash(git:*)
  - Read
---


    indented first line stays indented
Then the rest.
"""

SINGLE_QUOTED = """\
---
name: 'release-notes-2'
description: 'Write release notes: it''s for the changelog'
---
Collect the merged pull requests.
"""


@pytest.mark.parametrize(
    ("text", "name", "description", "body"),
    [
        (
            PLAIN,
            "pdf-processing",
            "Extract text and tables from PDF files. Use when handling PDFs.",
            "# PDF processing\n\nUse pdfplumber to extract text.",
        ),
        (
            FOLDED_WITH_EXTRAS,
            "data-analysis",
            "Analyse CSV and spreadsheet data: summaries, pivots and charts."
            " Use when the user shares a table.",
            "## Steps\n1. Load the file.\n2. Summarise it.",
        ),
        (
            LITERAL_QUOTED_TOOL_LIST,
            "code-review",
            "Review a diff for bugs.\nUse when asked to review code.",
            "    indented first line stays indented\nThen the rest.",
        ),
        (
            SINGLE_QUOTED,
            "release-notes-2",
            "Write release notes: it's for the changelog",
            "Collect the merged pull requests.",
        ),
    ],
    ids=["plain", "folded-with-extras", "literal-quoted-tool-list", "single-quoted"],
)
def test_real_files_parse(text: str, name: str, description: str, body: str) -> None:
    assert Skill.parse(text) == Skill(name=name, description=description, body=body)


def test_crlf_and_bom_read_like_plain_text() -> None:
    assert Skill.parse("\ufeff" + FOLDED_WITH_EXTRAS.replace("\n", "\r\n")) == Skill.parse(
        FOLDED_WITH_EXTRAS
    )


def test_fence_lines_may_carry_trailing_spaces() -> None:
    text = "---  \nname: a\ndescription: b\n--- \t\nbody"
    assert Skill.parse(text) == Skill(name="a", description="b", body="body")


def test_a_later_fence_line_belongs_to_the_body() -> None:
    # A `---` inside the body (a Markdown rule) is just body text.
    text = "---\nname: a\ndescription: b\n---\nabove\n---\nbelow"
    assert Skill.parse(text).body == "above\n---\nbelow"


def test_lone_surrogates_in_yaml_escapes_are_replaced() -> None:
    skill = Skill.parse('---\nname: a\ndescription: "bad \\ud800 text"\n---\nbody \ud800')
    assert skill.description == "bad \ufffd text"
    assert skill.body == "body \ufffd"
    skill.model_dump_json().encode("utf-8")  # would raise on a surrogate


def test_keyword_construction_and_json_round_trip() -> None:
    skill = Skill(name="a", description="b", body="c")
    assert Skill.model_validate_json(skill.model_dump_json()) == skill


def test_longest_name_and_description_are_accepted() -> None:
    name = "a" * 64
    skill = Skill.parse(f"---\nname: {name}\ndescription: {'d' * DESCRIPTION_MAX}\n---\nbody")
    assert (len(skill.name), len(skill.description)) == (64, DESCRIPTION_MAX)


# --- what the format allows, and where real repositories are met halfway ------------------


def test_the_specs_minimal_example_has_no_body_and_is_accepted() -> None:
    # agentskills.io's own minimal SKILL.md: front matter and nothing else.
    text = "---\nname: skill-name\ndescription: A description of what this skill does.\n---\n"
    skill = Skill.parse(text)
    assert (skill.name, skill.body) == ("skill-name", "")
    assert Skill.parse(front("name: a\ndescription: b", body="\n \n\t\n")).body == ""


@pytest.mark.parametrize(
    ("yaml", "name", "description"),
    [
        # The reference implementation reads every scalar as text (strictyaml).
        ("name: 2024\ndescription: yes", "2024", "yes"),
        ("name: '007'\ndescription: 3.10", "007", "3.10"),
        ("name: a\ndescription: ~", "a", "~"),
        # Unicode lowercase letters are letters (the reference checks isalnum and lower()).
        ("name: résumé\ndescription: b", "résumé", "b"),
        ("name: 数据-分析\ndescription: b", "数据-分析", "b"),
        # NFKC: the ligature ﬁ is the two letters f and i.
        ("name: ﬁle-tools\ndescription: b", "file-tools", "b"),
    ],
)
def test_scalars_are_text_and_names_may_be_any_lowercase_letters(
    yaml: str, name: str, description: str
) -> None:
    skill = Skill.parse(front(yaml))
    assert (skill.name, skill.description) == (name, description)


@pytest.mark.parametrize(
    "extra",
    [
        "when: 2023-13-45",
        "big: " + "9" * 5000,
        "metadata: {author: me, version: 1.0, tags: [a, b]}",
        "allowed-tools: Bash(git:*) Read",
        "allowed-tools:\n  - Bash(git:*)\n  - Read",
        "license: Proprietary. LICENSE.txt has complete terms",
    ],
)
def test_optional_and_odd_extra_keys_are_accepted_and_dropped(extra: str) -> None:
    skill = Skill.parse(front("name: a\ndescription: b\n" + extra))
    assert skill == Skill(name="a", description="b", body="Do the thing.")


def test_allowed_keys_bring_no_warning_and_others_do() -> None:
    _, quiet = read_skill_md(front("name: a\ndescription: b\nlicense: MIT\nmetadata: {k: v}"))
    assert quiet == []
    _, warned = read_skill_md(front("name: a\ndescription: b\nversion: 2\nauthor: me"))
    assert warned == ["keys the format does not define were dropped: author, version"]


def test_a_long_description_is_kept_with_a_warning() -> None:
    # A vendor's official repository ships a description of 1,068 characters.
    description = ("Use this skill to build things. " * 40)[:1068]
    skill, warnings = read_skill_md(front(f"name: a\ndescription: {description}"))
    assert skill.description == description.strip()
    assert warnings == [
        f"the description is {len(description.strip())} characters long (the format allows"
        f" {DESCRIPTION_MAX}); the model is shown the first {DESCRIPTION_MAX}"
    ]


def test_a_long_compatibility_is_a_warning() -> None:
    _, warnings = read_skill_md(front("name: a\ndescription: b\ncompatibility: " + "c" * 501))
    assert warnings == ["'compatibility' is 501 characters long (the format allows 500)"]


@pytest.mark.parametrize("method", ["parse_file", "parse_raw"])
def test_pydantics_json_readers_are_no_trap(method: str) -> None:
    # Skill.parse_file("x/SKILL.md") used to fail with a JSON error.
    with pytest.raises(UsageError, match=r"use Skill\.load\(path\) for a skill folder"):
        getattr(Skill, method)("pdf/SKILL.md")


@pytest.mark.parametrize(
    ("resources", "problem"),
    [
        (("../x",), "'..' parts"),
        (("a/../../x",), "'..' parts"),
        (("/etc/passwd",), "must be relative"),
        (("a\\b",), "must be relative"),
        (("a//b",), "empty"),
        (("./a",), "'.' or '..' parts"),
        (("",), "non-empty"),
        (("a\nb",), "cannot be shown"),
        (("a" * 300,), "longer than"),
        (tuple(f"f{n}" for n in range(201)), "at most 200"),
    ],
)
def test_resources_are_plain_relative_paths(resources: tuple[str, ...], problem: str) -> None:
    with pytest.raises(ValidationError, match=re.escape(problem)):
        Skill(name="a", description="b", body="", folder="/skills/a", resources=resources)


# --- refusals ---------------------------------------------------------------------------


def front(yaml: str, body: str = "Do the thing.") -> str:
    return f"---\n{yaml}\n---\n{body}"


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("", "must start with a '---'"),
        ("# Just markdown\n", "must start with a '---'"),
        ("\n---\nname: a\ndescription: b\n---\nbody", "must start with a '---'"),
        ("---\nname: a\ndescription: b\n", "no closing '---'"),
        ("---\nname: a\ndescription: b\n----\nbody", "no closing '---'"),
        (front("name: [a\ndescription: b"), "not valid YAML"),
        (front("name: a\n  bad: indent\n description: b"), "not valid YAML"),
        (front("name: a\ndescription: b\nx: *nowhere"), "not valid YAML"),
        (
            front("name: a\ndescription: b\nx: !!python/object/apply:os.system [ls]"),
            "not valid YAML",
        ),
        (front("name: !!int 5\ndescription: b"), "'name' must be text, got int"),
        (front(""), "must be a mapping"),
        (front("- name: a\n- description: b"), "must be a mapping"),
        (front("just a sentence"), "must be a mapping"),
        (front("description: b"), "no 'name'"),
        (front("name: a"), "no 'description'"),
        (front("name:\ndescription: b"), "'name' is empty"),
        (front("name: '  '\ndescription: b"), "'name' is empty"),
        (front("name: a\ndescription: ''"), "'description' is empty"),
        (front("name: [a]\ndescription: b"), "'name' must be text, got a list"),
        (front("name: a\ndescription: {x: 1}"), "'description' must be text, got a mapping"),
        (front("name: a\ndescription:\n  - b"), "'description' must be text, got a list"),
        (front("name: PDF-Processing\ndescription: b"), "lowercase"),
        (front("name: -pdf\ndescription: b"), "lowercase"),
        (front("name: pdf-\ndescription: b"), "lowercase"),
        (front("name: pdf--processing\ndescription: b"), "lowercase"),
        (front("name: pdf_processing\ndescription: b"), "lowercase"),
        (front("name: pdf processing\ndescription: b"), "lowercase"),
        (front("name: Résumé\ndescription: b"), "lowercase"),
        (front("name: pdf.processing\ndescription: b"), "lowercase"),
        (front("name: pdf/processing\ndescription: b"), "lowercase"),
        (front(f"name: {'a' * 65}\ndescription: b"), "lowercase"),
    ],
)
def test_malformed_files_are_refused_with_the_reason(text: str, problem: str) -> None:
    with pytest.raises(SkillError, match=re.escape(problem)):
        Skill.parse(text)


def test_a_yaml_error_names_the_line_in_the_file() -> None:
    # The bad line is the file's fourth: the fence, name, description, then this.
    with pytest.raises(SkillError, match="line 4"):
        Skill.parse(front("name: a\ndescription: b\nkey: [unclosed"))


@pytest.mark.parametrize("text", [None, b"---\nname: a\n---\n", 12])
def test_non_text_is_refused(text: object) -> None:
    with pytest.raises(SkillError, match="must be text"):
        Skill.parse(text)  # type: ignore[arg-type]


def test_skill_error_is_bad_data_in_the_agent_tree() -> None:
    with pytest.raises(DataError):
        Skill.parse("nothing")


# --- hostile YAML -----------------------------------------------------------------------

BILLION_LAUGHS = (
    "name: lol\ndescription: laughs\n"
    'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
    + "".join(
        f"{this}: &{this} [{','.join([f'*{prev}'] * 9)}]\n"
        for prev, this in zip("abcdefgh", "bcdefghi", strict=True)
    )
)

MERGE_BOMB = "name: merge\ndescription: merges\na0: &a0 {x: 1, y: 2}\n" + "".join(
    f"a{i}: &a{i} {{<<: [*a{i - 1}, *a{i - 1}]}}\n" for i in range(1, 30)
)


def outcome(text: str) -> Skill | str:
    """Return the parsed skill, or the SkillError's message."""
    try:
        return Skill.parse(text)
    except SkillError as error:
        return str(error)


VALID = "name: a\ndescription: b\n"


@pytest.mark.timeout(20)
@pytest.mark.parametrize(
    ("yaml", "expected"),
    [
        ("[" * 100_000, "at most 16384 are read"),
        ("[" * 10_000, "more than 32 deep"),
        ("{" * 10_000, "more than 32 deep"),
        ("a: [" + "[" * 32 + "]" * 33, "more than 32 deep"),
        # Quotes hide the closing brackets from the depth guard; the recursion limit stops it.
        ('["]",' * 3_000, "nested too deeply"),
        ("- " * 5_000, "nested too deeply"),
        ("? " * 5_000, "nested too deeply"),
        ("".join(" " * i + "a:\n" for i in range(150)), "no 'name'"),
        ("a: " + "x" * FRONT_MATTER_MAX, "at most 16384 are read"),
        (
            VALID + "a: " + "[" * 31 + "]" * 31,
            Skill(name="a", description="b", body="Do the thing."),
        ),
        (
            VALID + "a: &a [*a]\nb: &b {b: *b}",
            Skill(name="a", description="b", body="Do the thing."),
        ),
    ],
    ids=[
        "huge-flow-seq",
        "deep-flow-seq",
        "deep-flow-map",
        "one-too-deep",
        "quoted-closers",
        "deep-block-seq",
        "deep-complex-keys",
        "deep-block-map",
        "over-size-cap",
        "as-deep-as-allowed",
        "self-referencing",
    ],
)
def test_hostile_front_matter_is_refused_or_parsed_quickly(
    yaml: str, expected: Skill | str
) -> None:
    result = outcome(front(yaml))
    if isinstance(expected, str):
        assert isinstance(result, str)
        assert expected in result
    else:
        assert result == expected


@pytest.mark.timeout(20)
@pytest.mark.parametrize("yaml", [BILLION_LAUGHS, MERGE_BOMB], ids=["laughs", "merge"])
def test_alias_bombs_parse_and_the_extra_keys_are_dropped(yaml: str) -> None:
    # safe_load shares one object per anchor, so this is cheap; what matters is
    # that nothing of it is kept (a snapshot would serialise it in full).
    skill = Skill.parse(front(yaml))
    assert skill.body == "Do the thing."
    assert len(skill.model_dump_json()) < 200


@pytest.mark.timeout(20)
def test_a_huge_body_is_read_in_one_pass() -> None:
    body = "A line of instructions.\n" * 200_000
    assert Skill.parse(front("name: a\ndescription: b", body=body)).body == body.rstrip()


YAMLISH = st.text(alphabet=st.sampled_from("abn-: \n\t[]{},&*!|>'\"#?%@`\\\r\ufeff\ud800é0"))


@settings(deadline=None)
@given(st.one_of(st.text(), YAMLISH, st.builds(front, YAMLISH, YAMLISH)))
def test_parse_raises_nothing_but_skill_error(text: str) -> None:
    result = outcome(text)  # any other exception fails the test
    if isinstance(result, str):
        assert result.startswith(("a SKILL.md", "the SKILL.md"))
    else:
        assert result.name
        assert result.description
        assert result.body == result.body.rstrip()
        result.model_dump_json().encode("utf-8")  # raises on a lone surrogate


TEXT = st.text(st.characters(codec="utf-8", exclude_characters="\r"))


@settings(deadline=None)
@given(
    st.from_regex(r"[a-z0-9]{1,8}(-[a-z0-9]{1,8}){0,3}", fullmatch=True),
    TEXT.filter(lambda s: len(s.strip()) > 0 and len(s) <= DESCRIPTION_MAX),
    TEXT,
)
def test_any_name_description_and_body_come_back(name: str, description: str, body: str) -> None:
    # Double-quoted YAML with \U escapes carries any description verbatim.
    quoted = '"' + "".join(f"\\U{ord(c):08x}" for c in description) + '"'
    # The name is quoted: YAML would read `name: 0` as a number, which is refused.
    text = front(f"name: '{name}'\ndescription: {quoted}", body="Body:" + body)
    skill = Skill.parse(text)
    assert skill.name == name
    assert skill.description == description.strip()
    assert skill.body == ("Body:" + body).rstrip()
