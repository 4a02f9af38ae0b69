"""Celery's task events, made safe to send from a threads pool, so Flower sees every end.

Why: a worker with an event loop (prefork, threads and solo pools alike)
buffers its `task-*` events in one list per group and publishes the list when
the loop next flushes (`celery.events.dispatcher.EventDispatcher`, `send` and
`flush`). `send` appends to that list without the dispatcher's lock; `flush`
publishes the list and then empties it in place (`events[:] = []`). In a
prefork or solo worker only the loop's own thread sends task events, so
nothing is lost. In a threads pool, the pool's threads send `task-started` and
`task-succeeded` themselves: whatever they append while the loop's thread is
publishing the list is emptied with it, never sent, and Flower shows the task
RECEIVED or STARTED for ever (600 tasks on 8 threads: 40 % of them; a probe
counted the events appended during each publish). Their requests to flush
(`hub._ready.add`, outside the hub's lock) race the loop as well.

The fix: the thread that made the dispatcher (the worker's loop, where Celery
builds it) buffers as before; any other thread publishes its event at once,
under the dispatcher's lock, as Celery does for events it never buffers.
That costs one broker round trip per event sent from a pool thread.
`RelayEvents` puts this dispatcher in a Celery app: `Celery(..., events=RelayEvents)`.
"""

from __future__ import annotations

import threading
from typing import Any

from celery.app.events import Events
from celery.events.dispatcher import EventDispatcher
from celery.events.event import Event, group_from
from celery.utils.time import utcoffset

__all__ = ["OwnThreadBuffering", "RelayEvents"]


class OwnThreadBuffering(EventDispatcher):
    """An EventDispatcher that buffers only on the thread that made it (the worker's loop)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._loop_thread = threading.get_ident()

    def send(  # noqa: PLR0917 - Celery's own signature
        self,
        type: str,  # noqa: A002 - Celery's own argument name
        blind: bool = False,
        utcoffset: Any = utcoffset,
        retry: bool = False,
        retry_policy: Any = None,
        Event: Any = Event,  # noqa: N803 - Celery's own argument name
        **fields: Any,
    ) -> Any:
        group = group_from(type)
        buffered = group in getattr(self, "buffer_group", ())
        if not buffered or threading.get_ident() == self._loop_thread:
            return super().send(
                type,
                blind=blind,
                utcoffset=utcoffset,
                retry=retry,
                retry_policy=retry_policy,
                Event=Event,
                **fields,
            )
        if not self.enabled or (self.groups and group not in self.groups):
            return None
        return self.publish(
            type,
            fields,
            self.publisher,  # type: ignore[arg-type]  # enabled: it has a producer
            blind=blind,
            Event=Event,
            retry=retry,
            retry_policy=retry_policy,
        )


class RelayEvents(Events):
    """`app.events` of a Relay app: Celery's, with the dispatcher above."""

    # Celery takes a class where it takes its dotted name (symbol_by_name).
    dispatcher_cls = OwnThreadBuffering  # type: ignore[assignment]
