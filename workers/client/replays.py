"""Going back into a run: replay it offline, fork it at a step, compare two runs.

Each reads the run's journal (`workers.engine.journal`) and plays it through the
engine in this process (`workers.engine.replay`): no model, no tool, no worker.
`replay` writes nothing. `fork` writes one new run, started from the state the
prefix reached, which then goes on live on the fleet (its own approvals and
budget; with `stub_tools`, a tool call identical to one the original made gets
that call's recorded outcome instead of running). `diff` puts two runs' steps
side by side (`workers.client.diffs` labels them and says what differs).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from pydantic import BaseModel

from agent_core import Agent, Config, Done, ToolOutput
from agent_core.errors import AgentError
from agent_core.steps import FROZEN
from workers.client.diffs import Diff, DiffRow, RunSide, Steps, diff_of
from workers.engine.journal import (
    JournalEntry,
    JournalError,
    JournalStart,
    StepSeen,
    call_digest,
    is_start,
    read_entry,
    read_start,
    start_text,
)
from workers.engine.records import ForkedFrom, RunList, RunRecord, TraceEntry
from workers.engine.replay import Replayed, replay
from workers.engine.working import Surroundings
from workers.errors import RelayError
from workers.kit.agents import AgentKit
from workers.model.endpoints import checked_routes
from workers.settings import now_ms
from workers.store.runs import RunStore

__all__ = [
    "Diff",
    "DiffRow",
    "Divergence",
    "MadeCall",
    "ReplayReport",
    "Replays",
    "RunSide",
]


class Divergence(BaseModel):
    """The first step a replay took otherwise than the run did."""

    model_config = FROZEN
    step: int
    """The journal step, from 1 (0: the start itself could not be restored)."""
    recorded: str
    """The step the run took: its kind (and tools), e.g. `run write_note`."""
    now: str
    """The step this code takes instead ("" if it raised)."""
    why: str


RISKS_NOT_KEPT = (
    "its tools' risks were not kept when it started (before this release): a tool whose"
    " risk or idempotency changed since cannot be seen; check them by hand"
)


class ReplayReport(BaseModel):
    """What `Relay.replay` found: every step the same (`identical`), the first
    divergence, or why the run cannot be replayed (`problem`)."""

    model_config = FROZEN
    run_id: str
    steps: int = 0
    """Steps in the run's journal."""
    replayed: int = 0
    """Steps replayed the same."""
    identical: bool = False
    divergence: Divergence | None = None
    problem: str | None = None
    state: str = ""
    """Where the run is now (running, waiting, finished)."""
    unchecked: str | None = None
    """What this replay could not check, though its steps matched: a run started
    before its tools' risks were kept at its start cannot show a tool whose risk or
    idempotency changed since."""


class MadeCall(NamedTuple):
    """A tool call a run made: its tool, the arguments it ran with, its outcome."""

    tool: str
    args: dict[str, Any]
    output: ToolOutput | None


class _Unplayable(Exception):
    """The run cannot be replayed; the message says why, in one line."""


Sender = Callable[[str], None]
"""Sends a new run's first `relay.advance`."""


class Replays:
    """Replay, fork and diff over one app's store and tools."""

    def __init__(
        self,
        store: RunStore,
        kit: AgentKit,
        *,
        app: str,
        routes: Sequence[str],
        grace_ms: int,
        start: Sender,
    ) -> None:
        self.store = store
        self.kit = kit
        self.app = app
        self.routes = tuple(routes)
        self.grace_ms = grace_ms
        self._start = start

    # --- replay -----------------------------------------------------------------------

    def replay(self, run_id: str) -> ReplayReport:
        """Play the run's journal through this code; say whether every step matched."""
        try:
            start, entries = self._journal(run_id)
        except _Unplayable as problem:
            return ReplayReport(run_id=run_id, problem=str(problem), state=self._state(run_id))
        played = self._play(start, entries)
        report = ReplayReport(
            run_id=run_id,
            steps=len(entries),
            replayed=played.steps if played.divergence is None else played.divergence.step - 1,
            identical=played.divergence is None,
            state=self._state(run_id),
        )
        if played.divergence is not None:
            d = played.divergence
            found = Divergence(step=d.step, recorded=_said(d.recorded), now=_said(d.now), why=d.why)
            return report.model_copy(update={"divergence": found})
        reclassed = self._reclassed(start, entries)
        if reclassed is not None:
            return report.model_copy(update={"identical": False, "divergence": reclassed})
        if start.risks is None:
            return report.model_copy(update={"unchecked": RISKS_NOT_KEPT})
        return report

    def _reclassed(self, start: JournalStart, entries: Sequence[JournalEntry]) -> Divergence | None:
        """A tool whose risk or idempotency changed since the run started, as a divergence:
        its steps replay the same (the model is not shown either), but a call may no longer
        ask a person, or may run again after a lost worker. At the first step that calls
        a changed tool, else at the step the run goes on from."""
        changes: dict[str, list[str]] = {}
        for name, then in (start.risks or {}).items():
            spec = self.kit.spec(name)
            if spec is None:
                continue  # (a tool gone: the steps say so, the system prompt first)
            now = spec.tool.risk_class.name
            said = [f"risk {then} -> {now}"] if now != then else []
            was = None if start.idempotent is None else name in start.idempotent
            if was is not None and was != spec.idempotent:
                said.append(f"idempotent {_yes(was)} -> {_yes(spec.idempotent)}")
            if said:
                changes[name] = said
        if not changes:
            return None
        calling = [
            number
            for number, entry in enumerate(entries, start=1)
            if entry.step.kind == "run" and set(entry.step.tools) & set(changes)
        ]
        step = min(calling, default=len(entries))
        called = entries[step - 1].step.tools if step else ()
        named = sorted(changes, key=lambda name: (name not in called, name))  # its call's first
        why = "; ".join(f"tool {name}: {', '.join(changes[name])}" for name in named)
        where = _said(entries[step - 1].step) if step else ""
        return Divergence(step=step, recorded=where, now=where, why=why)

    def waiting(self) -> list[ReplayReport]:
        """Replay every run that is running or parked: the check before an upgrade."""
        reports = []
        lists: tuple[RunList, ...]
        for lists in (("waiting",), ("running",)):
            count = self.store.count_runs(lists)
            reports += [self.replay(run_id) for run_id in self.store.runs(count + 100, lists)]
        return reports

    def _state(self, run_id: str) -> str:
        found = self.store.read(run_id)
        return "" if found is None else found[0].state

    def _journal(self, run_id: str) -> tuple[JournalStart, list[JournalEntry]]:
        stored = self.store.journal(run_id)
        if not stored:
            if self.store.read(run_id) is None:
                raise _Unplayable(f"no run {run_id} (it expired, or never existed)")
            raise _Unplayable(
                f"run {run_id} was started before runs kept a journal: it cannot be replayed"
            )
        try:
            start = read_start(stored[0])
        except JournalError as error:
            if is_start(stored[0]):
                raise _Unplayable(f"run {run_id}: {error}") from None
            raise _Unplayable(
                f"run {run_id} took more steps than its journal keeps: its start was trimmed,"
                " so it cannot be replayed"
            ) from None
        try:
            entries = [read_entry(i, text) for i, text in enumerate(stored[1:], start=1)]
        except JournalError as error:
            raise _Unplayable(f"run {run_id}: journal {error}") from None
        return start, entries

    def _play(
        self, start: JournalStart, entries: Sequence[JournalEntry], *, upto: int | None = None
    ) -> Replayed:
        around = Surroundings(
            now_ms=start.record.created_ms,
            grace_ms=self.grace_ms,
            approval_ttl_ms=None,
            retention_s=0,
            verifier=self.kit.verifier,
        )
        chosen = entries if upto is None else entries[:upto]
        return replay(start, chosen, self.kit.restore, around)

    # --- fork ---------------------------------------------------------------------------

    def fork(
        self,
        run_id: str,
        at: int,
        *,
        route: str | Sequence[str] | None = None,
        config: Config | Mapping[str, Any] | None = None,
        stub_tools: bool = False,
        task: str | None = None,
    ) -> str:
        """Start a new run from the state `run_id` reached after its first `at` journal
        steps (reached by replay: nothing runs for them); return its id."""
        try:
            start, entries = self._journal(run_id)
        except _Unplayable as problem:
            raise RelayError(str(problem)) from None
        if isinstance(at, bool) or not isinstance(at, int) or not 0 <= at <= len(entries):
            raise RelayError(
                f"run {run_id} has {len(entries)} journal steps: fork at 0 to {len(entries)},"
                f" not {at!r}"
            )
        played, agent = self._forked_agent(run_id, start, entries, at, task)
        stubs = self._stubs(start, entries) if stub_tools else {}
        record = self._fork_record(
            played.record, ForkedFrom(run=run_id, step=at), route=route, config=config,
            task=task, stubs=stubs,
        )  # fmt: skip
        snapshot = agent.snapshot()
        due = record.created_ms + self.grace_ms
        offered = agent.offered()
        start_entry = start_text(record, snapshot, offered, self.kit.idempotent(offered))
        if not self.store.create(record, snapshot, due, stubs, start_entry):  # 64 random bits
            raise RelayError(f"a run with id {record.id} exists already")
        self._say_forked(record, stubbed=len(stubs) if stub_tools else None)
        self._start(record.id)
        return record.id

    def _forked_agent(
        self,
        run_id: str,
        start: JournalStart,
        entries: Sequence[JournalEntry],
        at: int,
        task: str | None,
    ) -> tuple[Replayed, Agent]:
        """The run replayed to step `at`, and its agent, ready to go on (a new turn begun
        with `task`, which only an ended run takes)."""
        played = self._play(start, entries, upto=at)
        if played.divergence is not None or played.agent is None:
            d = played.divergence
            assert d is not None
            raise RelayError(
                f"run {run_id} no longer replays to step {at} with this code (step {d.step}:"
                f" {d.why}); fork at step {max(d.step - 1, 0)} or earlier"
            )
        agent, ended = played.agent, isinstance(played.agent.resume(), Done)
        if task is None and ended:
            raise RelayError(
                f"at step {at} run {run_id} had ended: nothing is left to run; fork at an"
                " earlier step, or give a new request (task=, --task) to begin a new turn"
            )
        if task is not None:
            if not isinstance(task, str) or not task.strip():
                raise RelayError("task must be non-empty text")
            if not ended:
                raise RelayError(
                    f"a new request (task=, --task) begins a new turn after the run's end:"
                    f" at step {at} run {run_id} had not ended (fork at its last step,"
                    f" {len(entries)}, or leave the request out)"
                )
            agent.follow_up(task)
        return played, agent

    def _say_forked(self, record: RunRecord, *, stubbed: int | None) -> None:
        """The fork's first trace line: where it came from, and how it goes on."""
        origin = record.forked_from
        assert origin is not None
        told = [f"forked from run {origin.run} at step {origin.step}"]
        told += ["stubbed tools"] if stubbed is not None else []
        told += [f"routes {', '.join(record.routes)}"] if record.routes else []
        data = {"run": origin.run, "step": origin.step, "stubbed": stubbed or 0}
        line = TraceEntry(
            at_ms=record.created_ms, run=record.id, kind="forked", text="; ".join(told), data=data
        )
        self.store.add_trace(record.id, line)

    def _fork_record(
        self,
        played: RunRecord,
        origin: ForkedFrom,
        *,
        route: str | Sequence[str] | None,
        config: Config | Mapping[str, Any] | None,
        task: str | None,
        stubs: Mapping[str, str],
    ) -> RunRecord:
        """A fresh record for the fork: the replayed run's settings, its own id, no calls
        under way, nothing decided, nothing spent; where it came from."""
        new_id = secrets.token_hex(8)
        now = now_ms()
        return RunRecord(
            id=new_id,
            root=new_id,
            task=(task or played.task)[:2_000],
            recipe=played.recipe,
            created_ms=now,
            updated_ms=now,
            seq=played.seq,
            config=self._config(played.config, config),
            tools=played.tools,
            budget=played.budget,
            key=played.key,
            app=self.app,
            forked_from=origin,
            routes=checked_routes(route, self.routes),
            stubbed=tuple(sorted(stubs)),
        )

    def _config(self, was: Config, given: Config | Mapping[str, Any] | None) -> Config:
        if given is None:
            return was
        if isinstance(given, Config):
            return given
        if not isinstance(given, Mapping):
            raise RelayError("config is a Config, or a mapping of its fields to change")
        try:
            return Config(**{**was.model_dump(), **given})
        except AgentError as error:
            raise RelayError(str(error)) from None

    def _stubs(self, start: JournalStart, entries: Sequence[JournalEntry]) -> dict[str, str]:
        """The recorded outcome of every tool call the run (and its specialists) made,
        by the call's digest (tool and exact arguments): the first outcome of each. A call
        whose outcome is unknown has none to hand back: it gets an error saying so, and
        is not run (it may have taken effect once already)."""
        stubs: dict[str, str] = {}
        for tool, args, output in self._tree_calls(self._play(start, entries)):
            if output is None or output.status == "declined":
                continue  # (not made: the fork's call runs, its own person asked if need be)
            kept = output if output.status in ("ok", "error") else _not_known(output)
            stubs.setdefault(call_digest(tool, args), kept.model_dump_json())
        return stubs

    def calls(self, run_id: str) -> list[MadeCall]:
        """Every tool call the run and its specialists made, as its journal tells: the
        tool, the arguments it ran with, its outcome (None: it had none).

        Raises:
            RelayError: the run cannot be replayed (the message says why).
        """
        try:
            start, entries = self._journal(run_id)
        except _Unplayable as problem:
            raise RelayError(str(problem)) from None
        return self._tree_calls(self._play(start, entries))

    def _tree_calls(self, played: Replayed) -> list[MadeCall]:
        children = list(played.record.children)
        plays = [played]
        for child in children:
            try:
                child_start, child_entries = self._journal(child)
            except _Unplayable:
                continue  # (a specialist whose journal is gone)
            plays.append(self._play(child_start, child_entries))
            children += [c for c in plays[-1].record.children if c not in children]
        return [
            MadeCall(tool, args, one.outcomes.get(call_id))
            for one in plays
            for call_id, (tool, args) in one.ran.items()
        ]

    # --- diff ---------------------------------------------------------------------------

    def diff(self, a: str, b: str) -> Diff:
        """Two runs side by side, step by step, the first difference marked and said."""
        sides = []
        for run_id in (a, b):
            try:
                start, entries = self._journal(run_id)
            except _Unplayable as problem:
                raise RelayError(str(problem)) from None
            found = self.store.read(run_id)
            record = found[0] if found is not None else start.record
            total = found[1] if found is not None else record.usage
            taken = self._play(start, entries).taken  # (as far as it replays the same)
            sides.append(Steps(record, total, [e.step for e in entries], taken))
        return diff_of(sides[0], sides[1])


def _yes(value: bool) -> str:
    return "yes" if value else "no"


def _not_known(output: ToolOutput) -> ToolOutput:
    """What a stubbed call gets for an original call whose outcome is unknown."""
    return ToolOutput.error(
        f"with stubbed tools it was not run: the run it was forked from made this call,"
        f" and its outcome is unknown ({output.text})"
    )


def _said(step: StepSeen | None) -> str:
    if step is None:
        return ""
    return f"{step.kind} {', '.join(step.tools)}".strip()
