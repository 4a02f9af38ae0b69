"""A worker's log lines about a call name its run and call, from the call's own thread
too (where the model client retries and the routes fail)."""

from __future__ import annotations

import logging
import threading

import pytest

from workers.runtime.carrier import name_runs_in_logs, working_on
from workers.runtime.leases import Lease, run_leased


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records]


def test_lines_written_while_working_on_a_call_name_it(caplog: pytest.LogCaptureFixture) -> None:
    name_runs_in_logs()
    name_runs_in_logs()  # twice changes nothing: one prefix, not two
    ours, theirs = logging.getLogger("workers.model.transport"), logging.getLogger("celery.x")
    lease = Lease(10.0, lambda: True, lambda: False)
    with caplog.at_level(logging.INFO):
        ours.warning("before any call")
        with working_on("r1", "m3"):
            ours.warning("attempt %d failed, retrying", 1)
            ours.warning("run r1 says so itself")
            theirs.warning("not ours")
            run_leased(
                lambda: ours.warning("from the call's thread"), lease, None, threading.Event()
            )
        ours.warning("after")
    assert _lines(caplog) == [
        "before any call",
        "run r1, m3: attempt 1 failed, retrying",
        "run r1 says so itself",
        "not ours",
        "run r1, m3: from the call's thread",
        "after",
    ]
