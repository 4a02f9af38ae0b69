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

A slice belongs to one task on one thread: a threads pool runs several at once.

A model call carried past its task (`workers.runtime.carried`) is saved on its call
thread once it ends, in a slice of its own. That thread borrows a slot of the
process's pool (`borrow`) and continues the run's next steps in place as a task would,
instead of publishing the next step as a message for a task of this same pool to take.
It takes a slot free then (no task running in it, none waiting for it); else, once the
save has left a step to continue (claimed with it), it waits for one to be given back,
at most the rest of its slice (and a third of the claim's lease: it is not renewed
meanwhile), and never takes one a task waits for; past that the step is published and
its claim given back. (Tasks are short when their calls are carried, so on a busy
prefork child the wait is mostly a few milliseconds, where a message would cost a
publish, a delivery, an ack and a claim of its own.) A task that comes while a slot is
borrowed waits for it, so the pool runs no more steps at once than it has slots, but at
most one slice: a borrowed step that outlasts it has the task run beside it. A tool
continued there keeps its own timeout (`run_leased`); what a prefork pool adds, the
kill at the task's hard time limit, does not reach a call thread (as on a threads
pool): a tool that hangs past its timeout holds its helper thread, not the slot.
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


class Continuation:
    """Sends a step's messages, or keeps the one next step for the task to run."""

    def __init__(
        self,
        send: Send,
        slice_ms: int,
        reach: Reach | None,
        clock: Callable[[], float] = time.monotonic,
        *,
        claim_held_s: float = float("inf"),
    ) -> None:
        self._send = send
        self._claim_held_s = claim_held_s
        """How long a call thread may wait for a slot with the claim its save took (not
        renewed meanwhile): a third of a call's lease, as often as a running call renews."""
        self.slice_ms = slice_ms if reach is not None else 0
        self._reach = reach
        self._clock = clock
        self._local = threading.local()
        self.slots = 1
        """Tasks this process's pool runs at once (a threads pool's -c; a prefork child or
        a solo pool: 1), as the worker says it as it starts (`Runtime.use_slots`)."""
        self._running = 0
        """Slots taken: tasks in a slice, and call threads that borrowed one (`borrow`)."""
        self._borrowed = 0
        """Slots call threads hold (`borrow`): only for these does a task ever wait."""
        self._waiting = 0
        """Tasks waiting for a slot a call thread borrowed."""
        lock = threading.Lock()
        self._count = threading.Condition(lock)
        """Tasks wait on this one: every one may go once no slot is borrowed."""
        self._spare = threading.Condition(lock)
        """Call threads wait on this one: one is woken each time a slot is given back."""

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

    def slot_to_spare(self) -> bool:
        """Whether this process's pool has a slot free beside the tasks running now (a
        threads pool that is not full: a task may wait there without holding up another)."""
        with self._count:
            return self._slot_for_call_thread()

    def left_s(self) -> float:
        """Seconds left of the slice of the task running on this thread (0 outside one)."""
        here: _Slice | None = getattr(self._local, "slice", None)
        return 0.0 if here is None else max(0.0, here.ends - self._clock())

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
        self._take_slot()
        here = _Slice(self._clock() + self.slice_ms / 1000, killed_at)
        return self._sliced(here, partial(step, first), step)

    def borrow(self, first: Callable[[], Report], step: Step) -> Report:
        """Run `first` (a carried call's save, on its call thread) in a slice of its own,
        then each step it leaves to continue, as a task would, in a slot of this process's
        pool: one free now, or else one given back (and no task waiting for it) before the
        slice is over (and the claim the save took is due its renewal); past that the
        step it left is published."""
        if self.slice_ms <= 0 or getattr(self._local, "slice", None) is not None:
            return first()
        here = _Slice(self._clock() + self.slice_ms / 1000, None)
        if self._borrow_slot(0.0):
            return self._sliced(here, first, step, borrowed=True)
        report = self._slotless(here, first)
        if here.next is None:
            return report
        if self._borrow_slot(min(here.ends - self._clock(), self._claim_held_s)):
            return self._sliced(here, lambda: report, step, borrowed=True)
        self._publish_kept(here)
        return report

    def _slotless(self, here: _Slice, first: Callable[[], Report]) -> Report:
        """`first` in slice `here` that holds no slot (yet): the one step it leaves to
        continue is kept in `here.next`, its call claimed with the save."""
        self._local.slice = here
        try:
            return first()
        except BaseException:
            self._publish_kept(here)  # (a step kept, then the save's caller raised)
            raise
        finally:
            self._local.slice = None

    def _borrow_slot(self, wait_s: float) -> bool:
        """Take a slot for a call thread: one free now, or given back within `wait_s`.
        A task waiting for a slot comes first: a call thread never takes one from it."""
        with self._count:
            if not self._slot_for_call_thread() and wait_s > 0:
                self._spare.wait_for(self._slot_for_call_thread, wait_s)
            if not self._slot_for_call_thread():
                return False
            self._running += 1
            self._borrowed += 1
            return True

    def _slot_for_call_thread(self) -> bool:
        """Whether a slot is free that no task waits for."""
        return self._running + self._waiting < self.slots

    def _take_slot(self) -> None:
        """Take a slot for a task: at once, unless a call thread borrowed it; then wait
        for it, at most a slice (past that the task runs beside the borrowed step).

        Only a borrowed slot is waited for: a pool whose tasks outnumber `slots` (one
        that runs greenlets, counted as one slot) never waits for its own tasks."""
        with self._count:
            if not self._borrowed_slot_back():
                self._waiting += 1
                try:
                    self._count.wait_for(self._borrowed_slot_back, self.slice_ms / 1000)
                finally:
                    self._waiting -= 1
            self._running += 1

    def _borrowed_slot_back(self) -> bool:
        """Whether a task may take a slot now: none is borrowed, or one is free."""
        return not self._borrowed or self._running < self.slots

    def _sliced(
        self, here: _Slice, first: Callable[[], Report], step: Step, *, borrowed: bool = False
    ) -> Report:
        """`first`, then each step kept for this slice; the slot `here` took (`borrowed`
        by a call thread) is given back."""
        self._local.slice = here
        try:
            report = first()
            while here.next is not None:
                message, here.next, here.release = here.next, None, None
                report = report.continued(label(message), self._continued(message, step))
            return report
        finally:
            self._local.slice = None
            with self._count:
                self._running -= 1
                self._borrowed -= borrowed
                # (all: once no slot is borrowed, every task waiting may go, not just one)
                self._count.notify_all()
                self._spare.notify()
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
