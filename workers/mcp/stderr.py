"""What a stdio MCP server writes to its stderr: logged, never printed over a command's
output.

Many servers greet on stderr ("Secure MCP Filesystem Server running on stdio"); a
child that inherits the process's stderr would print that into `relay tools`' table.
Each server instead writes into a pipe of its own; a thread reads it in chunks of
at most 64 KiB and splits them into lines (a line longer than LINE_CHARS is cut and
the rest of it skipped, so a server writing endlessly without a newline holds no
more than a chunk and a line of memory here), logs each line at INFO under the
server's name (a worker's log shows them; a command's quiet logging does not), and
keeps the last few, which the error says when the server could not be started.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import deque
from io import BufferedReader
from typing import TextIO

__all__ = ["ServerStderr"]

log = logging.getLogger(__name__)

KEPT_LINES = 5
"""The last lines kept to say why a server could not be started."""
LINE_CHARS = 500
"""A longer line is cut (in the log and in the error)."""
CHUNK_BYTES = 64 * 1024
"""What one read of the pipe takes at most."""
_LINE_BYTES = LINE_CHARS * 4  # UTF-8 needs up to 4 bytes a character


class ServerStderr:
    """One stdio server process's stderr: `errlog` is the end to give the process."""

    def __init__(self, server: str) -> None:
        self.server = server
        read_end, write_end = os.pipe()
        self.errlog: TextIO = os.fdopen(write_end, "w")
        """The pipe's write end, for the process; close it once the process has it."""
        self._last: deque[str] = deque(maxlen=KEPT_LINES)
        self._reader = threading.Thread(
            target=self._drain,
            args=(os.fdopen(read_end, "rb"),),
            name=f"mcp-{server}-stderr",
            daemon=True,  # it ends when the server's process (and its children) close the pipe
        )
        self._reader.start()

    def handed_over(self) -> None:
        """Close this process's copy of the write end: the pipe ends when the server's does."""
        if not self.errlog.closed:
            self.errlog.close()

    def last(self, wait_s: float = 1.0) -> str:
        """The last lines the server wrote, once its end closed (waiting `wait_s` at most:
        a child of the server may still hold the pipe), joined by ' / '."""
        self.handed_over()
        self._reader.join(wait_s)
        return " / ".join(self._last)

    def _drain(self, pipe: BufferedReader) -> None:
        with pipe:
            pending = b""
            skipping = False  # the line being read was cut already: drop the rest of it
            while chunk := pipe.read1(CHUNK_BYTES):
                *lines, pending = (pending + chunk).split(b"\n")
                for raw in lines:
                    if not skipping:
                        self._said(raw)
                    skipping = False
                if len(pending) > _LINE_BYTES:
                    if not skipping:
                        self._said(pending)
                    pending, skipping = b"", True
            if pending and not skipping:
                self._said(pending)

    def _said(self, raw: bytes) -> None:
        line = _printable(raw[:_LINE_BYTES].decode("utf-8", "replace").rstrip())[:LINE_CHARS]
        if line:
            self._last.append(line)
            log.info("MCP server %s said: %s", self.server, line)


def _printable(line: str) -> str:
    """The line with each control character (a terminal's escape, a carriage return) shown
    as '?': what a server writes must not steer the terminal that reads the log."""
    return "".join(c if c.isprintable() or c == "\t" else "?" for c in line)
