"""What relay web shows, as data: specialists under their parents, durations, money."""

from __future__ import annotations

from typing import Any

from workers.web.views import duration, money, nested


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
