"""Steps for runs that cannot go on as usual: finished already, unreadable, or failed.

Like `workers.engine.decide`, these return what to save (`Advanced`) and do no I/O;
none advances the agent, so each leaves the stored snapshot as it is (`KEEP`). A
run whose record or snapshot cannot be read, or whose step raised, fails alone:
its parent is told, its children are stopped, and what it held is let go.
"""

from __future__ import annotations

from dataclasses import replace

from agent_core import Config, Outcome, Stop
from workers.engine.decide import finish, forget_model_call, sync_pending
from workers.engine.effects import KEEP, Advanced
from workers.engine.events import InboxEvent, ModelReplied
from workers.engine.ids import model_call, parent_of, root_of
from workers.engine.records import RunRecord
from workers.engine.working import Surroundings, Working

__all__ = ["failed_run", "finished_already", "unreadable_record", "unreadable_snapshot"]


def finished_already(
    record: RunRecord,
    snapshot: str,
    inbox: list[tuple[str, InboxEvent | None]],
    around: Surroundings,
) -> Advanced:
    """A finished run woken again: drop what reached its inbox since.

    A model call under way when the run finished (a cancel does not cut it off)
    still brings its reply: the provider billed it, so its usage is counted on
    the run and every ancestor; the rest of the reply is dropped.
    """
    run = Working(record, None, around)
    for _, event in inbox:
        if isinstance(event, ModelReplied):
            forget_model_call(run, event.seq)
            run.add_usage(event.usage, event.route, model_call(event.seq))
    run.applied = [entry_id for entry_id, _ in inbox]
    run.retention_s = around.retention_s
    return replace(run.decided(snapshot), stored=KEEP)


def _stopped(
    record: RunRecord,
    snapshot: str,
    outcome: Outcome,
    around: Surroundings,
    held_pending: tuple[str, ...] = (),
) -> Advanced:
    """Finish a run without its agent, telling its parent and children."""
    run = Working(record, None, around)
    run.pending = tuple(sorted({*run.pending, *held_pending}))
    finish(run, outcome, [])
    sync_pending(run, [])
    return replace(run.decided(snapshot), stored=KEEP)


def unreadable_snapshot(
    record: RunRecord, snapshot: str, problem: str, around: Surroundings
) -> Advanced:
    """Fail a run whose saved agent cannot be read; the other runs carry on."""
    return failed_run(
        record, snapshot, f"its saved agent state could not be read: {problem}", around
    )


def failed_run(record: RunRecord, snapshot: str, problem: str, around: Surroundings) -> Advanced:
    """Fail a run that cannot go on (its parent is told, its children stopped)."""
    outcome = Outcome(stop=Stop.FAILED, summary=f"The run failed: {problem}")
    return _stopped(record, snapshot, outcome, around)


def unreadable_record(
    run_id: str,
    snapshot: str,
    problem: str,
    around: Surroundings,
    held_pending: tuple[str, ...],
) -> Advanced:
    """Fail a run whose record cannot be read, telling its parent (named by its id) and
    letting go of the pending entries it held (`held_pending`, found by their names)."""
    parent, parent_call = parent_of(run_id) or (None, None)
    record = RunRecord(
        id=run_id,
        parent=parent,
        parent_call=parent_call,
        root=root_of(run_id),
        task="(unreadable)",
        created_ms=around.now_ms,
        updated_ms=around.now_ms,
        config=Config(),
    )
    outcome = Outcome(stop=Stop.FAILED, summary=f"The run's record could not be read: {problem}")
    return _stopped(record, snapshot, outcome, around, held_pending)
