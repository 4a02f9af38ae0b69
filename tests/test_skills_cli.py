"""`relay skills list|check PATH` through click's runner and the real `relay` group: no app,
no Redis; what a folder of skills offers, what is wrong with it, and the exit code."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner, Result

from tests.support.skill_repos import REPO_BROKEN, REPO_SKILLS, write_repo, write_skill
from workers.cli import cli
from workers.cli.skills import shown


def relay(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), env={"RELAY_APP": None})


def test_list_shows_each_skill_that_loads(tmp_path: Path) -> None:
    result = relay("skills", "list", str(write_repo(tmp_path)))
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert {line.split("  ", 1)[0] for line in lines} == REPO_SKILLS
    assert (
        "pdf  (5 files)  Comprehensive PDF manipulation toolkit for extracting text and tables,"
        " creating new PDFs, merging/s…"
    ) in lines
    assert "k8s-helper  (0 files)  Kubernetes manifests, checked." in lines
    assert result.stderr == (
        f"{len(REPO_BROKEN)} folders could not be loaded;"
        f" `relay skills check {tmp_path}` says why.\n"
    )


def test_list_json_has_the_folder_and_files_but_not_the_body(tmp_path: Path) -> None:
    result = relay("skills", "list", "--json", str(write_repo(tmp_path)))
    assert result.exit_code == 0, result.output
    listed = {entry["name"]: entry for entry in json.loads(result.stdout)}
    assert set(listed) == REPO_SKILLS
    assert listed["mcp-builder"] == {
        "name": "mcp-builder",
        "description": "Guide for creating high-quality MCP servers.",
        "folder": str((tmp_path / "skills" / "mcp-builder").resolve()),
        "resources": [
            "reference/evaluation.md",
            "reference/mcp_best_practices.md",
            "reference/python_mcp_server.md",
            "scripts/requirements.txt",
        ],
    }


def test_check_reports_every_problem_by_folder_and_fails(tmp_path: Path) -> None:
    result = relay("skills", "check", str(write_repo(tmp_path)))
    assert result.exit_code == 1
    lines = result.stdout.splitlines()
    failed = [line for line in lines if line.startswith("FAIL  ")]
    assert len(failed) == len(REPO_BROKEN)
    for folder, why in REPO_BROKEN.items():
        assert any(f"{tmp_path / folder}: " in line and why in line for line in failed), folder
    assert f"warn  {tmp_path / 'template'}: the name 'template-skill' differs" in result.stdout
    assert sum(line.startswith("ok    ") for line in lines) == len(REPO_SKILLS)
    assert lines[-1] == f"{len(REPO_SKILLS)} loaded, {len(REPO_BROKEN)} failed, 5 warnings"
    assert "Traceback" not in result.output


def test_check_passes_a_clean_folder(tmp_path: Path) -> None:
    write_skill(tmp_path, "pdf", "name: pdf\ndescription: PDFs.", "Body", {"FORMS.md": "x"})
    result = relay("skills", "check", str(tmp_path))
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        f"ok    pdf  {(tmp_path / 'pdf').resolve()}",
        "1 loaded, 0 failed, 0 warnings",
    ]


def test_check_fails_when_it_finds_no_skill(tmp_path: Path) -> None:
    result = relay("skills", "check", str(tmp_path))
    assert result.exit_code == 1
    assert result.stdout == "No SKILL.md found.\n"


def test_a_missing_folder_is_one_line_and_exit_1(tmp_path: Path) -> None:
    for verb in ("list", "check"):
        result = relay("skills", verb, str(tmp_path / "nope"))
        assert result.exit_code == 1
        assert result.stderr == f"relay: {tmp_path / 'nope'}: no such file or directory\n"


def test_skill_text_is_printed_without_control_characters(tmp_path: Path) -> None:
    hostile = 'name: evil\ndescription: "Nice\\e[2J\\e]0;pwned\\a \\u202egnp.exe\\r\\nskill"'
    write_skill(tmp_path, "evil", hostile, "x")
    listed = relay("skills", "list", str(tmp_path))
    assert listed.exit_code == 0, listed.output
    assert listed.stdout == "evil  (0 files)  Nice [2J ]0;pwned gnp.exe skill\n"
    as_json = relay("skills", "list", "--json", str(tmp_path))
    assert as_json.stdout.isascii()
    assert json.loads(as_json.stdout)[0]["description"].startswith("Nice\x1b[2J")


def test_shown_keeps_letters_and_drops_controls_and_format_characters() -> None:
    assert shown("tab\there\x00\x7f\u200b\u202e end") == "tab here end"
    assert shown("數據 résumé") == "數據 résumé"
    assert shown("x" * 20, 10) == "xxxxxxxxx…"
