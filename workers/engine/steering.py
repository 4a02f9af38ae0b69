"""People steering a run: their messages, pause and resume, and follow-ups (new turns).

The engine's handlers for the inbox events a person's client appends, with no
I/O; `workers.engine.decide` puts them in its table and asks `next_turn` whenever the
agent is done. Each event is applied once, by the save that deletes it from
the inbox, so a duplicate delivery changes nothing.

    event       the run is                    what happens
    told        working, or parked            `agent.tell`: shown at its next model call
    pause       working                       paused: the next step decided sends no
                                              model call, tool call or specialist (they
                                              wait as `held`); calls under way finish
                                              and are applied; its specialists pause too
    resume      paused                        what was held is sent; specialists resume
    follow_up   finished                      a new turn (`agent.follow_up`): the run is
                                              reopened, its keys lose their TTLs
    follow_up   working (enqueue)             queued: it begins when this turn ends
    follow_up   working (interrupt)           this turn's calls are stopped (fenced off:
                                              their leases are lost, their outcomes not
                                              taken), its specialists cancelled, the
                                              turn cancelled, the new one begun
    follow_up   working (reject)              never: the client refused it (REPLY)

A message to a finished run, a pause of a paused one and a resume of one not
paused change nothing. Pausing does not stop a budget's clock or an approval's.
"""

from __future__ import annotations

from agent_core import Done, Outcome
from workers.engine.effects import Message
from workers.engine.events import CancelRun, FollowUp, PauseRun, ResumeRun, Told
from workers.engine.ids import model_call
from workers.engine.working import Working

__all__ = ["MAX_QUEUED", "next_turn", "on_follow_up", "on_pause", "on_resume", "on_told", "stop"]

MAX_QUEUED = 10
"""Follow-ups a working run holds for its next turns; more are dropped (a trace line)."""
INTERRUPTED = "Stopped: the person asked for something else."


def on_told(run: Working, event: Told) -> None:
    run.agent.tell(event.text)


def on_pause(run: Working, _event: PauseRun) -> None:
    if run.paused or isinstance(run.agent.resume(), Done):
        return
    run.paused = True
    run.note("paused")
    for track in run.calls.values():
        if track.status == "child" and track.child:
            run.deliver(track.child, PauseRun())


def on_resume(run: Working, _event: ResumeRun) -> None:
    if not run.paused:
        return
    run.paused = False
    run.note("resumed")
    for track in run.calls.values():
        if track.status == "child" and track.child:
            run.deliver(track.child, ResumeRun())


def on_follow_up(run: Working, event: FollowUp) -> None:
    run.follow_up_taken = True
    step = run.agent.resume()
    if isinstance(step, Done):
        if run.state == "finished":
            _reopen(run)
        else:
            run.note("turn_ended", step.outcome.summary, stop=step.outcome.stop.value)
        _begin(run, event.text)
    elif event.strategy == "interrupt":
        stop(run, fence=True)
        run.agent.cancel(INTERRUPTED)
        run.take_trace()
        run.note("interrupted", event.text)
        _begin(run, event.text)
    elif event.strategy == "enqueue" and len(run.queued) < MAX_QUEUED:
        run.queued = (*run.queued, event.text)
        run.note("queued", event.text)
    else:
        why = "too many follow-ups wait already" if event.strategy == "enqueue" else "it worked"
        run.note("ignored", f"a follow-up ({why}): {event.text}")


def next_turn(run: Working, outcome: Outcome) -> bool:
    """Begin the next queued turn when a turn ends; False if none is due (the run ends).

    A turn the host stopped (budget spent, run failed) ends the run, queue and all.
    """
    if not run.queued or run.forced_stop is not None or run.record.parent is not None:
        return False
    text, run.queued = run.queued[0], run.queued[1:]
    run.note("turn_ended", outcome.summary, stop=outcome.stop.value)
    _begin(run, text)
    return True


def _reopen(run: Working) -> None:
    run.reopened = True
    run.outcome = None
    run.finished_ms = None
    run.forced_stop = None
    run.parked = None  # a tree still at its budget's limit parks again at the next claim
    run.paused = False


def _begin(run: Working, text: str) -> None:
    run.verifier_rejections = 0
    run.agent.follow_up(text)
    run.take_trace()


def stop(run: Working, *, fence: bool) -> None:
    """Stop what the run's turn has under way: its specialists are cancelled, its calls'
    messages withdrawn and the model call's reservation let go.

    With `fence`, the calls already running are cut loose as well (their attempt
    markers forgotten: their leases are lost, which tells their workers to stop,
    and their outcomes are not taken), and nothing is left in flight.
    """
    for call_id, track in run.calls.items():
        if track.status == "child" and track.child:
            stopped = CancelRun(reason="The run that started it stopped.")
            run.deliver(track.child, stopped, cancel_flag=True)
        if track.status == "running":
            run.unsend.append(Message("run_tool", run.id, call=call_id).member)
            if fence:
                run.call_stale(call_id)
    if run.asked is not None:
        run.unsend.append(Message("call_model", run.id, seq=run.asked).member)
        call = model_call(run.asked)
        run.settle_reservation(call)
        if fence:
            run.call_stale(call)
            run.asked = None
    run.calls = {}
