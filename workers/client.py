"""The client API to runs that exist: where they are, what waits on a person, the
decisions that wake them, their traces, and cancelling them.

Every method talks to Redis directly and wakes a run with a small `relay.advance`
message; none waits on a worker.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from agent_core import Outcome
from workers.decisions import expiry_event
from workers.effects import Message
from workers.errors import DecisionRefused, RelayError, RunCorrupt, RunNotFound, WaitTimeout
from workers.layout import PendingKind, pending_parts
from workers.pricing import Budget
from workers.records import (
    Answer,
    CallDecision,
    CancelRun,
    InboxEvent,
    Pending,
    PlanDecision,
    RunRecord,
    RunStatus,
    TraceEntry,
    Usage,
)
from workers.scripts import Decided
from workers.settings import Timing, now_ms
from workers.store import RunStore

__all__ = ["RunsClient"]


class RunsClient:
    """Reading runs, deciding for them, cancelling them (the Relay's client API)."""

    def __init__(
        self, store: RunStore, send: Callable[[list[Message]], None], timing: Timing
    ) -> None:
        self.store = store
        self._send = send
        self._timing = timing

    def _record(self, run_id: str) -> tuple[RunRecord, Usage]:
        found = self.store.read(run_id)
        if found is None:
            raise RunNotFound(f"no run {run_id!r} (it never existed, or it finished and expired)")
        return found

    def status(self, run_id: str) -> RunStatus:
        """Return where the run is: its state, what it waits for, usage, outcome, children."""
        record, total = self._record(run_id)
        return RunStatus(
            id=record.id,
            state=record.state,
            waiting_for=record.waiting_for,
            task=record.task,
            parent=record.parent,
            root=record.root,
            children=record.children,
            recipe=record.recipe,
            schedule=record.schedule,
            usage=record.usage,
            total_usage=total,
            budget=self._budget(record),
            key=record.key,
            usage_by_route=record.usage_by_route,
            created_ms=record.created_ms,
            updated_ms=record.updated_ms,
            finished_ms=record.finished_ms,
            outcome=record.outcome,
            pending=tuple(self.store.people.pending_of(record.pending)),
        )

    def _budget(self, record: RunRecord) -> Budget | None:
        """The tree's budget as it stands now (extensions included)."""
        limits = self.store.limits(record.root)
        if limits is None:
            return None
        started = record.created_ms
        if record.root != record.id and limits.deadline_ms is not None:
            root = self.store.read(record.root)
            started = root[0].created_ms if root is not None else started
        return Budget(
            tokens=limits.tokens,
            usd=None if limits.cost_micro is None else limits.cost_micro / 1_000_000,
            model_calls=limits.model_calls,
            seconds=None
            if limits.deadline_ms is None
            else max(limits.deadline_ms - started, 1) / 1000,
        )

    def extend(self, run_id: str, more: Budget) -> int:
        """Raise the tree's limits by `more` and let its runs parked at the budget go on;
        return how many runs were woken. A limit the tree never had stays unlimited.

        Raises:
            RelayError: `more` raises nothing the tree has a limit for.
            RunNotFound: there is no such run.
        """
        if not isinstance(more, Budget) or more.empty:
            raise RelayError("extend needs a Budget that raises at least one limit")
        record, _ = self._record(run_id)
        parked = self.store.people.pending_in_tree(record.root, "budget")
        seconds = None if more.seconds is None else int(more.seconds * 1000)
        raise_by = (more.tokens, more.usd_micro, more.model_calls, seconds)
        due = now_ms() + self._timing.grace_ms
        raised, woken = self.store.people.extend(record.root, raise_by, parked, due)
        if not raised:
            raise RelayError(
                f"the budget of run {record.root} has no limit that {more.describe()} raises"
            )
        self._send([Message("advance", p.run_id) for p in parked])
        return woken

    def wait(self, run_id: str, timeout: float = 60.0) -> Outcome:
        """Return the run's outcome once it finishes.

        Raises:
            WaitTimeout: it did not finish within `timeout` seconds.
            RunNotFound: there is no such run.
        """
        deadline = time.monotonic() + timeout
        cursor = self.store.activity_cursor()
        while True:
            record, _ = self._record(run_id)
            if record.outcome is not None:
                return record.outcome
            left = deadline - time.monotonic()
            if left <= 0:
                raise WaitTimeout(
                    f"run {run_id} did not finish within {timeout:g} s (it is {record.state})"
                )
            # Wake when this run's trace grows (the save that ends a run writes a line),
            # and look at the record at least every second whatever else is busy.
            until = time.monotonic() + min(left, 1.0)
            while (now := time.monotonic()) < until:
                cursor, grew = self.store.wait_activity(cursor, max(1, int((until - now) * 1000)))
                if run_id in grew:
                    break

    def pending(self) -> list[Pending]:
        """Return what waits on a person: plans, calls and questions, oldest first."""
        return self.store.people.pending()

    def approve(
        self, run_id: str, call_id: str, yes: bool = True, reason: str = "", *, by: str = ""
    ) -> None:
        """Decide a call that waits for approval. Refused unless that call is pending.

        `by` names who decided; the run's trace says so.

        Raises:
            DecisionRefused: the call is not waiting for a decision, was decided
                already, or its time ran out (then it is declined, as the tick would).
            RunNotFound: there is no such run.
        """
        _check_yes(yes)
        if not isinstance(call_id, str):
            raise DecisionRefused(f"a call id is text, got {call_id!r}")
        event = CallDecision(call=call_id, yes=yes, reason=str(reason)[:2_000], by=str(by)[:200])
        self._decide(run_id, "call", call_id, event, f"call {call_id}")

    def deny(self, run_id: str, call_id: str, reason: str = "") -> None:
        """Decline a call that waits for approval (the model is told)."""
        self.approve(run_id, call_id, yes=False, reason=reason)

    def approve_plan(self, run_id: str, yes: bool = True, *, by: str = "") -> None:
        """Decide the plan a run waits on (refused like `approve`)."""
        _check_yes(yes)
        seq = self._pending_seq(run_id, "plan")
        event = PlanDecision(seq=seq, yes=yes, by=str(by)[:200])
        self._decide(run_id, "plan", str(seq), event, "a plan")

    def answer(self, run_id: str, text: str) -> None:
        """Answer the question a run waits on (refused like `approve`)."""
        if not isinstance(text, str):
            raise DecisionRefused("an answer must be text")
        seq = self._pending_seq(run_id, "question")
        event = Answer(seq=seq, text=text[:20_000])
        self._decide(run_id, "question", str(seq), event, "a question")

    def _pending_seq(self, run_id: str, kind: str) -> int:
        record, _ = self._record(run_id)
        for member in record.pending:
            _, pending_kind, what = pending_parts(member)
            if pending_kind == kind:
                return int(what)
        state = (
            "finished"
            if record.state == "finished"
            else f"{record.state}, waiting for {record.waiting_for}"
        )
        raise DecisionRefused(f"run {run_id} is not waiting for {kind} ({state})")

    def _decide(
        self, run_id: str, kind: PendingKind, what: str, event: InboxEvent, named: str
    ) -> None:
        now = now_ms()
        decided = self.store.people.decide(
            run_id,
            kind,
            what,
            event,
            expired=expiry_event(kind, what),
            now_ms=now,
            due_ms=now + self._timing.grace_ms,
        )
        if decided in (Decided.APPLIED, Decided.EXPIRED):
            self._send([Message("advance", run_id)])
        if decided is Decided.APPLIED:
            return
        if decided is Decided.GONE:
            self._record(run_id)  # RunNotFound (or RunCorrupt)
        if decided is Decided.EXPIRED:
            outcome = "declined" if kind != "question" else "left unanswered"
            raise DecisionRefused(
                f"{named} of run {run_id} waited too long: its time ran out before this"
                f" decision, so it was {outcome}"
            )
        if decided is Decided.DECIDED:
            raise DecisionRefused(f"{named} of run {run_id} was decided already")
        raise DecisionRefused(f"{named} of run {run_id} is not waiting for a decision")

    def cancel(self, run_id: str, reason: str = "") -> bool:
        """Stop a run (parked or running) and its children; False if it had finished already.

        A run whose record cannot be read is woken too, so it fails and frees what it held.
        """
        try:
            record, _ = self._record(run_id)
        except RunCorrupt:
            record = None
        if record is not None and record.state == "finished":
            return False
        event = CancelRun(reason=reason[:2_000] or "Cancelled by a person.")
        due = now_ms() + self._timing.grace_ms
        if not self.store.append(run_id, event, due, cancel_flag=True):
            raise RunNotFound(f"no run {run_id!r}")
        self._send([Message("advance", run_id)])
        return True

    def trace(self, run_id: str) -> list[TraceEntry]:
        """Return the run's trace so far (its own events; children have their own)."""
        self._record(run_id)
        return self.store.trace(run_id)[1]

    def watch(self, run_id: str, *, timeout: float | None = None) -> Iterator[TraceEntry]:
        """Yield the trace of a run and its descendants as it happens, until the run finishes.

        A run that finished already yields its whole trace, its specialists' included.
        """
        self._record(run_id)
        deadline = None if timeout is None else time.monotonic() + timeout
        cursor = self.store.activity_cursor()
        positions = {run_id: 0}
        due = {run_id}
        finished = False
        look_again = time.monotonic() + 2.0
        while True:
            while due:  # read every run that grew, and each child as soon as it is named
                run = due.pop()
                positions[run], entries = self.store.trace(run, positions[run])
                for entry in entries:
                    child = entry.data.get("child") if entry.kind == "child" else None
                    if isinstance(child, str) and child not in positions:
                        positions[child] = 0
                        due.add(child)
                    finished = finished or (run == run_id and entry.kind == "finished")
                    yield entry
            if finished or (deadline is not None and time.monotonic() > deadline):
                return
            cursor, grew = self.store.wait_activity(cursor, 500)
            due = grew & positions.keys()
            if time.monotonic() >= look_again:
                # Whatever else is busy (a busy activity stream can drop entries),
                # read every run followed now and then.
                look_again = time.monotonic() + 2.0
                finished = self._record(run_id)[0].state == "finished"
                due = set(positions)

    def runs(self, limit: int = 100) -> list[RunStatus]:
        """Return the newest runs first (those not yet expired)."""
        found = []
        for run_id in self.store.runs(limit):
            try:
                found.append(self.status(run_id))
            except RunNotFound:
                continue
        return found


def _check_yes(yes: object) -> None:
    # bool("no") is True: a decision must be a real bool, never a guess.
    if not isinstance(yes, bool):
        raise DecisionRefused(f"a decision is True or False, got {yes!r}")
