"""Continuation in place: a task that saved a step runs its run's next step itself.

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
SAVE_CLAIM; not a tool that must not run twice, see `Calls.claim_ahead`): the task
then makes the call with no CLAIM of its own. Should the task not get to it, the
claim is given back as the message is published.

A slice belongs to one task (or keeper) on one thread: a threads pool runs several at once.

A model call held on the process's loop past its task (`workers.runtime.on_loop`) is
kept on a keeper thread once its reply comes, in a slice of its own (`on_keeper`): the
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
from functools import partial
from typing import Protocol

from workers.engine.effects import Message
from workers.runtime.reports import Report

__all__ = ["Continuation", "Reach", "label"]

log = logging.getLogger(__name__)

Send = Callable[[list[Message]], None]
Step = Callable[[Message], Report]


class Reach(Protocol):
    """What this process may run in place of a message (`celery_app.sending.WorkerReach`)."""

    def owns(self, message: Message) -> bool:
        """Whether this worker consumes the queue `message` would be published to."""
        ...

    def needs_s(self, message: Message) -> float:
        """The hard time limit the message's own task would get (0: none)."""
        ...


@dataclass
class _Slice:
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


class Continuation:
    """Sends a step's messages, or keeps the one next step for the task to run."""

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
        """Publish `messages`, unless they are one step this task may run itself: then
        keep it for `run` (its outbox entry, saved already, covers a crash meanwhile)."""
        here: _Slice | None = getattr(self._local, "slice", None)
        one = here is not None and here.next is None and len(messages) == 1
        if one and here is not None and self._fits(here, messages[0]):
            here.next = messages[0]
            return
        self._send(messages)

    def ahead(self, messages: Sequence[Message]) -> Message | None:
        """The message `send` would keep of `messages`, if any: asked before the step that
        decided them is saved, so that its call can be claimed in the same round trip."""
        here: _Slice | None = getattr(self._local, "slice", None)
        if here is None or here.next is not None or len(messages) != 1:
            return None
        return messages[0] if self._fits(here, messages[0]) else None

    def keep(self, message: Message, release: Callable[[], None]) -> None:
        """Keep `message` (as `ahead` chose it, its call claimed with the save) for this task
        to run next; `release` gives the claim back should the task not run it."""
        here: _Slice = self._local.slice
        here.next, here.release = message, release

    def run(self, first: Message, step: Step, hard_limit_s: float | None = None) -> Report:
        """Run `first` through `step`, then each step it leaves to continue while the slice
        lasts; return what the task did, naming the steps it continued.

        `hard_limit_s`: the task's hard time limit where the pool enforces one."""
        if self.slice_ms <= 0 or getattr(self._local, "slice", None) is not None:
            return step(first)
        now = self._clock()
        killed_at = None if hard_limit_s is None else now + hard_limit_s
        here = _Slice(now + self.slice_ms / 1000, killed_at)
        return self._sliced(here, partial(step, first), step)

    def on_keeper(self, first: Callable[[], Report], step: Step) -> Report:
        """Run `first` (the save of a call the loop held, on a keeper thread) in a slice of
        its own, then each step it leaves that never waits: an advance, or a model call
        (handed back to the loop); anything else is published."""
        if self.slice_ms <= 0 or getattr(self._local, "slice", None) is not None:
            return first()
        here = _Slice(self._clock() + self.slice_ms / 1000, None, only=NEVER_WAIT)
        return self._sliced(here, first, step)

    def _sliced(self, here: _Slice, first: Callable[[], Report], step: Step) -> Report:
        """`first`, then each step kept for this slice."""
        self._local.slice = here
        try:
            report = first()
            while here.next is not None:
                message, here.next, here.release = here.next, None, None
                report = report.continued(label(message), self._continued(message, step))
            return report
        finally:
            self._local.slice = None
            self._publish_kept(here)  # (a step raised after keeping its successor)

    def _publish_kept(self, here: _Slice) -> None:
        """Publish the step `here` kept, if any, that it will not run: its claim given back
        first."""
        if here.next is not None:
            self._give_back(here)
            self._send([here.next])

    @staticmethod
    def _give_back(here: _Slice) -> None:
        """Give back the claim taken for `here.next` with its save, if any, so the task of
        its message claims anew (if that fails, the claim's lease lapses first)."""
        if here.release is None:
            return
        try:
            here.release()
        except Exception as error:  # noqa: BLE001 - the message goes out all the same
            what = "its next step" if here.next is None else label(here.next)
            log.warning("could not give back the claim of %s: %s", what, error)

    def _continued(self, message: Message, step: Step) -> Report:
        try:
            return step(message)
        except Exception as error:  # noqa: BLE001 - its message goes out; the first step stands
            log.warning("continuing %s failed (%s); it is published instead", label(message), error)
            self._send([message])  # a second delivery of a step is harmless (claims, fences)
            return Report(f"failed ({type(error).__name__}); published instead")

    def _fits(self, here: _Slice, message: Message) -> bool:
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
