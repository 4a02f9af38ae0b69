"""What relay web shows, as data: specialists under their parents, durations, money, and
the form that raises a tree's budget."""

from __future__ import annotations

from typing import Any

import pytest

from workers import Budget
from workers.web.views import budget_limits, budget_raise, duration, money, nested


def _row(run_id: str, parent: str | None = None) -> dict[str, Any]:
    return {"id": run_id, "parent": parent}


def test_specialists_are_shown_under_their_parent_where_both_are_on_the_page() -> None:
    # Newest first, as the list reads them: children were started after their parents.
    rows = [_row("r2.c2", "r2"), _row("r2.c1", "r2"), _row("r2.c1.d1", "r2.c1"),
            _row("r3"), _row("r2"), _row("r1.c1", "r1")]  # fmt: skip
    shown = [(row["id"], row["depth"]) for row in nested(rows)]
    assert shown == [
        ("r3", 0),
        ("r2", 0),
        ("r2.c1", 1),
        ("r2.c1.d1", 2),
        ("r2.c2", 1),
        ("r1.c1", 0),  # its parent is on another page: shown as it is, not lost
    ]
    assert len(nested(rows)) == len(rows)


def test_durations_and_money_read_as_people_read_them() -> None:
    assert [duration(ms) for ms in (None, 0, 850, 12_340, 245_000, 7_380_000, 273_600_000)] == [
        "", "0 ms", "850 ms", "12.3 s", "4 min 5 s", "2 h 3 min", "3 d 4 h"
    ]  # fmt: skip
    assert [money(m) for m in (None, 0, 315, 12_500_000, 1_234_567)] == [
        "no price", "$0.00", "$0.000315", "$12.50", "$1.234567"
    ]  # fmt: skip


def test_a_budget_form_offers_the_limits_the_tree_has_and_reads_what_was_typed() -> None:
    limits = budget_limits(Budget(model_calls=40, usd=1.5, seconds=900))
    assert [(f["name"], f["label"], f["now"]) for f in limits] == [
        ("usd", "dollars", "$1.50"), ("calls", "model calls", "40"),
        ("minutes", "minutes", "15 min 0 s"),
    ]  # fmt: skip
    assert budget_limits(None) == []
    asked = {"tokens": "50,000", "usd": "$0.25", "calls": " 2 ", "minutes": "1.5"}
    assert budget_raise(asked) == Budget(tokens=50_000, usd=0.25, model_calls=2, seconds=90)
    assert budget_raise({"calls": "3", "tokens": ""}) == Budget(model_calls=3)


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({}, "say what to raise"),
        ({"calls": "", "usd": " "}, "say what to raise"),
        ({"calls": "1.5"}, "model calls: '1.5' is not a whole number"),
        ({"tokens": "²"}, "tokens: '²' is not a whole number"),
        ({"usd": "nan"}, "dollars: raise it by more than 0"),
        ({"usd": "inf"}, "dollars: raise it by more than 0"),
        ({"calls": "0"}, "model calls: raise it by more than 0"),
        ({"minutes": "-5"}, "minutes: raise it by more than 0"),
        ({"minutes": "99999999"}, "minutes: raise it by more than 0 and less than 10,000,000"),
    ],
)
def test_a_budget_form_that_raises_nothing_says_why(fields: dict[str, str], says: str) -> None:
    said = budget_raise(fields)
    assert isinstance(said, str)
    assert said.startswith(says)
