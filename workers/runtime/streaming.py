"""A model call's reply, into its tree's live stream as it is written.

`ReplyStream` is what a model call hands the model client as its `on_text`: it
writes the pieces of the reply as they arrive (STREAM, `RunStore.live`), after a
`"step"` that says a new reply begins, or a `"restarted"` when this call's reply
starts over (a second attempt after its worker died, or the server failed
mid-reply), so a reader never glues two replies together.

A reply's first piece is written at once; after that, a stream is written at most
once every `WRITE_GAP_S`, the pieces that came meanwhile as one "text" event, and
what is left when the call ends goes at once. A model that sends a token at a time
(fifty or a hundred pieces a second) so costs Redis twenty writes a second a call,
not one a token, and a reader sees its text within a twentieth of a second.

A process streaming many replies at once widens the gap so that all its streams
together are written about `WRITES_PER_S` times a second (at 300 replies, each every
0.3 s): each write costs the process and Redis a script call, and at hundreds of
replies the writes, not the replies, would take the core. The gap follows the replies
streaming now (begun, not closed), as each begins and ends.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import threading
import time
import weakref

from workers.engine.ids import model_call
from workers.errors import StoreUnavailable
from workers.model.wire import RESTART
from workers.store.layout import STREAM_CALL_CHARS
from workers.store.live import LiveStreams

__all__ = ["CLOSE_SECONDS", "WRITES_PER_S", "WRITE_GAP_S", "ReplyStream"]

log = logging.getLogger(__name__)

CLOSE_SECONDS = 2.0
"""How long a call that ended waits for its last pieces to reach the stream."""
WRITE_GAP_S = 0.05
"""A stream's writes are this far apart at least (its first piece and its last go at once)."""
WRITES_PER_S = 1_000
"""A process's streams are written about this many times a second together, at most: the
gap widens past WRITE_GAP_S once more than WRITES_PER_S * WRITE_GAP_S (50) replies stream
at once."""


class _Writer:
    """The writer thread of this process, shared by every call that streams: it takes
    every stream whose pieces are due (at most WRITE_MOST at once, in the order they
    became due) and writes them in one round trip, one STREAM each. (A thread of its
    own per call cost a thread start each call; one shared thread costs nothing while
    no reply streams, and many replies at once share their round trips.)"""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Begin anew: in a forked child, the parent's thread and lock are not its own."""
        self._ready = threading.Condition()
        self._due: list[tuple[float, int, ReplyStream]] = []
        """A heap of (monotonic time due, order, stream); a stream hurried by its close
        is in it twice, and whichever comes first writes what it has queued."""
        self._order = itertools.count()
        self._serving = False
        self._open: weakref.WeakSet[ReplyStream] = weakref.WeakSet()
        """The streams begun and not closed (weak: a stream never closed is not counted
        once it is gone)."""
        self.gap = WRITE_GAP_S
        """How far apart a stream's writes are now (read by the streams; one float)."""

    def schedule(self, stream: ReplyStream, at: float) -> None:
        """Write `stream`'s queued pieces at monotonic time `at` (or at once, if past)."""
        with self._ready:
            heapq.heappush(self._due, (at, next(self._order), stream))
            if not self._serving:  # the first stream of this process
                self._serving = True
                threading.Thread(target=self._serve, name="relay-live", daemon=True).start()
            # Woken only when this is now the first due: else the thread already waits
            # for an earlier one, and takes this with it or after it (a wake-up a piece
            # was a thread switch a piece, with hundreds of replies streaming).
            if self._due[0][2] is stream:
                self._ready.notify()

    def _serve(self) -> None:
        while True:
            with self._ready:
                streams = self._take()
            try:
                _write(streams)
            except Exception as error:  # noqa: BLE001 - the thread serves every later call too
                log.warning("streaming stopped for %d calls: %s", len(streams), error)
                for stream in streams:
                    stream.written(False)
                    stream.settle()

    def _take(self) -> list[ReplyStream]:
        """Wait (holding the condition) until a stream is due; return those due, each once."""
        while True:
            now = time.monotonic()
            taken: dict[int, ReplyStream] = {}
            while self._due and self._due[0][0] <= now and len(taken) < WRITE_MOST:
                stream = heapq.heappop(self._due)[2]
                taken[id(stream)] = stream
            if taken:
                return list(taken.values())
            self._ready.wait(self._due[0][0] - now if self._due else None)

    def opened(self, stream: ReplyStream) -> None:
        """`stream` began: one more to share the writes a second."""
        with self._ready:
            self._open.add(stream)
            self._set_gap()

    def closed(self, stream: ReplyStream) -> None:
        with self._ready:
            self._open.discard(stream)
            self._set_gap()

    def _set_gap(self) -> None:
        self.gap = max(WRITE_GAP_S, len(self._open) / WRITES_PER_S)


def _write(streams: list[ReplyStream]) -> None:
    """Write what each of `streams` has queued, all in one round trip (streams of one
    LiveStreams, as a process has: those of another store go in a round trip of their own)."""
    taken = [(stream, stream.take_queued()) for stream in streams]
    by_store: dict[int, list[tuple[ReplyStream, list[tuple[str, str]]]]] = {}
    for stream, batch in taken:
        by_store.setdefault(id(stream.live), []).append((stream, batch))
    for group in by_store.values():
        live = group[0][0].live
        writing = [(stream, batch) for stream, batch in group if batch and not stream.stopped]
        answers = live.add_many([(stream.run, batch) for stream, batch in writing])
        for (stream, _), answer in zip(writing, answers, strict=True):
            stream.written(answer)
        for stream, _ in group:
            stream.settle()


WRITE_MOST = 256
"""Streams written in one round trip, at most."""
_WRITER = _Writer()
os.register_at_fork(after_in_child=_WRITER.reset)


class ReplyStream:
    """The `on_text` of one model call: its pieces go to the tree's live stream.

    The call's thread only queues a piece; the process's writer thread (`_Writer`)
    sends what has queued in one STREAM, so the reply is never held up by Redis,
    the first piece goes at once, and pieces that arrive within the gap (WRITE_GAP_S,
    or more when the process streams many replies) of the last write (or while it is
    under way) go together, as one "text" event.
    `close()` (the call ended) writes what is left at once and waits for it, so the
    text is in the stream before the reply is saved with the run.

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
        self._queued: list[tuple[str, str]] = []
        self._scheduled = False
        """Due with the writer (from a queued piece until its write begins)."""
        self._taken_at = -WRITE_GAP_S
        """When the writer last took this stream's pieces (monotonic)."""
        self._closing = False
        self._settled = threading.Event()
        """Set while nothing is queued or being written: what `close` waits for."""
        self._settled.set()
        self._stopped = False

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
            self._settled.clear()
            schedule, self._scheduled = not self._scheduled, True
            at = time.monotonic() if self._closing else self._taken_at + _WRITER.gap
        if schedule:
            _WRITER.schedule(self, at)

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
        _WRITER.opened(self)
        return [("restarted" if self._again else "step", self._call), ("text", piece)]

    @property
    def live(self) -> LiveStreams:
        return self._live

    @property
    def run(self) -> str:
        return self._run

    @property
    def stopped(self) -> bool:
        return self._stopped

    def take_queued(self) -> list[tuple[str, str]]:
        """What is queued, for the writer to write (on its thread)."""
        with self._lock:
            batch, self._queued = self._queued, []
            self._scheduled = False  # a piece queued from now on is due again
            self._taken_at = time.monotonic()
        return batch

    def written(self, answer: bool | StoreUnavailable) -> None:
        """What writing the taken pieces came to: False (the tree's root has finished) or
        an error stops this call's streaming."""
        if isinstance(answer, StoreUnavailable):
            log.warning("streaming %s of run %s stopped: %s", self._call, self._run, answer)
        self._stopped = answer is not True

    def settle(self) -> None:
        """The writer is done with this stream for now: `close` may return, unless more
        was queued meanwhile."""
        with self._lock:
            if not self._scheduled:
                self._settled.set()

    def close(self, timeout: float = CLOSE_SECONDS) -> None:
        """The call ended: write what is queued at once (not after the gap), and wait (up
        to `timeout`) until what it wrote is in the stream."""
        with self._lock:
            self._closing = True
            hurry = self._scheduled
        _WRITER.closed(self)
        if hurry:
            _WRITER.schedule(self, time.monotonic())
        self._settled.wait(timeout)

    def __enter__(self) -> ReplyStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
