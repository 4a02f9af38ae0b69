"""Skills on disk: the one module of agent_core that touches the filesystem.

    skill_folder(path), read_folder(folder)  one skill folder, read (`Skill.load`)
    skill_folders(path)                      every skill folder under a folder
                                             (`Skill.load_all`)
    read_part(skill, path, offset, limit)    a part of a skill's file (`read_skill_file`)

It reads; `agent_core.skills` makes skills of what it read (and never the other
way round: this module knows no `Skill`, only the rules of `skill_paths`).

The state machine (agent, transitions, state, prompts) never imports this
module, and tests/test_core_purity.py proves it; the hosts do: the blocking
driver `agent_core.run` and the workers carry out `read_skill_file` with
`read_part`.

What a skill's files are. `read_folder` lists the regular files under the
skill's folder: hidden names (`.env`, `.git`) and `__pycache__` are skipped,
links to folders are not followed, and links that lead outside the folder, hard
links (another name for the file may be anywhere), FIFOs, sockets and devices
are left out with a warning. At most
`RESOURCES_MAX` files, `LIST_DEPTH_MAX` folders deep.

How a file is read. `read_part` reads only a listed path (or the body, under
`SKILL.md`), and checks again when it reads: the path is relative without
`..`; its real path (links followed) is inside the folder's real path; it is
opened without following a last link and without blocking (a FIFO put there
since), and must be a regular file of at most `FILE_BYTES_MAX` bytes, and
text. Someone who can write to the skill folder could still race these
checks: the folders are the operator's, the paths are the model's.
"""

from __future__ import annotations

import logging
import os
import stat
import unicodedata
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from agent_core.errors import SkillError
from agent_core.skill_paths import RESOURCES_MAX, SKILL_MD, SKILL_MD_NAMES, resource_path_problem
from agent_core.tools import ToolOutput

__all__ = [
    "FILE_BYTES_MAX",
    "SKILL_MD_BYTES_MAX",
    "FolderRead",
    "Unreadable",
    "read_folder",
    "read_part",
    "skill_folder",
    "skill_folders",
]

log = logging.getLogger(__name__)

SKILL_MD_BYTES_MAX = 256 * 1024
"""A longer SKILL.md is refused: its body travels in every snapshot of every run."""
FILE_BYTES_MAX = 1024 * 1024
"""A longer file of a skill is not read."""
PART_CHARS_MAX = 100_000
"""The most characters one `read_part` returns, whatever limit it is given."""
LIST_DEPTH_MAX = 6
LIST_ENTRIES_MAX = 5_000
WALK_DEPTH_MAX = 8
WALK_FOLDERS_MAX = 10_000
BINARY_PROBE = 8_192
_NAMES = SKILL_MD_NAMES
_SKIPPED = "__pycache__"
_NOT_SKILLS = frozenset(
    {".git", ".github", ".gitlab", ".hg", ".svn", ".idea", ".vscode", ".venv", "venv"}
    | {"node_modules", "__pycache__", ".tox", ".cache"}
)
"""Folders the search for skills does not enter: a repository's and its tools' own.
Other hidden folders are searched (a repository may keep skills under `.curated/`)."""


class _Refused(Exception):
    """A file that cannot be read, and why (becomes a SkillError or a tool error)."""


class Unreadable(Exception):
    """Raised when a skill folder cannot be read: the file to blame, and why."""

    def __init__(self, where: Path, why: str) -> None:
        super().__init__(f"{where}: {why}")
        self.why = why


# --- loading -------------------------------------------------------------------------------


@dataclass(frozen=True)
class FolderRead:
    """A skill folder as read from disk, its SKILL.md not yet parsed."""

    folder: Path
    """As given (messages name it)."""
    real: str
    """Its real path (links followed): where its files are read from."""
    folder_name: str
    """Its name, NFKC-normalised: a skill's name should be the same."""
    file_name: str
    """SKILL.md, or skill.md."""
    text: str
    resources: tuple[str, ...]
    """Its files, relative, sorted; at most RESOURCES_MAX."""
    warnings: tuple[str, ...]
    """Files left out of `resources`, and why."""


def skill_folder(path: str | os.PathLike[str]) -> Path:
    """The skill folder `path` names (the folder, or its SKILL.md).

    Raises:
        SkillError: `path` is not text or a path.
    """
    folder = _given(path)
    if folder.name in _NAMES and folder.is_file():
        folder = folder.parent
    return folder


def skill_folders(path: str | os.PathLike[str]) -> tuple[list[Path], list[tuple[str, str]]]:
    """Every skill folder under the folder `path`, in path order, and (path, why) of each
    folder the walk could not search.

    Raises:
        SkillError: `path` is not a folder that can be read.
    """
    root = _given(path)
    _real_folder(root)
    warnings: list[tuple[str, str]] = []
    return list(_skill_folders(root, warnings)), warnings


def _given(path: object) -> Path:
    try:
        return Path(os.fspath(path))  # type: ignore[call-overload]
    except TypeError:
        raise SkillError(
            f"a skill path must be text or a path, got {type(path).__name__}"
        ) from None


def _real_folder(folder: Path) -> Path:
    """Return the real path of `folder`, or raise SkillError if it is not a readable folder."""
    try:
        real = folder.resolve(strict=True)
    except (OSError, RuntimeError) as error:
        raise SkillError(f"{folder}: {_os_reason(error)}") from None
    if not real.is_dir():
        raise SkillError(f"{folder}: not a folder")
    return real


def read_folder(folder: Path) -> FolderRead:
    """Read the skill folder `folder`: its SKILL.md's text and its files.

    Raises:
        Unreadable: naming the folder's SKILL.md (or the folder) and why.
    """
    try:
        real = _real_folder(folder)
    except SkillError as error:
        raise Unreadable(folder, str(error).removeprefix(f"{folder}: ")) from None
    name = next((n for n in _NAMES if os.path.lexists(real / n)), None)
    if name is None:
        raise Unreadable(folder, "has no SKILL.md")
    try:
        text = _read_confined(real, name, SKILL_MD_BYTES_MAX).decode("utf-8")
    except _Refused as refused:
        raise Unreadable(folder / name, f"the {name} {refused}") from None
    except UnicodeDecodeError as error:
        raise Unreadable(
            folder / name, f"the {name} is not UTF-8 text (byte {error.start})"
        ) from None
    folder_name = unicodedata.normalize("NFKC", os.path.basename(os.path.abspath(folder)))
    resources, listing = _list_resources(real)
    return FolderRead(folder, str(real), folder_name, name, text, tuple(resources), tuple(listing))


def _skill_folders(root: Path, warnings: list[tuple[str, str]]) -> Iterator[Path]:
    """Yield each folder under `root` holding a SKILL.md, in path order, without entering one.

    Hidden folders are searched too, but for a repository's own (`_NOT_SKILLS`); links
    to folders are followed once each, if they lead to a folder inside `root` (one
    leading out is left out, with a warning: it would expose files beside no skill).
    """
    stack = [(root, 0)]
    seen: set[str] = set()
    inside = os.path.realpath(root)
    while stack:
        folder, depth = stack.pop()
        real = os.path.realpath(folder)
        if real in seen:
            continue
        if not _inside(inside, real):
            warnings.append((str(folder), "a link to a folder outside the skills folder: left out"))
            continue
        seen.add(real)
        if len(seen) > WALK_FOLDERS_MAX:
            warnings.append((str(root), f"stopped after {WALK_FOLDERS_MAX} folders"))
            return
        if any(os.path.lexists(os.path.join(real, n)) for n in _NAMES):
            yield folder
            continue
        try:
            with os.scandir(folder) as entries:
                children = sorted(
                    e.name for e in entries if e.name not in _NOT_SKILLS and e.is_dir()
                )
        except OSError as error:
            warnings.append((str(folder), f"cannot be listed: {_os_reason(error)}"))
            continue
        if children and depth >= WALK_DEPTH_MAX:
            warnings.append((str(folder), f"more than {WALK_DEPTH_MAX} folders deep: not searched"))
            continue
        stack.extend((folder / name, depth + 1) for name in reversed(children))


def _list_resources(root: Path) -> tuple[list[str], list[str]]:
    """Return the files of the skill folder `root` (relative, sorted) and warnings."""
    listing = _Listing(str(root))
    listing.run()
    return sorted(listing.found), listing.warnings


class _Listing:
    """A walk over one skill folder, level by level, so the shallow files are kept first."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.found: list[str] = []
        self.warnings: list[str] = []
        self.queue: deque[tuple[str, str, int]] = deque([("", root, 1)])
        self.looked = 0

    def run(self) -> None:
        while self.queue:
            prefix, folder, depth = self.queue.popleft()
            try:
                with os.scandir(folder) as scanned:
                    entries = sorted(scanned, key=lambda e: e.name)
            except OSError as error:
                self.warnings.append(f"{prefix or './'} cannot be listed: {_os_reason(error)}")
                continue
            for entry in entries:
                if not self._take(entry, prefix, depth):
                    return

    def _take(self, entry: os.DirEntry[str], prefix: str, depth: int) -> bool:
        """Look at one entry; False when the listing must stop."""
        self.looked += 1
        if self.looked > LIST_ENTRIES_MAX:
            self.warnings.append(f"stopped listing files after {LIST_ENTRIES_MAX} entries")
            return False
        path = prefix + entry.name
        if entry.name.startswith(".") or entry.name == _SKIPPED:
            return True
        if not prefix and entry.name in _NAMES:
            return True
        problem = resource_path_problem(path)
        kind = f"its path {problem}" if problem else _kind(entry, self.root)
        if kind == "folder" and depth < LIST_DEPTH_MAX:
            self.queue.append((path + "/", entry.path, depth + 1))
        elif kind == "folder":
            self.warnings.append(f"left out {path}/: more than {LIST_DEPTH_MAX} folders deep")
        elif kind != "file":
            self.warnings.append(f"left out {ascii(path)[1:-1][:120]}: {kind}")
        elif len(self.found) < RESOURCES_MAX:
            self.found.append(path)
        else:
            self.warnings.append(f"only the first {RESOURCES_MAX} files are listed and readable")
            return False
        return True


def _kind(entry: os.DirEntry[str], root: str) -> str:
    """Return "file", "folder", or why the entry is left out."""
    kind = "not a regular file"
    try:
        if entry.is_symlink():
            target = os.path.realpath(entry.path)
            if not _inside(root, target):
                kind = "a link to outside the skill folder"
            elif os.path.isdir(target):
                kind = "a link to a folder (not followed)"
            elif os.path.isfile(target):
                kind = "file"
        elif entry.is_dir(follow_symlinks=False):
            kind = "folder"
        elif entry.is_file(follow_symlinks=False):
            hard_linked = entry.stat(follow_symlinks=False).st_nlink > 1
            kind = (
                "a hard link (its other name may be outside the folder)" if hard_linked else "file"
            )
    except OSError as error:
        kind = f"cannot be examined: {_os_reason(error)}"
    return kind


# --- reading -------------------------------------------------------------------------------


class SkillOnDisk(Protocol):
    """What `read_part` reads of a skill (an `agent_core.Skill`)."""

    @property
    def name(self) -> str: ...
    @property
    def body(self) -> str: ...
    @property
    def folder(self) -> str | None: ...
    @property
    def resources(self) -> tuple[str, ...]: ...


def read_part(
    skill: SkillOnDisk, path: str, offset: int = 0, limit: int = PART_CHARS_MAX
) -> ToolOutput:
    """Return up to `limit` characters of the skill's file `path` from `offset`, as a tool output.

    `path` is one of `skill.resources`, or `SKILL.md` for the body. A part that
    stops before the end says so and gives the offset to read on from; it ends
    at a line break when one is near. Every refusal (an unknown path, one
    leading outside the folder, a non-regular, too large or binary file, an
    offset past the end) is an error output for the model, never an exception.
    """
    if path == SKILL_MD:
        return _part(path, skill.body, offset, limit)
    if path not in skill.resources:
        return ToolOutput.error(f"{path!r} is not a file of the skill {skill.name}")
    if not skill.folder:
        return ToolOutput.error(f"the skill {skill.name} has no folder to read {path} from")
    try:
        data = _read_confined(Path(skill.folder), path, FILE_BYTES_MAX)
    except _Refused as refused:
        return ToolOutput.error(f"{path}: {refused}")
    if b"\x00" in data[:BINARY_PROBE]:
        return ToolOutput.error(f"{path} is not a text file; it cannot be read here")
    return _part(path, data.decode("utf-8", errors="replace"), offset, limit)


def _part(path: str, text: str, offset: int, limit: int) -> ToolOutput:
    total = len(text)
    if offset < 0 or offset > total or (offset == total and total):
        return ToolOutput.error(f"offset {offset} is outside {path}, which has {total} characters")
    if not total:
        return ToolOutput.ok(f"({path} is empty)")
    limit = max(1, min(limit, PART_CHARS_MAX))
    end = min(total, offset + limit)
    if end < total:
        line_end = text.rfind("\n", offset, end)
        if line_end >= offset + limit // 2:
            end = line_end + 1
    part = text[offset:end]
    if end < total:
        return ToolOutput.ok(
            f"{part}\n[{path}: characters {offset} to {end} of {total}; read on with offset {end}]"
        )
    if offset:
        return ToolOutput.ok(f"{part}\n[{path}: the end, {total} characters]")
    return ToolOutput.ok(part)


def _read_confined(root: Path, path: str, cap: int) -> bytes:
    """Return the bytes of the regular file `path` inside the folder `root`.

    Raises:
        _Refused: the path is absolute, has `..`, leads outside `root` (through
            a link or otherwise), cannot be opened, is not a regular file, or
            holds more than `cap` bytes.
    """
    problem = resource_path_problem(path)
    if problem:
        raise _Refused(f"the path {problem}")
    base = os.path.realpath(root)
    target = os.path.realpath(os.path.join(base, path))
    if not _inside(base, target):
        raise _Refused("leads outside the skill folder")
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(target, flags)
    except OSError as error:
        raise _Refused(f"cannot be opened: {_os_reason(error)}") from None
    try:
        _check_opened(os.fstat(fd), cap)
        chunks: list[bytes] = []
        size = 0
        while size <= cap:
            chunk = os.read(fd, min(1 << 16, cap + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > cap:
            raise _Refused(f"is more than {cap} bytes long; at most {cap} are read")
        return b"".join(chunks)
    except OSError as error:
        raise _Refused(f"cannot be read: {_os_reason(error)}") from None
    finally:
        os.close(fd)


def _check_opened(info: os.stat_result, cap: int) -> None:
    """Refuse an opened file that is not a plain regular file of at most `cap` bytes."""
    if not stat.S_ISREG(info.st_mode):
        raise _Refused("is not a regular file")
    if info.st_nlink > 1:  # another name for it may be anywhere on this file system
        raise _Refused("is a hard link; it is not read")
    if info.st_size > cap:
        raise _Refused(f"is {info.st_size} bytes long; at most {cap} are read")


def _inside(root: str, target: str) -> bool:
    return os.path.commonpath([root, target]) == root


def _os_reason(error: BaseException) -> str:
    if isinstance(error, OSError) and error.strerror:
        return error.strerror.lower()
    return type(error).__name__
