"""scheduler: recurring recipes and the beat's tick.

`tick(relay, now_ms)` is what the beat's `relay.tick` task calls with the real
clock. It never imports `workers`: it takes what it needs through `TickHost`.
"""

from scheduler.tick import TickHost, tick

__all__ = ["TickHost", "tick"]
