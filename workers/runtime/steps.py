"""Advancing a run: load it, decide its next step (the engine), save, send.

`Steps.advance` is what `relay.advance` does:

    1. load     the run's record, snapshot (unless this process holds its agent) and
                unapplied inbox, in one script (LOAD)
    2. decide   restore the agent, apply the inbox through `workers.engine.decide`, and
                work out what the save changes of the stored snapshot; a run that cannot
                go on (unreadable, or its step raised) ends here (`workers.engine.endings`)
    3. save     one compare-and-set on the run's version with everything the step
                decided (SAVE); a worker that lost the race loads and decides again, so
                an event is applied exactly once, by the save that deletes it
    4. send     the messages the step decided, once the save has landed (or keep the
                one this thread runs next in place, its call claimed by the save:
                SAVE_CLAIM; `workers.runtime.placement`, `workers.runtime.claims`)

`decide` and `save` are shared with the calls (`workers.runtime.calls`), which
save their own outcome with the run the same way. A finished run's inbox is
dropped unread, unless it holds a person's follow-up: a new turn reopens it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from functools import partial

from agent_core import Agent, AgentError
from scheduler import Notification
from workers.engine import endings
from workers.engine.decide import decide
from workers.engine.effects import Advanced, Message, OwnOutcome
from workers.engine.events import FollowUp, InboxEvent
from workers.engine.ids import OutboxMember
from workers.engine.records import RunRecord
from workers.engine.working import Surroundings
from workers.kit.agents import AgentKit
from workers.runtime.claims import Claims
from workers.runtime.placement import Placement
from workers.runtime.reports import Report, after_step
from workers.settings import Timing
from workers.store import snapshots
from workers.store.codec import Loaded
from workers.store.runs import RunStore
from workers.store.scripts import Saved

__all__ = ["SAVE_TRIES", "Steps"]

log = logging.getLogger(__name__)

SAVE_TRIES = 20
"""Lost compare-and-set races before a worker leaves the run to the tick."""


class Steps:
    """Advances runs: one event in (or many), the next step saved, its messages sent."""

    def __init__(
        self,
        store: RunStore,
        kit: AgentKit,
        timing: Timing,
        send: Callable[[list[Message]], None],
        clock: Callable[[], int],
        *,
        app: str | None = None,
    ) -> None:
        self.store = store
        self.kit = kit
        self.timing = timing
        self.send = send
        self.clock = clock
        self.app = app
        """The name of this worker's Relay app: it runs no other app's runs."""
        self.placement: Placement | None = None
        """Where the step a save decides runs: kept for this thread, its call claimed with
        the save (`claims`), or published (None: every message is sent)."""
        self.claims: Claims | None = None

    def foreign(self, record: RunRecord | None) -> Report | None:
        """Why this worker must not touch the run of `record`, if another app started it.

        Two apps under one RELAY_PREFIX share queues: a worker of one would run the
        other's runs with the wrong tools. It runs nothing and leaves the message to the
        outbox, so the right app's workers get it when the tick sends it again."""
        if record is None or record.app in (None, self.app) or self.app is None:
            return None
        line = (
            f"run {record.id} is the app {record.app!r}'s, not this worker's ({self.app!r}):"
            " two apps share RELAY_PREFIX, give each its own; nothing was run"
        )
        log.error("%s", line)
        return Report(line, failed=True)

    def around(self) -> Surroundings:
        t = self.timing
        return Surroundings(
            now_ms=self.clock(),
            grace_ms=t.grace_ms,
            approval_ttl_ms=t.approval_ttl_ms,
            retention_s=t.retention_s,
            verifier=self.kit.verifier,
        )

    def advance(self, run_id: str, loaded: Loaded | None = None) -> Report:
        """Apply the run's new inbox events and act on its next step; retries lost races.

        Returns what the step did and where the run is now, in one line.
        """
        for _ in range(SAVE_TRIES):
            if loaded is None:
                loaded = self.store.load(run_id)
            if loaded is None:
                self.store.forget_message(OutboxMember.advance(run_id))
                return Report(f"no run {run_id} (it expired, or never existed)")
            refused = self.foreign(loaded.record)
            if refused is not None:
                return refused
            advanced = self.decide(run_id, loaded)
            if self.save(advanced, loaded.version) is not Saved.STALE:
                return after_step(loaded.record, advanced)
            loaded = None
        log.warning(
            "run %s: gave up saving after %d lost races; the tick will retry", run_id, SAVE_TRIES
        )
        return Report(f"gave up after {SAVE_TRIES} lost races to save; the tick will retry")

    def save(self, advanced: Advanced, version: str, own: OwnOutcome | None = None) -> Saved:
        """Save a step; once it has landed, send what it decided.

        A call this thread will run next in place (`placement`) is claimed in the save's
        round trip (`claims`), and kept for the thread rather than sent."""
        placement, claims = self.placement, self.claims
        message = None if placement is None else placement.ahead(advanced.messages)
        terms = None if message is None or claims is None else claims.ahead(message)
        claim = None
        if terms is None:
            saved = self.store.save(advanced, version, own)
        else:
            saved, claim = self.store.save_then_claim(advanced, version, own, terms)
        if saved is Saved.SAVED:
            if placement and claims and message and terms and claim:
                claims.hand(terms, claim)
                placement.keep(message, partial(claims.release, terms))
            else:
                self.send(list(advanced.messages))
            _notify_schedule(self.store, advanced)
        return saved

    def decide(
        self,
        run_id: str,
        loaded: Loaded,
        agent: Agent | None = None,
        own: InboxEvent | None = None,
    ) -> Advanced:
        """Return what to save for the run: the next step, or its end if it cannot go on.

        `agent` is the run's agent when the caller restored it already (advancing
        changes it); `own` the outcome of the calling task, applied after the inbox.
        """
        record = loaded.record
        around = self.around()
        if record is None:
            held = self.store.people.pending_members_of(run_id)
            return endings.unreadable_record(run_id, loaded.snapshot, loaded.problem, around, held)
        if record.state == "finished" and not _reopens(loaded):
            return endings.finished_already(record, loaded.snapshot, loaded.inbox, around)
        if agent is None:
            try:
                agent = loaded.agent(self.kit.restore)
            except AgentError as error:
                return endings.unreadable_snapshot(record, loaded.snapshot, str(error), around)
        stored = agent.history() if loaded.apart else None
        loops = agent.loops() if loaded.loops_stored else None  # (None: write them)
        try:
            advanced = decide(record, agent, loaded.inbox, around, own, whole=False)
        except Exception as error:  # a host bug (a tool's validate, a verifier) ends the run
            log.exception("run %s: advancing failed; the run is stopped", run_id)
            problem = f"advancing it raised {type(error).__name__}: {error}"
            return endings.failed_run(record, loaded.snapshot, problem, around)
        written = snapshots.write(stored, agent, loops)
        return replace(advanced, stored=written, fixed_stored=loaded.fixed_stored)


def _notify_schedule(store: RunStore, advanced: Advanced) -> None:
    """A scheduled run with `on_wait` "notify" that now waits for a person: say so in its
    schedule's notifications, once per thing it waits on (sent after the save, so a worker
    that dies between the two loses that one notification, never the decision)."""
    record, added = advanced.record, advanced.effects.pending_add
    if record.on_wait != "notify" or record.schedule is None or not added:
        return
    waits = "; ".join(f"{p.kind}: {p.summary}" for p in added)
    notice = Notification(
        schedule=record.schedule,
        task=record.task,
        slot_ms=record.fired_ms or record.created_ms,
        at_ms=record.updated_ms,
        run_id=record.id,
        waits=waits[:2_000],
    )
    try:
        store.schedules.notify(notice)
    except Exception:  # noqa: BLE001 - the step is saved; a lost notification is only logged
        log.warning("run %s: could not notify schedule %r", record.id, record.schedule)


def _reopens(loaded: Loaded) -> bool:
    """Whether a finished run's inbox holds a follow-up: a new turn reopens it."""
    return any(isinstance(event, FollowUp) for _, event in loaded.inbox)
