"""Placement: where a run's next step runs. Kept for this thread to run in place, or
published as a message.

After a step is saved, what must happen next is often one message: an advance,
a model call or a tool call. Publishing it would only hand it, through the
broker, to a worker like this one. So when this worker consumes that message's
queue and the task's slice (`RELAY_INLINE_MS` from the task's start) has time
left, the task runs the step itself, through the very body the message would
have reached: CLAIM, lease, fence and SAVE exactly as if it had come.

The outbox entry the SAVE wrote for the message stays. A worker that dies
mid-slice therefore loses nothing (the tick sends the message again once its
grace is over), and runs nothing twice (the claim counts attempts, and a second
attempt of a tool that is not idempotent reports its outcome unknown).

A batch of more than one call, a message for a queue this worker does not
consume, a delayed one, and anything decided after the slice are published as
usual, so no run holds a worker's slot much longer than its slice while other
messages wait. (A step begun within the slice runs to its end: a slice bounds
when the last step starts, not how long it takes.)

The step that keeps a call claims it in its save's round trip (`ahead`, `keep`;
SAVE_CLAIM; not a tool that must not run twice, see `Claims.ahead`): the task
then makes the call with no CLAIM of its own. Should the task not get to it, the
claim is given back as the message is published.

A slice belongs to one task (or keeper) on one thread: a threads pool runs several at once.

A model call held on the process's loop past its task (`workers.runtime.on_loop`) is
kept on a keeper thread once its reply comes, in a slice of its own (`open(keeper=True)`): the
keeper continues the run's next steps in place as a task would, but only those that never
wait (an advance, and a model call, which it hands back to the loop); a tool call is
published, so no tool ever holds up the outcomes of other calls.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from workers.engine.effects import Message

__all__ = ["NEVER_WAIT", "Placement", "Reach", "Slice", "label"]

log = logging.getLogger(__name__)

Send = Callable[[list[Message]], None]


class Reach(Protocol):
    """What this process may run in place of a message (`celery_app.sending.WorkerReach`)."""

    def owns(self, message: Message) -> bool:
        """Whether this worker consumes the queue `message` would be published to."""
        ...

    def needs_s(self, message: Message) -> float:
        """The hard time limit the message's own task would get (0: none)."""
        ...


@dataclass
class Slice:
    ends: float
    """When the slice is over (monotonic seconds): nothing new starts after it."""
    killed_at: float | None
    """When the pool kills this task (a hard time limit on prefork), if ever."""
    next: Message | None = None
    """The one message the last step left for this task to run itself."""
    release: Callable[[], None] | None = None
    """Gives back the claim taken for `next` with its step's save, if `next` is not run."""
    only: frozenset[str] | None = None
    """The kinds of step this slice may continue (None: any)."""


NEVER_WAIT = frozenset({"advance", "call_model"})
"""The steps a keeper continues: neither holds it (a model call goes back to the loop)."""


class Placement:
    """Decides where a run's next step runs: kept for this thread to run in place (a slice,
    `open`, `next`, `close`), or published (`send`). The task's loop that runs the kept
    steps is the runtime's (`Runtime.task`); this only keeps and publishes."""

    def __init__(
        self,
        send: Send,
        slice_ms: int,
        reach: Reach | None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._send = send
        self.slice_ms = slice_ms if reach is not None else 0
        self._reach = reach
        self._clock = clock
        self._local = threading.local()

    def send(self, messages: list[Message]) -> None:
        """Publish `messages`, unless they are one step this thread may run itself: then
        keep it for `next` (its outbox entry, saved already, covers a crash meanwhile)."""
        here: Slice | None = getattr(self._local, "slice", None)
        one = here is not None and here.next is None and len(messages) == 1
        if one and here is not None and self._fits(here, messages[0]):
            here.next = messages[0]
            return
        self._send(messages)

    def publish(self, messages: list[Message]) -> None:
        """Publish `messages`, whatever the slice (a continued step that failed)."""
        self._send(messages)

    def ahead(self, messages: Sequence[Message]) -> Message | None:
        """The message `send` would keep of `messages`, if any: asked before the step that
        decided them is saved, so that its call can be claimed in the same round trip."""
        here: Slice | None = getattr(self._local, "slice", None)
        if here is None or here.next is not None or len(messages) != 1:
            return None
        return messages[0] if self._fits(here, messages[0]) else None

    def keep(self, message: Message, release: Callable[[], None]) -> None:
        """Keep `message` (as `ahead` chose it, its call claimed with the save) for this thread
        to run next; `release` gives the claim back should it not run it."""
        here: Slice = self._local.slice
        here.next, here.release = message, release

    def open(self, hard_limit_s: float | None = None, *, keeper: bool = False) -> Slice | None:
        """Begin this thread's slice: a task's (`hard_limit_s`: its time limit, where the
        pool kills at it), or a keeper's, which continues only the steps that never wait
        (`NEVER_WAIT`). None when continuing is off, or a slice is open already."""
        if self.slice_ms <= 0 or getattr(self._local, "slice", None) is not None:
            return None
        now = self._clock()
        killed_at = None if hard_limit_s is None else now + hard_limit_s
        here = Slice(now + self.slice_ms / 1000, killed_at, only=NEVER_WAIT if keeper else None)
        self._local.slice = here
        return here

    @staticmethod
    def next(here: Slice | None) -> Message | None:
        """The step the last one kept for this slice to run next (taken), if any."""
        if here is None or here.next is None:
            return None
        message, here.next, here.release = here.next, None, None
        return message

    def close(self, here: Slice | None) -> None:
        """End the slice: a step it kept and did not run is published, its claim given back
        first (a step raised after keeping its successor)."""
        if here is None:
            return
        self._local.slice = None
        if here.next is not None:
            self._give_back(here)
            self._send([here.next])

    @staticmethod
    def _give_back(here: Slice) -> None:
        """Give back the claim taken for `here.next` with its save, if any, so the task of
        its message claims anew (if that fails, the claim's lease lapses first)."""
        if here.release is None:
            return
        try:
            here.release()
        except Exception as error:  # noqa: BLE001 - the message goes out all the same
            what = "its next step" if here.next is None else label(here.next)
            log.warning("could not give back the claim of %s: %s", what, error)

    def _fits(self, here: Slice, message: Message) -> bool:
        reach = self._reach
        if here.only is not None and message.kind not in here.only:
            return False
        if reach is None or message.delay_ms > 0 or not reach.owns(message):
            return False
        now = self._clock()
        if now >= here.ends:
            return False
        # Under a hard time limit, the step must fit in what is left of it: a tool
        # continued after a short one would otherwise be killed at the first's limit.
        return here.killed_at is None or now + reach.needs_s(message) <= here.killed_at


def label(message: Message) -> str:
    """The step a message stands for, as a task's report names it."""
    if message.kind == "call_model":
        return f"model call m{message.seq}"
    if message.kind == "run_tool":
        return f"{message.call} {message.tool}".rstrip()
    return "advance"
