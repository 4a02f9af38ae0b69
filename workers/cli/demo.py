"""The app `relay demo` runs: a folder of notes, three tools, and an offline demo model.

    relay demo                                   # private Redis, one worker, the demo model
    relay --app workers.cli.demo:relay worker        # or serve it from a fleet of your own

The notes live in RELAY_DEMO_DIR (default: `relay-demo-notes-<uid>` in the
system's temp dir); an empty or missing folder is filled with a few sample notes
the first time a tool looks at it, on whichever worker runs the tool.

The folder is private: it is created 0700, and a folder that is a symbolic
link, is not a directory, belongs to another user or that others may write to
is refused (in a shared temp dir, anyone could have made one first). The tools
open notes relative to the folder without following symbolic links, so a link
planted in it cannot lead them out of it.

With no RELAY_MODEL_URL the app's model is `DemoModel`: deterministic, no
network. It reads the prompt and plays the session a sensible model would
(plan, list the notes, read one, write a summary note, report), and says in
its final answer that it is the demo model. With RELAY_MODEL_URL set the
real model gets the same tools and the same task.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import stat
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from agent_core import ModelRequest, Risk
from agent_core.text import counted
from workers.engine.records import Usage
from workers.model.wire import ModelReply
from workers.relay import Relay
from workers.settings import Settings

__all__ = [
    "SAMPLE_NOTES",
    "DemoModel",
    "build",
    "demo_reply",
    "notes_folder",
    "relay",
]

SUMMARY_NOTE = "summary.md"
SAMPLE_NOTES = {
    "groceries.md": "Oat milk\nCoffee beans\nTwo lemons\nBread for Sunday\n",
    "ideas.md": (
        "Ideas for the garden\n\n"
        "Plant tomatoes along the south wall.\n"
        "Build a small bench from the old fence boards.\n"
        "Ask the neighbours for cuttings of their lavender.\n"
    ),
    "meeting.md": (
        "Team meeting, Tuesday\n\n"
        "The release moves to next Friday.\n"
        "Ana takes over the billing bug.\n"
        "Everyone reviews the onboarding guide by Thursday.\n"
    ),
}
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._ -]{0,99}")
# Where a result ends in the prompt: the next history entry, or the closing instruction.
_ENTRY_END = re.compile(r"\n\n(?=\[|You |Reply |Your last reply|No tool calls)")
_SUMMARY_SYSTEM = "You keep an agent's notes short"
_PLAN_ASK = "Reply now with your plan"
_SIGNATURE = "(This was the demo model: scripted and offline. Set RELAY_MODEL_URL for a real one.)"


def notes_folder() -> Path:
    """Return the notes folder, filled with the sample notes if it is missing or empty.

    Raises:
        PermissionError: the folder is not private to this user (see the module docstring).
    """
    with _opened() as (folder, _):
        return folder


def _folder_path() -> Path:
    configured = os.environ.get("RELAY_DEMO_DIR", "").strip()
    if configured:
        return Path(configured)
    return Path(tempfile.gettempdir()) / f"relay-demo-notes-{os.getuid()}"


@contextmanager
def _opened() -> Iterator[tuple[Path, int]]:
    """Yield the notes folder and a descriptor of it, once it is known to be private.

    The checks are made on the opened folder itself, so it cannot be swapped
    between the check and the use.
    """
    folder = _folder_path()
    folder.parent.mkdir(parents=True, exist_ok=True)
    with suppress(FileExistsError):
        folder.mkdir(mode=0o700)
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as error:
        why = "is a symbolic link" if folder.is_symlink() else "is not a folder we can open"
        raise PermissionError(f"refusing the notes folder {folder}: it {why}") from error
    try:
        _check_private(folder, os.fstat(fd))
        if not os.listdir(fd):
            for name, text in SAMPLE_NOTES.items():
                _write(fd, name, text, exclusive=True)
        yield folder, fd
    finally:
        os.close(fd)


def _check_private(folder: Path, info: os.stat_result) -> None:
    problem = ""
    if not stat.S_ISDIR(info.st_mode):
        problem = "it is not a folder"
    elif info.st_uid != os.getuid():
        problem = f"it belongs to another user (uid {info.st_uid})"
    elif info.st_mode & 0o022:
        problem = f"others may write to it (mode {stat.S_IMODE(info.st_mode):o}; chmod go-w)"
    if problem:
        raise PermissionError(f"refusing the notes folder {folder}: {problem}")


def _checked_name(name: str) -> str:
    if not _NAME.fullmatch(name) or ".." in name:
        raise ValueError(f"{name!r} is not a note name; use a plain file name such as ideas.md")
    return name


def _list(folder: int) -> list[str]:
    """Return the names of the regular files in the folder (links are not followed)."""
    with os.scandir(folder) as entries:
        return sorted(e.name for e in entries if e.is_file(follow_symlinks=False))


def _read(folder: int, name: str) -> str:
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK  # NONBLOCK: a planted FIFO cannot hang us
    try:
        fd = os.open(_checked_name(name), flags, dir_fd=folder)
    except FileNotFoundError:
        raise FileNotFoundError(f"there is no note named {name}") from None
    except OSError as error:
        raise PermissionError(f"{name} is not a plain note (a link, perhaps): {error}") from None
    with open(fd, encoding="utf-8", errors="replace") as note:
        if not stat.S_ISREG(os.fstat(note.fileno()).st_mode):
            raise PermissionError(f"{name} is not a plain note")
        return note.read()


def _write(folder: int, name: str, text: str, *, exclusive: bool = False) -> None:
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
    flags |= os.O_EXCL if exclusive else 0
    try:
        fd = os.open(_checked_name(name), flags, 0o600, dir_fd=folder)
    except FileExistsError:
        if exclusive:
            return  # another worker filled the folder first
        raise
    except OSError as error:
        raise PermissionError(f"{name} is not a plain note (a link, perhaps): {error}") from None
    with open(fd, "w", encoding="utf-8") as note:
        if not stat.S_ISREG(os.fstat(note.fileno()).st_mode):
            raise PermissionError(f"{name} is not a plain note")
        note.truncate()
        note.write(text)


def build(settings: Settings | None = None) -> Relay:
    """Return the demo Relay; it uses `DemoModel` unless the settings name a model server."""
    settings = settings if settings is not None else Settings.from_env()
    model = DemoModel() if settings.model_url is None else None
    relay = Relay("demo", settings=settings, model=model)

    @relay.tool(risk=Risk.READ)
    def list_notes() -> str:
        """List the notes in the folder."""
        with _opened() as (_, folder):
            names = _list(folder)
        return f"{counted(len(names), 'note')}: {', '.join(names)}" if names else "0 notes"

    @relay.tool(risk=Risk.READ)
    def read_note(name: str) -> str:
        """Read one note.

        Args:
            name: The note's file name, as list_notes shows it.
        """
        with _opened() as (_, folder):
            return _read(folder, name)

    @relay.tool(risk=Risk.WRITE)
    def write_note(name: str, text: str) -> str:
        """Write a note, replacing one of that name.

        Args:
            name: A plain file name, such as summary.md.
            text: The whole text of the note.
        """
        with _opened() as (_, folder):
            _write(folder, name, text)
        return f"wrote {len(text)} characters to {name}"

    return relay


class DemoModel:
    """A stand-in for a model that needs no network: `demo_reply` after a short pause,
    streamed a few words at a time to a caller that takes text. Async, like the HTTP
    client: its pauses are the event loop's, and it holds no thread while it thinks."""

    def __init__(self, think_seconds: float = 0.3) -> None:
        self.think_seconds = think_seconds

    async def complete(
        self,
        request: ModelRequest,
        *,
        should_stop: Callable[[], bool] | None = None,
        on_text: Callable[[str], None] | None = None,
    ) -> ModelReply:
        deadline = time.monotonic() + self.think_seconds
        while time.monotonic() < deadline and not (should_stop and should_stop()):
            await asyncio.sleep(0.05)  # long enough for a spinner to show; stops when told
        text = demo_reply(request.system, request.prompt)
        if on_text is not None:
            for start in range(0, len(text), 16):  # a few words at a time, as a model writes
                on_text(text[start : start + 16])
                await asyncio.sleep(0.01)
        prompt_tokens = (len(request.system) + len(request.prompt)) // 4
        completion_tokens = max(1, len(text) // 4)
        usage = Usage(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            total_tokens=prompt_tokens + completion_tokens,
        )
        return ModelReply(text=text, usage=usage)


# --- the demo model's part: a pure function of the request ----------------------------


def demo_reply(system: str, prompt: str) -> str:
    """Return what the demo model says to a request; the same request, the same reply."""
    if system.startswith(_SUMMARY_SYSTEM):
        return "Listed the notes and read one of them (summary written by the demo model)."
    if _PLAN_ASK in prompt:
        return json.dumps(
            {
                "plan": [
                    "List the notes in the folder",
                    "Read the note that fits the task best",
                    f"Write a short summary of it to {SUMMARY_NOTE}",
                    "Report what was done",
                ]
            }
        )
    return _next_move(prompt)


def _next_move(prompt: str) -> str:
    listed = _output_of(prompt, "list_notes")
    if listed is None:
        return _call("list_notes")
    names = _names(listed)
    if not names:
        return _final(f"The folder has no notes to summarise. {_SIGNATURE}")
    chosen = _choose(names, _task_of(prompt))
    read = _output_of(prompt, "read_note")
    if read is None:
        return _call("read_note", name=chosen)
    return _after_reading(prompt, len(names), chosen, read)


def _after_reading(prompt: str, count: int, chosen: str, read: str) -> str:
    if read.startswith("error:"):
        return _final(f"I could not read {chosen}: {read[6:].strip()} {_SIGNATURE}")
    summary = _summary_of(chosen, read.removeprefix("ok:").strip())
    written = _output_of(prompt, "write_note")
    if written is None:
        return _call("write_note", name=SUMMARY_NOTE, text=summary)
    if written.startswith("ok:"):
        return _final(
            f"I listed {counted(count, 'note')}, read {chosen} and wrote a summary of it to"
            f" {SUMMARY_NOTE}. {_SIGNATURE}"
        )
    return _final(
        f"I listed {counted(count, 'note')} and read {chosen}, but {SUMMARY_NOTE} was not"
        " written"
        f" ({written.split('.')[0]}). The summary would have been:\n{summary}\n{_SIGNATURE}"
    )


def _call(tool: str, **args: str) -> str:
    return json.dumps({"tool": tool, "args": args})


def _final(text: str) -> str:
    return json.dumps({"final": text, "model": "demo"})


def _task_of(prompt: str) -> str:
    return prompt.split("\n\n", 1)[0].removeprefix("Task:\n")


def _output_of(prompt: str, tool: str) -> str | None:
    """Return what the newest call of `tool` gave (`ok: ...`, `error: ...`), or None."""
    marker = f"] {tool} "
    at = prompt.rfind(marker)
    if at < 0:
        return None
    arrow = prompt.find("\n→ ", at)
    if arrow < 0:
        return None
    return _ENTRY_END.split(prompt[arrow + 3 :], maxsplit=1)[0]


def _names(listed: str) -> list[str]:
    """Return the note names in list_notes' output (`3 notes: a.md, b.md, c.md`)."""
    if not listed.startswith("ok:"):
        return []
    _, colon, names = listed.removeprefix("ok:").partition(": ")
    if not colon:
        return []
    return [n.strip() for n in names.split("\n", 1)[0].split(",") if n.strip()]


def _choose(names: list[str], task: str) -> str:
    """Return the note the task names, else the first one that is not a summary."""
    lowered = task.lower()
    named = [n for n in names if n.lower() in lowered or n.rsplit(".", 1)[0].lower() in lowered]
    others = [n for n in names if n != SUMMARY_NOTE]
    return (named or others or names)[0]


def _summary_of(name: str, text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    points = "\n".join(f"- {line[:120]}" for line in lines[:5]) or "- (the note is empty)"
    return f"# Summary of {name}\n\n{points}\n\nWritten by the Relay demo model.\n"


relay = build()
