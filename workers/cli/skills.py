"""`relay skills ...`: look at a folder of Agent Skills before a Relay offers them.

    relay skills list ./skills [--json]     each skill that loads: name, files, description
    relay skills check ./skills             every problem, by folder; exit 1 if any failed

Neither needs an app or a Redis: they read the folder as `Relay(skills_dir=...)`
would (`Skill.load_all`). Skill text comes from anywhere, so what is printed
has its control and format characters (escapes, bidi overrides) removed.
"""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path

import click

from agent_core import Skill, SkillReport
from workers.cli.common import json_option

__all__ = ["skills"]

DESCRIPTION_SHOWN = 100


def shown(text: str, limit: int = 0) -> str:
    """Return `text` on one line, without control or format characters, cut to `limit`."""
    kept = "".join(" " if unicodedata.category(c).startswith("C") else c for c in text)
    line = " ".join(kept.split())
    return line if not limit or len(line) <= limit else line[: limit - 1] + "…"


@click.group()
def skills() -> None:
    """Agent Skills (SKILL.md folders): list what a folder offers, or check it."""


@skills.command("list")
@click.argument("path", type=click.Path(file_okay=False, path_type=Path))
@json_option
def list_skills(path: Path, as_json: bool) -> None:
    """List the skills under PATH that load: name, number of files, description."""
    report = Skill.load_all(path)
    if as_json:
        # ASCII-escaped: a terminal showing it meets no raw control or bidi character.
        listed = [skill.model_dump(exclude={"body"}) for skill in report.skills]
        click.echo(json.dumps(listed, ensure_ascii=True))
        return
    if not report.skills:
        click.echo(f"No skills under {shown(str(path))}.")
    for skill in report.skills:
        files = f"{len(skill.resources)} files" if len(skill.resources) != 1 else "1 file"
        click.echo(f"{shown(skill.name)}  ({files})  {shown(skill.description, DESCRIPTION_SHOWN)}")
    if report.failed:
        count = len(report.failed)
        folders = "1 folder" if count == 1 else f"{count} folders"
        click.echo(
            f"{folders} could not be loaded; `relay skills check {shown(str(path))}` says why.",
            err=True,
        )


@skills.command("check")
@click.argument("path", type=click.Path(file_okay=False, path_type=Path))
def check(path: Path) -> None:
    """Check every skill folder under PATH; exit 1 if one cannot be loaded (or none is found)."""
    report = Skill.load_all(path)
    for line in _check_lines(report):
        click.echo(line)
    if report.failed or not report.skills:
        raise SystemExit(1)


def _check_lines(report: SkillReport) -> list[str]:
    lines = [f"ok    {shown(s.name)}  {shown(s.folder)}" for s in report.skills]
    lines += [f"warn  {shown(i.path)}: {shown(i.text)}" for i in report.warnings]
    lines += [f"FAIL  {shown(i.path)}: {shown(i.text)}" for i in report.failed]
    counts = (
        f"{len(report.skills)} loaded, {len(report.failed)} failed, {len(report.warnings)} warnings"
    )
    lines.append(counts if report.skills or report.failed else "No SKILL.md found.")
    return lines
