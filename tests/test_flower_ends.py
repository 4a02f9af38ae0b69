"""How a task whose model call was carried past it is ended (`celery_app.flower`),
in either order of its two halves, with a recording dispatcher in place of the broker.
What Flower then shows, on real workers, is tested in tests/test_flower_truth.py."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import pytest

from workers.celery_app import flower
from workers.celery_app.flower import CarriedEnds
from workers.runtime.carrier import carried_by
from workers.runtime.reports import Report


class _Events:
    """Records what a dispatcher sends, and for which worker."""

    def __init__(self) -> None:
        self.sent: list[tuple[str | None, str, dict[str, Any]]] = []

    @contextmanager
    def default_dispatcher(self, hostname: str | None = None) -> Iterator[Any]:
        def send(kind: str, **fields: Any) -> None:
            self.sent.append((hostname, kind, fields))

        yield SimpleNamespace(send=send)


def _ends(*, events: bool = True) -> tuple[CarriedEnds, _Events]:
    recorder = _Events()
    app = SimpleNamespace(conf=SimpleNamespace(worker_send_task_events=events), events=recorder)
    return CarriedEnds(app), recorder  # type: ignore[arg-type]


HANDED = Report("m1: held on the event loop (1 in flight)", carried=True)
REPLIED = Report("model call m1 replied, 8 tokens; run waits for call-1")


@pytest.mark.parametrize("task_first", [True, False], ids=["task-first", "call-first"])
def test_the_task_ends_once_both_halves_are_in_whichever_comes_first(*, task_first: bool) -> None:
    ends, events = _ends()
    began = time.monotonic() - 5  # (the task began 5 s ago)
    if task_first:
        ends.task_ended("task-1", "w1@host", HANDED, started=began)
    with carried_by("task-1", "w1@host"):
        ends.call_ended(REPLIED)
    if not task_first:
        assert events.sent == []  # nothing before the task has said its own line
        ends.task_ended("task-1", "w1@host", HANDED, started=began)
    [(worker, kind, fields)] = events.sent
    assert (worker, kind, fields["uuid"]) == ("w1@host", "task-succeeded", "task-1")
    assert fields["result"] == (
        "'m1: held on the event loop (1 in flight); then model call m1 replied, 8 tokens;"
        " run waits for call-1'"
    )
    assert 5 <= fields["runtime"] < 60  # from the task's start
    assert ends.waiting() == 0


def test_a_failed_call_ends_its_task_as_failed() -> None:
    ends, events = _ends()
    ends.task_ended("task-2", "w1@host", HANDED, started=0.0)
    with carried_by("task-2", "w1@host"):
        ends.call_ended(Report("model call m1 failed: 400; run failed", failed=True))
    [(_, kind, fields)] = events.sent
    assert kind == "task-failed"
    assert fields["exception"].startswith("StepFailed('m1: held on the event loop")
    assert "then model call m1 failed: 400" in fields["exception"]


def test_without_task_events_nothing_is_kept_or_sent() -> None:
    ends, events = _ends(events=False)
    assert ends.ended(SimpleNamespace(request=None), 0.0)(HANDED) is False  # type: ignore[arg-type]
    with carried_by("task-3", "w1@host"):
        ends.call_ended(REPLIED)
    assert (events.sent, ends.waiting()) == ([], 0)


def test_halves_that_never_meet_are_not_kept_for_ever(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(flower, "KEPT_MOST", 3)
    ends, _ = _ends()
    for n in range(5):  # calls whose tasks raised, so never said how they ended
        with carried_by(f"lost-{n}", "w1@host"):
            ends.call_ended(REPLIED)
    assert ends.waiting() == 3


CHAINED = Report(
    "model call m1 replied; run waits for call-1 | continued call-1 read_note: ok"
    " | continued model call m3: m3: held on the event loop (1 in flight)",
    carried=True,
)
LAST = Report("model call m3 replied, 9 tokens; run finished (done): read it")


@pytest.mark.parametrize("task_first", [True, False], ids=["task-first", "call-first"])
def test_a_call_that_went_on_to_carry_the_next_one_ends_its_task_with_that_one(
    *, task_first: bool
) -> None:
    """The carried call's thread went on with the run in a free slot and handed the next
    model call over in turn: the task is under way until that call ends too."""
    ends, events = _ends()
    if task_first:
        ends.task_ended("task-5", "w1@host", HANDED, started=time.monotonic())
    with carried_by("task-5", "w1@host"):
        ends.call_ended(CHAINED)
    if not task_first:
        ends.task_ended("task-5", "w1@host", HANDED, started=time.monotonic())
    assert events.sent == []  # m3 is still in flight: the task is not over
    with carried_by("task-5", "w1@host"):
        ends.call_ended(LAST)
    [(_, kind, fields)] = events.sent
    assert (kind, fields["uuid"]) == ("task-succeeded", "task-5")
    assert fields["result"].startswith(f"'{HANDED.line}; then model")
    assert (
        "| continued call-1 read_note: ok | continued model call m3: m3: held" in (fields["result"])
    )
    assert fields["result"].endswith(
        "; then model call m3 replied, 9 tokens; run finished (done): read it'"
    )
    assert ends.waiting() == 0


def test_both_calls_may_end_before_their_task_says_its_line() -> None:
    ends, events = _ends()
    with carried_by("task-6", "w1@host"):
        ends.call_ended(CHAINED)
        ends.call_ended(Report("model call m3 failed: 400; run failed", failed=True))
    assert events.sent == []
    ends.task_ended("task-6", "w1@host", HANDED, started=time.monotonic())
    [(_, kind, fields)] = events.sent
    assert kind == "task-failed"
    assert "continued model call m3" in fields["exception"]
    assert "then model call m3 failed: 400" in fields["exception"]
    assert ends.waiting() == 0


def test_a_task_line_that_grows_call_after_call_is_cut_at_its_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(flower, "LINE_CHARS", 200)
    ends, events = _ends()
    ends.task_ended("task-7", "w1@host", HANDED, started=time.monotonic())
    with carried_by("task-7", "w1@host"):
        for _ in range(50):
            ends.call_ended(CHAINED)
        assert ends.waiting() == 1
        ends.call_ended(LAST)
    [(_, _, fields)] = events.sent
    result = fields["result"]
    assert result.endswith("run finished (done): read it'")
    assert len(result) < 200 + len(LAST.line) + 20
