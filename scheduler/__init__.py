"""scheduler: recurring recipes and the fleet's tick.

`tick(relay, now_ms)` is what the fleet's tick (the `relay.tick` task) calls with the real
clock. It never imports `workers`: it takes what it needs through `TickHost`.
A `Schedule` is plain data; `ScheduleStore` keeps schedules and notifications
in Redis and claims each (schedule, slot) exactly once.
"""

from scheduler.errors import SchedulerError, StoreUnreachable
from scheduler.schedules import Schedule
from scheduler.store import Notification, ScheduleKeys, ScheduleShards, ScheduleStore
from scheduler.tick import TickHost, tick

__all__ = [
    "Notification",
    "Schedule",
    "ScheduleKeys",
    "ScheduleShards",
    "ScheduleStore",
    "SchedulerError",
    "StoreUnreachable",
    "TickHost",
    "tick",
]
