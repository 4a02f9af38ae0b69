"""The real thing: two `relay beat` processes and real workers against one Redis, an
every-minute schedule, the real clock. Exactly one run per minute.

To stay short without faking time, the schedule is made as if 50 seconds ago (its
`now_ms`), so its first minute ends ten seconds after the beats are up, and the test
watches that slot: not fired early, fired once, then no second run while both beats
tick on. RELAY_TICK_SECONDS=1 asks for a tick every second; with the default five
seconds the test holds too, only each run starts a little later in its minute. (It
watched a second slot too, a minute more of CI for what the tick's own tests check
on a fake clock: the next slot follows a minute after the last, with no drift.)
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from agent_core import Every, Recipe, Stop
from tests.support.brain import final
from tests.support.fleet import fleet
from workers.settings import now_ms

MINUTE = 60_000
SLOTS = 1
SETTLE_MS = 20_000
"""How long after a slot its run must exist: ticks come every few seconds."""
DUPLICATE_WINDOW_S = 4.0
"""How long the test watches for a second run of a slot once the first is there (four
ticks of each beat)."""


def sleep_until(moment_ms: int) -> None:
    while (left := moment_ms - now_ms()) > 0:
        time.sleep(min(left / 1000, 1.0))


@pytest.mark.timeout(330)
def test_two_beats_fire_an_every_minute_schedule_once_in_its_minute(tmp_path: Path) -> None:
    recipe = Recipe("greet", "BEATS: say hello to {who}.").param("who")
    with fleet(tmp_path, extra_env={"RELAY_TICK_SECONDS": "1"}) as f:
        f.brain.script("BEATS", {0: final("hello")})
        f.worker("--concurrency", "4")  # ticks from both beats run side by side
        beats = [f.beat(), f.beat()]
        made = now_ms() - 50_000
        f.relay.schedule("every-minute", recipe, {"who": "the team"}, Every(1), now_ms=made)
        slots = [made + k * MINUTE for k in range(1, SLOTS + 1)]

        def runs() -> list[int]:
            found = f.relay.runs(limit=1_000)
            return sorted(r.created_ms for r in found if r.schedule == "every-minute")

        for count, slot in enumerate(slots, 1):
            sleep_until(slot - 1_000)
            assert len(runs()) == count - 1, f.logs()  # not early
            f.until(lambda n=count: len(runs()) >= n, SETTLE_MS / 1000 + 1, what="the run")
            # Both beats tick every second: a second firing of the slot would come within
            # a tick or two of the first.
            time.sleep(DUPLICATE_WINDOW_S)
            assert len(runs()) == count, f.logs()  # and then exactly once

        started = runs()
        for slot, at in zip(slots, started, strict=True):
            assert slot <= at < slot + SETTLE_MS, (slots, started)
        for status in f.relay.runs(limit=1_000):
            assert f.relay.wait(status.id, timeout=30).stop is Stop.DONE, f.logs()
        [stored] = f.relay.schedules()
        assert stored.last_run_ms == slots[-1]  # the rhythm held: no drift by the tick

        for beat in beats:  # both beats were really ticking all along
            assert beat.output().count("Sending due task relay-tick") >= 2 * SLOTS, f.logs()
