"""Live runs in Redis: a tree's stream of model replies as they are written, and the
follow-ups people send.

One stream per tree (`live:<root>`, see `workers.store.layout`), so a reader follows a
run and its specialists with one cursor, in the order things happened, and
resumes from any id. `ReplyStream` is what a model call hands its `on_text`:
it writes the pieces of the reply as they arrive (STREAM), after a `"step"`
that says a new reply begins, or a `"restarted"` when this call's reply starts
over (a second attempt after its worker died, or the server failed mid-reply),
so a reader never glues two replies together. The SAVE that finishes a run
adds its `"done"`. `LiveStreams` (`RunStore.live`) reads the stream back as
`StreamEvent`s and sends follow-ups (REPLY).
"""

from __future__ import annotations

import logging
import re
import threading
from typing import TYPE_CHECKING, Any

from workers.engine.records import FollowUp, StreamEvent
from workers.errors import StoreUnavailable
from workers.model.wire import RESTART
from workers.store.codec import as_text
from workers.store.layout import (
    STREAM_CALL_CHARS,
    STREAM_IDLE_S,
    STREAM_MAX,
    OutboxMember,
    RunFields,
    model_call,
)
from workers.store.scripts import lua

if TYPE_CHECKING:
    from workers.store.runs import RunStore

__all__ = ["CLOSE_SECONDS", "LiveStreams", "ReplyStream", "stream_id"]

log = logging.getLogger(__name__)

CLOSE_SECONDS = 2.0
"""How long a call that ended waits for its last pieces to reach the stream."""
_STREAM_ID = re.compile(r"[0-9]{1,20}(-[0-9]{1,20})?")
_KINDS = frozenset({"text", "step", "restarted", "done"})


def stream_id(value: object) -> str | None:
    """Return `value` if it is a stream id to read after (`"0"`, `"1700000000000-3"`)."""
    return value if isinstance(value, str) and _STREAM_ID.fullmatch(value) else None


class LiveStreams:
    """The live streams of run trees, and follow-ups, on a RunStore's Redis."""

    def __init__(self, store: RunStore) -> None:
        self._store = store
        self._add: Any = store.redis.register_script(lua("stream"))
        self._reply: Any = store.redis.register_script(lua("reply"))

    def add(self, run_id: str, events: list[tuple[str, str]]) -> bool:
        """Append (kind, text) events of `run_id` to its tree's stream; False if the tree's
        root has finished (or is gone), and nothing was written."""
        k = self._store.keys
        root = run_id.split(".", 1)[0]
        args: list[str | int] = [STREAM_MAX, STREAM_IDLE_S]
        for kind, text in events:
            args += [kind, run_id, text]
        with self._store.errors():
            return as_text(self._add(keys=[k.run(root), k.live(root)], args=args)) == "added"

    def read(self, run_id: str, after: str, block_ms: int | None) -> list[StreamEvent]:
        """Return the events of `run_id`'s tree after id `after` (waiting up to `block_ms`
        for one; None: not at all), oldest first, at most 1,000."""
        key = self._store.keys.live(run_id)
        with self._store.errors():
            answer = self._store.redis.xread({key: after}, count=1_000, block=block_ms)
        found = []
        for _, entries in answer or []:
            for entry_id, data in entries:
                kind = as_text(data.get(b"k", b""))
                found.append(
                    StreamEvent(
                        id=as_text(entry_id),
                        kind=kind if kind in _KINDS else "text",
                        run_id=as_text(data.get(b"r", b"")),
                        text=as_text(data.get(b"t", b"")),
                    )
                )
        return found

    def reopening(self, run_id: str) -> bool:
        """Whether a follow-up is on its way to the run (its last outcome is not its last)."""
        with self._store.errors():
            return bool(
                self._store.redis.hexists(self._store.keys.run(run_id), RunFields.FOLLOW_UP)
            )

    def reply(self, run_id: str, event: FollowUp, due_ms: int) -> str:
        """Put a follow-up in a root run's inbox unless its strategy refuses; return REPLY's
        answer: sent, busy, specialist, corrupt or gone."""
        k = self._store.keys
        keys = [k.run(run_id), k.inbox(run_id), k.index(run_id).outbox]
        args = [event.model_dump_json(), event.strategy, OutboxMember.advance(run_id), due_ms]
        with self._store.errors():
            return as_text(self._reply(keys=keys, args=args))


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
