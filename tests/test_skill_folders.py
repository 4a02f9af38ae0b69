"""Skill folders on disk: Skill.load, Skill.load_all and read_part (agent_core.skill_files),
on realistic repositories written for the tests, and on hostile paths and files."""

from __future__ import annotations

import logging
import os
import string
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from agent_core import Skill, SkillError
from agent_core.skill_files import FILE_BYTES_MAX, SKILL_MD_BYTES_MAX, read_part
from agent_core.skill_paths import RESOURCES_MAX
from tests.support.skill_repos import LONG_BODY, REPO_BROKEN, REPO_SKILLS, write_repo, write_skill

# --- a whole repository --------------------------------------------------------------------


def test_a_realistic_repository_loads_what_follows_the_format(tmp_path: Path) -> None:
    report = Skill.load_all(write_repo(tmp_path))
    assert {s.name for s in report.skills} == REPO_SKILLS
    failed = {Path(i.path).relative_to(tmp_path).as_posix(): i.text for i in report.failed}
    assert set(failed) == set(REPO_BROKEN)
    for folder, why in REPO_BROKEN.items():
        assert why in failed[folder], failed[folder]
    assert all("\n" not in text for text in failed.values())
    assert not report.ok


def test_the_repository_warnings_name_each_folder(tmp_path: Path) -> None:
    report = Skill.load_all(write_repo(tmp_path))
    warned = {(Path(i.path).relative_to(tmp_path).as_posix(), i.text) for i in report.warnings}
    assert warned == {
        (
            "community/changelog-generator",
            "keys the format does not define were dropped: author, tags, version",
        ),
        (
            "community/changelog-generator",
            "the name 'changelog' differs from its folder's, 'changelog-generator'",
        ),
        ("community/k8s-helper", "the file is named skill.md; the format names it SKILL.md"),
        (
            "document-skills/docx",
            "the description is 1159 characters long (the format allows"
            " 1024); the model is shown the first 1024",
        ),
        ("template", "the name 'template-skill' differs from its folder's, 'template'"),
    }


def test_resources_are_the_files_beside_skill_md(tmp_path: Path) -> None:
    report = Skill.load_all(write_repo(tmp_path))
    by_name = {s.name: s for s in report.skills}
    pdf = by_name["pdf"]
    # Sorted, relative, in `/` form; no SKILL.md, no hidden file, no __pycache__.
    assert pdf.resources == (
        "FORMS.md",
        "LICENSE.txt",
        "reference.md",
        "scripts/check_fillable_fields.py",
        "scripts/extract_form_field_info.py",
    )
    assert pdf.folder == str((tmp_path / "document-skills" / "pdf").resolve())
    assert by_name["slack-gif-creator"].resources == (
        "assets/example.gif",
        "core/gif_builder.py",
        "templates/bounce.py",
    )
    assert by_name["skill-creator"].body == LONG_BODY.strip()
    assert by_name["template-skill"].resources == ()


def test_a_long_description_is_kept_whole(tmp_path: Path) -> None:
    report = Skill.load_all(write_repo(tmp_path))
    docx = next(s for s in report.skills if s.name == "docx")
    assert len(docx.description) == 1159


def test_a_folder_that_is_a_skill_is_the_whole_report(tmp_path: Path) -> None:
    folder = write_skill(tmp_path, "csv", "name: csv\ndescription: CSV files.", "Body.")
    write_skill(folder, "examples/nested", "name: nested\ndescription: d", "x")
    report = Skill.load_all(folder)
    # A skill's subfolders are its files, even one holding a SKILL.md.
    assert [s.name for s in report.skills] == ["csv"]
    assert report.skills[0].resources == ("examples/nested/SKILL.md",)


def test_two_skills_with_one_name_keep_the_first_and_report_the_second(tmp_path: Path) -> None:
    write_skill(tmp_path, "a/pdf", "name: pdf\ndescription: First.")
    write_skill(tmp_path, "b/pdf", "name: pdf\ndescription: Second.")
    report = Skill.load_all(tmp_path)
    assert [s.description for s in report.skills] == ["First."]
    assert report.failed[0].path == str(tmp_path / "b" / "pdf")
    assert report.failed[0].text == f"another skill is named 'pdf' ({tmp_path / 'a' / 'pdf'})"


def test_an_empty_folder_has_nothing_to_report(tmp_path: Path) -> None:
    report = Skill.load_all(tmp_path)
    assert (report.skills, report.failed, report.warnings) == ((), (), ())
    assert report.ok


@pytest.mark.timeout(20)
def test_a_link_loop_between_folders_is_walked_once(tmp_path: Path) -> None:
    write_skill(tmp_path, "repo/one", "name: one\ndescription: d")
    (tmp_path / "repo" / "loop").symlink_to(tmp_path / "repo")
    (tmp_path / "linked").symlink_to(tmp_path / "repo" / "one")
    report = Skill.load_all(tmp_path)
    assert [s.name for s in report.skills] == ["one"]
    assert report.failed == ()


@pytest.mark.parametrize("path", ["missing", "file.txt"])
def test_load_all_of_something_not_a_folder_is_refused(tmp_path: Path, path: str) -> None:
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(SkillError, match=f"^{tmp_path / path}: "):
        Skill.load_all(tmp_path / path)


# --- one folder ------------------------------------------------------------------------------


def test_load_takes_the_folder_or_its_skill_md(tmp_path: Path) -> None:
    folder = write_skill(tmp_path, "notes", "name: notes\ndescription: d", "Body", {"a.md": "a"})
    by_folder = Skill.load(folder)
    assert by_folder == Skill.load(folder / "SKILL.md") == Skill.load(str(folder))
    assert by_folder.resources == ("a.md",)
    assert by_folder.body == "Body"


def test_load_logs_its_warnings(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    folder = write_skill(tmp_path, "notes-v2", "name: notes\ndescription: d")
    with caplog.at_level(logging.WARNING, logger="agent_core.skill_files"):
        Skill.load(folder)
    assert caplog.messages == [f"{folder}: the name 'notes' differs from its folder's, 'notes-v2'"]


@pytest.mark.parametrize(
    ("front", "body", "problem"),
    [
        (None, "# No front matter\n", "a SKILL.md must start with a '---' line"),
        ("name: a\ndescription: [unclosed", "", "not valid YAML: "),
        ("description: d", "", "has no 'name'"),
        ("name: a", "", "has no 'description'"),
        ("name: a\ndescription: ''", "", "'description' is empty"),
        ("name: a\ndescription: d\nx: &x [*y]", "", "not valid YAML"),
    ],
)
def test_a_broken_skill_md_is_one_error_naming_the_file(
    tmp_path: Path, front: str | None, body: str, problem: str
) -> None:
    folder = tmp_path / "a"
    folder.mkdir()
    text = body if front is None else f"---\n{front}\n---\n{body}"
    (folder / "SKILL.md").write_text(text)
    with pytest.raises(SkillError) as raised:
        Skill.load(folder)
    message = str(raised.value)
    assert message.startswith(f"{folder / 'SKILL.md'}: ")
    assert problem in message
    assert "\n" not in message


def test_a_yaml_error_gives_the_line_of_the_file(tmp_path: Path) -> None:
    folder = write_skill(tmp_path, "a", "name: a\ndescription: ok\nother: Use it: badly")
    with pytest.raises(SkillError, match=r"SKILL\.md: .* at line 4, column"):
        Skill.load(folder)


def test_a_folder_without_skill_md_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SkillError, match=f"^{tmp_path}: has no SKILL.md$"):
        Skill.load(tmp_path)


def test_a_skill_md_over_the_size_cap_is_refused(tmp_path: Path) -> None:
    folder = write_skill(tmp_path, "big", "name: big\ndescription: d", "x" * SKILL_MD_BYTES_MAX)
    with pytest.raises(SkillError, match=f"at most {SKILL_MD_BYTES_MAX} are read"):
        Skill.load(folder)


def test_a_skill_md_linking_outside_is_refused(tmp_path: Path) -> None:
    write_skill(tmp_path, "real", "name: a\ndescription: d")
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "SKILL.md").symlink_to(tmp_path / "real" / "SKILL.md")
    with pytest.raises(SkillError, match="leads outside the skill folder"):
        Skill.load(tmp_path / "a")


def test_a_path_that_is_not_a_path_is_refused() -> None:
    with pytest.raises(SkillError, match="must be text or a path, got int"):
        Skill.load(42)  # type: ignore[arg-type]


# --- what is listed ---------------------------------------------------------------------------


def test_links_and_special_files_are_left_out_with_a_warning(tmp_path: Path) -> None:
    outside = tmp_path / "secret.txt"
    outside.write_text("SECRET")
    folder = write_skill(tmp_path, "s", "name: s\ndescription: d", "", {"docs/a.md": "a"})
    (folder / "inside-link.md").symlink_to(folder / "docs" / "a.md")
    (folder / "outside-link.md").symlink_to(outside)
    (folder / "folder-link").symlink_to(folder / "docs")
    (folder / "dangling").symlink_to(tmp_path / "nowhere")
    os.mkfifo(folder / "pipe")
    report = Skill.load_all(folder)
    assert report.skills[0].resources == ("docs/a.md", "inside-link.md")
    assert {i.text for i in report.warnings} == {
        "left out dangling: a link to outside the skill folder",
        "left out folder-link: a link to a folder (not followed)",
        "left out outside-link.md: a link to outside the skill folder",
        "left out pipe: not a regular file",
    }


def test_too_many_files_are_capped_with_a_warning(tmp_path: Path) -> None:
    files: dict[str, str | bytes] = {f"top-{n:03}.md": "x" for n in range(150)}
    files |= {f"deep/more-{n:03}.md": "x" for n in range(100)}
    folder = write_skill(tmp_path, "many", "name: many\ndescription: d", "", files)
    report = Skill.load_all(folder)
    resources = report.skills[0].resources
    assert len(resources) == RESOURCES_MAX
    # Level by level: every top-level file is kept before the deeper ones.
    assert sum(r.startswith("top-") for r in resources) == 150
    assert [i.text for i in report.warnings] == [
        f"only the first {RESOURCES_MAX} files are listed and readable"
    ]


def test_deep_folders_are_left_out_with_a_warning(tmp_path: Path) -> None:
    deep = "/".join(["d"] * 6)
    folder = write_skill(tmp_path, "deep", "name: deep\ndescription: d", "", {f"{deep}/x.md": "x"})
    report = Skill.load_all(folder)
    assert report.skills[0].resources == ()
    assert [i.text for i in report.warnings] == [f"left out {deep}/: more than 6 folders deep"]


def test_a_file_name_that_cannot_be_shown_is_left_out(tmp_path: Path) -> None:
    folder = write_skill(tmp_path, "odd", "name: odd\ndescription: d", "", {"ok.md": "x"})
    (folder / "bad\x1b[31mname.md").write_text("x")
    (folder / "back\\slash.md").write_text("x")
    report = Skill.load_all(folder)
    assert report.skills[0].resources == ("ok.md",)
    texts = sorted(i.text for i in report.warnings)
    assert texts == [
        "left out back\\\\slash.md: its path must be relative to the skill folder,"
        " with / between parts",
        "left out bad\\x1b[31mname.md: its path has characters that cannot be shown",
    ]


# --- reading a file ---------------------------------------------------------------------------


@pytest.fixture
def pdf(tmp_path: Path) -> Skill:
    report = Skill.load_all(write_repo(tmp_path))
    return next(s for s in report.skills if s.name == "pdf")


def test_a_listed_file_is_read_whole(pdf: Skill) -> None:
    output = read_part(pdf, "FORMS.md")
    assert output.status == "ok"
    assert output.text == (Path(pdf.folder) / "FORMS.md").read_text()


def test_skill_md_reads_the_body(pdf: Skill) -> None:
    assert read_part(pdf, "SKILL.md").text == pdf.body


def test_a_long_file_is_read_in_parts_that_say_where_to_go_on(pdf: Skill) -> None:
    first = read_part(pdf, "SKILL.md", 0, 120)
    assert first.status == "ok"
    text, note = first.text.rsplit("\n[", 1)
    end = int(note.split("read on with offset ")[1].rstrip("]"))
    assert note == f"SKILL.md: characters 0 to {end} of {len(pdf.body)}; read on with offset {end}]"
    assert text == pdf.body[:end]
    assert text.endswith("\n")  # the part ends at a line break
    assert 60 <= end <= 120


@settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    body=st.text(st.sampled_from("ab \n\u00e9\u4e2d"), min_size=1, max_size=400),
    limit=st.integers(1, 90),
)
def test_reading_on_from_each_offset_gives_back_the_whole_text(body: str, limit: int) -> None:
    skill = Skill(name="s", description="d", body=body)
    offset, parts = 0, []
    for _ in range(len(body) + 1):
        text = read_part(skill, "SKILL.md", offset, limit).text
        if "; read on with offset " not in text:
            parts.append(text.split("\n[SKILL.md: the end,")[0])
            break
        part, note = text.rsplit("\n[", 1)
        parts.append(part)
        offset = int(note.rsplit(" ", 1)[1].rstrip("]"))
    assert "".join(parts) == body


@pytest.mark.parametrize(
    ("path", "problem"),
    [
        ("../../secret.txt", "is not a file of the skill pdf"),
        ("/etc/passwd", "is not a file of the skill pdf"),
        ("scripts", "is not a file of the skill pdf"),
        (".DS_Store", "is not a file of the skill pdf"),
        ("scripts/__pycache__/check_fillable_fields.cpython-311.pyc", "is not a file"),
    ],
)
def test_only_listed_files_are_read(pdf: Skill, path: str, problem: str) -> None:
    output = read_part(pdf, path)
    assert output.status == "error"
    assert problem in output.text


@pytest.mark.parametrize("offset", [-1, 10**9])
def test_an_offset_outside_the_file_is_an_error(pdf: Skill, offset: int) -> None:
    output = read_part(pdf, "FORMS.md", offset)
    assert output.status == "error"
    assert "is outside FORMS.md, which has" in output.text


def test_a_binary_file_is_not_read(tmp_path: Path) -> None:
    folder = write_skill(
        tmp_path, "g", "name: g\ndescription: d", "", {"a.png": b"\x89PNG\x00\x00"}
    )
    output = read_part(Skill.load(folder), "a.png")
    assert (output.status, output.text) == (
        "error",
        "a.png is not a text file; it cannot be read here",
    )


def test_a_parsed_skill_reads_only_its_body() -> None:
    skill = Skill(name="s", description="d", body="Body.", resources=("a.md",))
    assert read_part(skill, "SKILL.md").text == "Body."
    assert read_part(skill, "a.md").text == "the skill s has no folder to read a.md from"


# --- hostile files put in place after loading ------------------------------------------------


def _loaded_with(tmp_path: Path, name: str) -> tuple[Skill, Path]:
    folder = write_skill(tmp_path, "h", "name: h\ndescription: d", "", {name: "fine"})
    return Skill.load(folder), folder / name


def test_a_file_swapped_for_a_link_out_is_refused(tmp_path: Path) -> None:
    skill, path = _loaded_with(tmp_path, "notes.md")
    (tmp_path / "secret.txt").write_text("SECRET")
    path.unlink()
    path.symlink_to(tmp_path / "secret.txt")
    output = read_part(skill, "notes.md")
    assert (output.status, output.text) == ("error", "notes.md: leads outside the skill folder")


@pytest.mark.timeout(10)
def test_a_file_swapped_for_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    skill, path = _loaded_with(tmp_path, "notes.md")
    path.unlink()
    os.mkfifo(path)  # opening it for reading would block until a writer came
    output = read_part(skill, "notes.md")
    assert (output.status, output.text) == ("error", "notes.md: is not a regular file")


def test_a_file_swapped_for_a_folder_is_refused(tmp_path: Path) -> None:
    skill, path = _loaded_with(tmp_path, "notes.md")
    path.unlink()
    path.mkdir()
    assert read_part(skill, "notes.md").text == "notes.md: is not a regular file"


def test_a_huge_file_is_refused_without_being_read(tmp_path: Path) -> None:
    skill, path = _loaded_with(tmp_path, "notes.md")
    with path.open("r+b") as sparse:
        sparse.truncate(FILE_BYTES_MAX + 1)  # sparse: costs no disk
    output = read_part(skill, "notes.md")
    assert output.text == (
        f"notes.md: is {FILE_BYTES_MAX + 1} bytes long; at most {FILE_BYTES_MAX} are read"
    )


def test_a_forged_resource_list_still_cannot_leave_the_folder(tmp_path: Path) -> None:
    (tmp_path / "secret.txt").write_text("SECRET")
    folder = write_skill(tmp_path, "f", "name: f\ndescription: d")
    (folder / "link").symlink_to(tmp_path)
    # As if a snapshot had been edited: the path is listed, and leads out through a link.
    forged = Skill(
        name="f", description="d", body="", folder=str(folder), resources=("link/secret.txt",)
    )
    assert read_part(forged, "link/secret.txt").text == (
        "link/secret.txt: leads outside the skill folder"
    )


SEGMENTS = st.sampled_from(["..", ".", "", "link", "sub", "secret.txt", "\\", "\x00"])


@settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(path=st.lists(SEGMENTS, min_size=1, max_size=4).map("/".join) | st.text(string.printable))
@example(path="link/secret.txt")
@example(path="link/skill/../secret.txt")
@example(path="sub/../../secret.txt")
@example(path=str(Path("/") / "etc" / "passwd"))
def test_no_path_reads_what_lies_outside_the_folder(tmp_path: Path, path: str) -> None:
    (tmp_path / "secret.txt").write_text("SECRET")
    folder = tmp_path / "skill"
    if not folder.exists():
        write_skill(tmp_path, "skill", "name: s\ndescription: d", "", {"sub/a.md": "fine"})
        (folder / "link").symlink_to(tmp_path)
    try:  # the path listed as a resource, as a forged snapshot could
        skill = Skill(name="s", description="d", body="", folder=str(folder), resources=(path,))
    except ValueError:
        skill = Skill(name="s", description="d", body="", folder=str(folder))
    output = read_part(skill, path)  # never raises
    assert "SECRET" not in output.text


def test_skills_in_hidden_folders_load_but_a_repositorys_own_folders_are_not_searched(
    tmp_path: Path,
) -> None:
    # OpenAI's public skills repository keeps them under .curated/, .system/, ...
    for place in (".curated/pdf", ".system/notes", ".experimental/maps", "plain/csv"):
        group, name = place.split("/")
        write_skill(tmp_path / group, name, f"name: {name}\ndescription: d")
    write_skill(tmp_path / ".git", "hooks", "name: hooks\ndescription: not a skill")
    write_skill(tmp_path / "node_modules", "pkg", "name: pkg\ndescription: not a skill")
    report = Skill.load_all(tmp_path)
    assert sorted(s.name for s in report.skills) == ["csv", "maps", "notes", "pdf"]
    assert report.failed == ()


def test_a_skill_folder_linked_from_outside_the_skills_folder_is_left_out(tmp_path: Path) -> None:
    outside = write_skill(tmp_path / "elsewhere", "secrets", "name: secrets\ndescription: d")
    skills = tmp_path / "skills"
    write_skill(skills, "inside", "name: inside\ndescription: d")
    (skills / "linked").symlink_to(outside, target_is_directory=True)
    report = Skill.load_all(skills)
    assert [s.name for s in report.skills] == ["inside"]
    assert [(Path(w.path).name, w.text) for w in report.warnings] == [
        ("linked", "a link to a folder outside the skills folder: left out")
    ]


def test_a_hard_link_in_a_skill_folder_is_neither_listed_nor_read(tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("the outside file")
    folder = write_skill(tmp_path / "skills", "notes", "name: notes\ndescription: d", "", {})
    os.link(secret, folder / "looks-harmless.md")
    (folder / "fine.md").write_text("fine")
    skill = Skill.load(folder)
    assert skill.resources == ("fine.md",)
    # Even named by a skill that lists it (a snapshot written by hand, say):
    forged = skill.model_copy(update={"resources": ("fine.md", "looks-harmless.md")})
    output = read_part(forged, "looks-harmless.md")
    assert output.status == "error"
    assert "hard link" in output.text
    assert "the outside file" not in output.text
