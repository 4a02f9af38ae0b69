"""Live runs in Redis: a tree's stream of model replies as they are written, and the
follow-ups people send.

One stream per tree (`live:<root>`, see `workers.store.layout`), so a reader
follows a run and its specialists with one cursor, in the order things happened,
and resumes from any id. The worker making a model call writes the pieces of its
reply (STREAM, through `workers.runtime.streaming.ReplyStream`); the SAVE that
finishes a run adds its `"done"`. `LiveStreams` (`RunStore.live`) writes and reads
the stream as `StreamEvent`s, and sends follow-ups (REPLY).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from workers.engine.events import FollowUp
from workers.engine.records import StreamEvent
from workers.errors import StoreUnavailable
from workers.store import reads, scripts
from workers.store.connection import Connection
from workers.store.layout import STREAM_IDLE_S, STREAM_MAX
from workers.store.scripts import ReplyAnswer

__all__ = ["LiveStreams", "stream_id"]

_STREAM_ID = re.compile(r"[0-9]{1,20}(-[0-9]{1,20})?")
_KINDS = frozenset({"text", "step", "restarted", "done"})


def stream_id(value: object) -> str | None:
    """Return `value` if it is a stream id to read after (`"0"`, `"1700000000000-3"`):
    one or two whole numbers that Redis takes (each below 2**64)."""
    if not isinstance(value, str) or not _STREAM_ID.fullmatch(value):
        return None
    return value if all(int(part) < 2**64 for part in value.split("-")) else None


class LiveStreams:
    """The live streams of run trees, and follow-ups, on one Redis connection."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection

    def add_many(
        self, batches: Sequence[tuple[str, list[tuple[str, str]]]]
    ) -> list[bool | StoreUnavailable]:
        """Append each run's (kind, text) events to its tree's stream, all in one round
        trip. For each: True if written; False if the tree's root has finished (or is
        gone) and nothing was written; or the StoreUnavailable that kept it out."""
        keys = self._connection.keys
        calls = [
            scripts.stream(
                keys, run_id=run_id, events=events, keep=STREAM_MAX, idle_s=STREAM_IDLE_S
            )
            for run_id, events in batches
        ]
        return self._connection.run_many(calls)

    def read(self, run_id: str, after: str, block_ms: int | None) -> list[StreamEvent]:
        """Return the events of `run_id`'s tree after id `after` (waiting up to `block_ms`
        for one; None: not at all), oldest first, at most 1,000."""
        keys = self._connection.keys
        return self._connection.drive(reads.live_events(keys, run_id, after, block_ms))

    def reply(self, run_id: str, event: FollowUp, due_ms: int) -> ReplyAnswer:
        """Put a follow-up in a root run's inbox unless its strategy refuses; return REPLY's
        answer: sent, busy, specialist, corrupt or gone."""
        reply = scripts.reply(self._connection.keys, run_id=run_id, event=event, due_ms=due_ms)
        return self._connection.run(reply)
