"""A task that returns `NoFinalEvent` is acked and counted, but its worker sends no
`task-succeeded` for it (`workers.celery_app.flower`); every other result and
event goes out as Celery sends it."""

from __future__ import annotations

from typing import Any

from celery.utils.saferepr import saferepr

from workers.celery_app.flower import NoFinalEvent, QuietRequest


class _Eventer:
    enabled = True

    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []

    def send(self, type: str, **fields: Any) -> None:  # noqa: A002 - Celery's name
        self.sent.append((type, fields))


class _Task:
    send_events = True


def _request() -> tuple[QuietRequest, _Eventer]:
    request = QuietRequest.__new__(QuietRequest)  # (no message: only send_event is used)
    eventer = _Eventer()
    request._eventer = eventer  # type: ignore[attr-defined]  # (Celery's private slots)
    request._task = _Task()  # type: ignore[attr-defined]
    request.id = "t1"
    return request, eventer


def _sent(result: object) -> list[str]:
    request, eventer = _request()
    # What the worker's request gets: the result's repr, as Celery's tracer makes it.
    request.send_event("task-succeeded", result=saferepr(result), runtime=0.1)
    return [kind for kind, _ in eventer.sent]


def test_a_task_that_ends_elsewhere_sends_no_succeeded_event() -> None:
    assert _sent(NoFinalEvent("m1: held on the event loop (1 in flight)")) == []


def test_a_line_that_looks_like_the_mark_is_still_sent() -> None:
    # A task's lines are strings: their repr opens with a quote, whatever they say.
    assert _sent("<no final event here: m1>") == ["task-succeeded"]
    assert _sent("m1 replied, 8 tokens") == ["task-succeeded"]


def test_its_other_events_go_out() -> None:
    request, eventer = _request()
    request.send_event("task-started")
    request.send_event("task-failed", exception="StepFailed('x')")
    assert [kind for kind, _ in eventer.sent] == ["task-started", "task-failed"]


def test_its_log_line_says_why() -> None:
    assert repr(NoFinalEvent("m1: carried")) == "<no final event here: m1: carried>"
