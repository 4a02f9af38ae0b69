"""The demo app's notes folder: private to its user, and its tools stay inside it.

In a shared temp dir anyone may create `relay-demo-notes...` first, as a link to
their own folder or to somewhere the demo's user can write; and a link planted
in the folder must not lead the tools out of it.
"""

from __future__ import annotations

import os
import stat
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from workers.cli.demo import SAMPLE_NOTES, build, notes_folder
from workers.settings import Settings

Tool = Callable[..., Any]


@pytest.fixture
def temp_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A temp dir of its own for the test, with RELAY_DEMO_DIR unset (the default folder)."""
    shared = tmp_path / "tmp"
    shared.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(shared))
    monkeypatch.delenv("RELAY_DEMO_DIR", raising=False)
    return shared


@pytest.fixture
def tools() -> dict[str, Tool]:
    relay = build(Settings())
    found = {}
    for name in ("list_notes", "read_note", "write_note"):
        spec = relay.kit.spec(name)
        assert spec is not None
        found[name] = spec.fn
    return found


def test_the_default_folder_is_private_to_its_user(temp_dir: Path) -> None:
    folder = notes_folder()
    assert folder == temp_dir / f"relay-demo-notes-{os.getuid()}"
    info = folder.lstat()
    assert stat.S_ISDIR(info.st_mode)
    assert stat.S_IMODE(info.st_mode) == 0o700
    assert info.st_uid == os.getuid()
    assert sorted(p.name for p in folder.iterdir()) == sorted(SAMPLE_NOTES)
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in folder.iterdir())


def test_a_link_in_place_of_the_folder_is_refused(temp_dir: Path, tools: dict[str, Tool]) -> None:
    elsewhere = temp_dir / "someone-elses"
    elsewhere.mkdir(mode=0o700)
    (temp_dir / f"relay-demo-notes-{os.getuid()}").symlink_to(elsewhere)
    with pytest.raises(PermissionError, match="symbolic link"):
        notes_folder()
    with pytest.raises(PermissionError, match="symbolic link"):
        tools["write_note"]("summary.md", "my summary")
    assert list(elsewhere.iterdir()) == []  # nothing written through the link


def _taken(path: Path) -> None:
    """Make `path` a folder that belongs to another user."""
    path.mkdir(mode=0o700)
    os.chown(path, 65534, 65534)


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda p: p.write_text("a file"), "not a folder"),
        (lambda p: (p.mkdir(), p.chmod(0o777)), "others may write to it"),
        (lambda p: (p.mkdir(), p.chmod(0o770)), "others may write to it"),
        (_taken, "belongs to another user"),
    ],
    ids=["a file", "world-writable", "group-writable", "another user's"],
)
def test_a_folder_that_is_not_private_is_refused(
    temp_dir: Path, tools: dict[str, Tool], make: Callable[[Path], object], says: str
) -> None:
    if make is _taken and os.geteuid() != 0:
        pytest.skip("giving a folder to another user needs root")
    folder = temp_dir / f"relay-demo-notes-{os.getuid()}"
    make(folder)
    with pytest.raises(PermissionError, match=says):
        notes_folder()
    for name, args in (("list_notes", ()), ("read_note", ("ideas.md",))):
        with pytest.raises(PermissionError, match=says):
            tools[name](*args)


def test_a_configured_folder_is_checked_the_same_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.setenv("RELAY_DEMO_DIR", str(shared))
    with pytest.raises(PermissionError, match="others may write to it"):
        notes_folder()
    monkeypatch.setenv("RELAY_DEMO_DIR", str(tmp_path / "new" / "notes"))
    assert stat.S_IMODE(notes_folder().stat().st_mode) == 0o700


def test_the_tools_follow_no_link_out_of_the_folder(temp_dir: Path, tools: dict[str, Tool]) -> None:
    folder = notes_folder()
    secret = temp_dir / "secret.txt"
    secret.write_text("SECRET")
    (folder / "secret.md").symlink_to(secret)
    (folder / "linked-dir").symlink_to(temp_dir)

    listed = tools["list_notes"]()
    assert "secret.md" not in listed
    assert listed == f"3 notes: {', '.join(sorted(SAMPLE_NOTES))}"
    with pytest.raises(PermissionError, match="not a plain note"):
        tools["read_note"]("secret.md")
    with pytest.raises(PermissionError, match="not a plain note"):
        tools["write_note"]("secret.md", "overwritten")
    assert secret.read_text() == "SECRET"
    with pytest.raises(ValueError, match="not a note name"):
        tools["read_note"]("linked-dir/secret.txt")
    assert tools["read_note"]("ideas.md") == SAMPLE_NOTES["ideas.md"]
    assert tools["write_note"]("summary.md", "short") == "wrote 5 characters to summary.md"
    assert (folder / "summary.md").read_text() == "short"
    assert tools["write_note"]("summary.md", "s") == "wrote 1 characters to summary.md"
    assert (folder / "summary.md").read_text() == "s"  # replaced, not appended to


def test_a_fifo_in_the_folder_does_not_hang_a_tool(temp_dir: Path, tools: dict[str, Tool]) -> None:
    folder = notes_folder()
    os.mkfifo(folder / "pipe.md")
    outcome: list[BaseException] = []

    def read() -> None:
        try:
            tools["read_note"]("pipe.md")
        except BaseException as error:  # noqa: BLE001 - looked at below
            outcome.append(error)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(10)
    if reader.is_alive():  # free the blocked open before failing
        with open(folder / "pipe.md", "w"):
            pass
        pytest.fail("read_note blocked on a FIFO")
    assert [type(error) for error in outcome] == [PermissionError]
