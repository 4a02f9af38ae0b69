"""A model call's reply, into its tree's live stream as it is written.

`ReplyStream` is what a model call hands the model client as its `on_text`: it
writes the pieces of the reply as they arrive (STREAM, `RunStore.live`), after a
`"step"` that says a new reply begins, or a `"restarted"` when this call's reply
starts over (a second attempt after its worker died, or the server failed
mid-reply), so a reader never glues two replies together.
"""

from __future__ import annotations

import logging
import threading

from workers.engine.ids import model_call
from workers.errors import StoreUnavailable
from workers.model.wire import RESTART
from workers.store.layout import STREAM_CALL_CHARS
from workers.store.live import LiveStreams

__all__ = ["CLOSE_SECONDS", "ReplyStream"]

log = logging.getLogger(__name__)

CLOSE_SECONDS = 2.0
"""How long a call that ended waits for its last pieces to reach the stream."""


class ReplyStream:
    """The `on_text` of one model call: its pieces go to the tree's live stream.

    The call's thread only queues a piece; a writer thread of the call's own
    (started by the first piece) sends what has queued in one STREAM, so the
    reply is never held up by Redis, the first piece goes at once, and pieces that
    arrive while a write is under way go together, as one "text" event. `close()`
    (the call ended) waits for the last write, so the text is in the stream
    before the reply is saved with the run.

    Best effort: the reply itself is saved with the run whatever happens here. At
    most STREAM_CALL_CHARS characters of a reply are written; if Redis fails, or the
    tree's root has finished, the call's streaming stops (the call goes on).
    """

    def __init__(self, live: LiveStreams, run_id: str, seq: int, attempt: int) -> None:
        self._live = live
        self._run = run_id
        self._call = model_call(seq)
        self._again = attempt > 1
        self._begun = False
        self._chars = 0
        self._lock = threading.Lock()
        self._due = threading.Event()
        self._queued: list[tuple[str, str]] = []
        self._closed = False
        self._stopped = False
        self._writer: threading.Thread | None = None

    def __call__(self, piece: str) -> None:
        events = self._events(piece)
        if not events or self._stopped:
            return
        with self._lock:
            for kind, text in events:
                if kind == "text" and self._queued and self._queued[-1][0] == "text":
                    self._queued[-1] = ("text", self._queued[-1][1] + text)  # one event for both
                else:
                    self._queued.append((kind, text))
            self._due.set()
            if self._writer is None:
                self._writer = threading.Thread(target=self._write, name="relay-live", daemon=True)
                self._writer.start()

    def _events(self, piece: str) -> list[tuple[str, str]]:
        """The stream events a piece makes (a mark first when the reply begins or restarts)."""
        if piece == RESTART:
            if not self._chars:
                return []
            self._chars = 0
            return [("restarted", self._call)]
        piece = piece[: STREAM_CALL_CHARS - self._chars]
        if not piece:
            return []
        self._chars += len(piece)
        if self._begun:
            return [("text", piece)]
        self._begun = True
        return [("restarted" if self._again else "step", self._call), ("text", piece)]

    def _write(self) -> None:
        while True:
            self._due.wait()
            with self._lock:
                batch, self._queued = self._queued, []
                self._due.clear()
                closed = self._closed
            if batch and not self._stopped:
                try:
                    self._stopped = not self._live.add(self._run, batch)
                except StoreUnavailable as error:
                    log.warning("streaming %s of run %s stopped: %s", self._call, self._run, error)
                    self._stopped = True
            if closed:
                return

    def close(self, timeout: float = CLOSE_SECONDS) -> None:
        """The call ended: wait (up to `timeout`) until what it wrote is in the stream."""
        with self._lock:
            self._closed = True
            self._due.set()
            writer = self._writer
        if writer is not None:
            writer.join(timeout)

    def __enter__(self) -> ReplyStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
