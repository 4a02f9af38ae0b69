"""A followed run's answer, shown as the model writes it.

The run's live stream (`relay.stream`) carries each reply's raw text piece by
piece; `agent_core.FinalStream` decodes the `final` string out of it, so the
person reads the answer, not JSON (a reply that calls a tool shows nothing).
In a terminal the answer grows in the live area under the trace, where the
spinner is, and gives way to the run's last line, which holds it whole: the
scrollback shows it once. Only the followed run's own replies are shown; its
specialists' answers come back as its tool results.
"""

from __future__ import annotations

import queue

from rich.text import Text

from agent_core import FinalStream
from workers.cli.terminal import printable
from workers.engine.records import StreamEvent
from workers.relay import Relay

__all__ = ["TAIL_LINES", "Answer", "pump_stream"]

TAIL_LINES = 12
"""Lines of a long answer the live area shows (the newest)."""


class Answer:
    """The final text of the run's current reply, as far as it has been written."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self._final = FinalStream()
        self.text = ""

    def show(self, event: StreamEvent) -> bool:
        """Take `event`; return whether the text to show changed."""
        if event.run_id != self.run_id:
            return False
        if event.kind in ("step", "restarted"):  # a new reply, or this one again
            self._final = FinalStream()
            changed, self.text = bool(self.text), ""
            return changed
        if event.kind != "text":
            return False
        piece = self._final.feed(event.text)
        self.text += piece
        return bool(piece)

    def view(self) -> Text:
        """The newest lines of the answer, made safe to print."""
        lines = printable(self.text).split("\n")
        shown = "\n".join(lines[-TAIL_LINES:])
        return Text(("…\n" if len(lines) > TAIL_LINES else "") + shown)


def pump_stream(relay: Relay, run_id: str, into: queue.Queue[object]) -> None:
    """Put the run's live events into `into` until the run finishes (a thread's body).

    A failure only ends the live text: the trace, followed beside it, says what is wrong.
    """
    try:
        for event in relay.stream(run_id):
            into.put(event)
    except Exception:  # noqa: BLE001 - the trace's follower reports Redis's failures
        return
