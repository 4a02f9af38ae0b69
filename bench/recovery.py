"""7. Recovery: how soon a plain fleet picks up the calls of workers that die mid-call,
with a worker killed every 5 to 10 s.

`python -m bench.recovery [--quick]` runs it alone (it is also part of `bench.run`).

Three `relay worker`s (eight slots each) with Relay's defaults
(RELAY_RECOVERY_SECONDS and RELAY_TICK_SECONDS unset, no beat) and six runs,
each in one long `wait` call.
Every 5 to 10 s (at random, so a kill falls anywhere between two renewals and
anywhere in the tick's interval), a worker holding calls is killed with SIGKILL
(its whole process group) and a new one started in its place: its start-up
takes the machine's CPU from the others, as a fleet under chaos does. For each
call the dead worker held, the clock runs from the kill until another worker has
claimed it (the lease key names a new holder). A call taken over twice is
cancelled and a new run takes its place (a call is tried three times at most).

The stated bound is `workers.settings.recovery_parts`: the lease (it lapses that
long after its last renewal at most), a tick interval (the next tick sends the
call again) and the allowance for the re-sent call to be taken (the tick's
jitter and lateness, the send, a worker's claim) add up to the recovery time.
Printed: each part, the max and the count of pick-ups over the bound.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.cluster import Worker
from bench.context import Bench, bench, median
from bench.model import Task
from workers import Settings
from workers.processes import kill_group
from workers.settings import Timing, recovery_parts

__all__ = ["run"]

WORKERS = 3
CALLS = 6
KILL_EVERY_S = (5.0, 10.0)
TAKEN_OVER_AT_MOST = 2
"""Pick-ups measured per call: the third attempt is the last a call gets."""


@dataclass
class _Call:
    run_id: str
    holder: str | None = None
    due_ms: float = 0.0
    """Its outbox score while it is held: when the tick may send it again (last renewal
    + lease, by the renewing worker's clock)."""
    killed_at: float | None = None
    """When the worker holding it was killed (None: it is not waiting to be picked up)."""
    killed_ms: float = 0.0
    taken_over: int = 0


@dataclass
class _PickUp:
    """One call picked up again: how long it took, and where that time went."""

    took_s: float
    lease_left_s: float
    """From the kill to the lease's end (its last renewal + the lease)."""
    tick_s: float
    """From the lease's end to the tick that sent the call again."""
    taken_s: float
    """From that tick's start to the claim (the send, the delivery, the claim)."""


@dataclass
class _Chaos:
    b: Bench
    kills: int
    workers: list[Worker] = field(default_factory=list)
    calls: list[_Call] = field(default_factory=list)
    took: list[_PickUp] = field(default_factory=list)
    started: int = 0
    lease_ms: int = 0

    def worker(self) -> Worker:
        self.started += 1
        # (Slots to spare: a cancelled run's `wait` keeps its slot until its worker dies.)
        return self.b.relay_worker(f"recovery-{self.started}", "--pool", "threads", "-c", "8")

    def start_call(self) -> _Call:
        task = Task(f"recover-{len(self.took)}-{len(self.calls)}", batches=1, batch=1, ms=600_000)
        return _Call(self.b.relay.start(task.text()))

    def holders(self) -> list[str | None]:
        keys = [f"relay:lease:{c.run_id}:call-1" for c in self.calls]
        return [None if t is None else t.decode() for t in self.b.redis.mget(keys)]

    def look(self) -> None:
        """Note each call's holder and when it is due; a call picked up again ends its clock."""
        pipe = self.b.redis.pipeline(transaction=False)
        pipe.mget([f"relay:lease:{c.run_id}:call-1" for c in self.calls])
        for call in self.calls:
            pipe.zscore("relay:outbox", f"t|{call.run_id}|call-1")
        pipe.hget("relay:tick-stats", "last_ms")
        found = pipe.execute()
        tokens, scores, last_tick = found[0], found[1:-1], float(found[-1] or 0)
        for call, token, score in zip(list(self.calls), tokens, scores, strict=True):
            holder = None if token is None else token.decode()
            if holder is not None and holder != call.holder and call.killed_at is not None:
                claimed_ms = float(score or 0) - self.lease_ms  # (the claim's own clock)
                self.took.append(
                    _PickUp(
                        took_s=time.monotonic() - call.killed_at,
                        lease_left_s=(call.due_ms - call.killed_ms) / 1000,
                        tick_s=(last_tick - call.due_ms) / 1000,
                        taken_s=(claimed_ms - last_tick) / 1000,
                    )
                )
                call.killed_at = None
                call.taken_over += 1
                if call.taken_over >= TAKEN_OVER_AT_MOST:
                    self.b.relay.cancel(call.run_id)
                    self.calls[self.calls.index(call)] = self.start_call()
                    continue
            if holder is not None:
                call.holder = holder
            if call.killed_at is None and score is not None:
                call.due_ms = float(score)

    def kill_one(self) -> None:
        """Kill a worker that holds calls, and start another in its place meanwhile."""
        held = {int(c.holder.split("-")[0]) for c in self.calls if c.holder and not c.killed_at}
        victims = [w for w in self.workers if w.process is not None and w.pid in held]
        if not victims:
            return
        victim = random.choice(victims)
        pid, killed, killed_ms = victim.pid, time.monotonic(), time.time() * 1000
        assert victim.process is not None
        kill_group(victim.process)
        victim.process = None
        for call in self.calls:
            if call.holder is not None and int(call.holder.split("-")[0]) == pid:
                call.killed_at, call.killed_ms = killed, killed_ms
        self.workers.remove(victim)
        threading.Thread(target=lambda: self.workers.append(self.worker()), daemon=True).start()
        self.kills -= 1


def _chaos(b: Bench, kills: int, lease_ms: int) -> list[_PickUp]:
    chaos = _Chaos(b, kills, lease_ms=lease_ms)
    chaos.workers = [chaos.worker() for _ in range(WORKERS)]
    try:
        chaos.calls = [chaos.start_call() for _ in range(CALLS)]
        deadline = time.monotonic() + 60
        while not all(chaos.holders()):
            if time.monotonic() > deadline:
                raise TimeoutError("recovery: the calls did not start")
            time.sleep(0.05)
        next_kill = time.monotonic() + random.uniform(*KILL_EVERY_S)
        give_up = time.monotonic() + kills * (KILL_EVERY_S[1] + 60)
        while chaos.kills > 0 or any(c.killed_at is not None for c in chaos.calls):
            if time.monotonic() > give_up:
                raise TimeoutError("recovery: a call was not picked up again")
            chaos.look()
            if chaos.kills > 0 and time.monotonic() >= next_kill:
                chaos.kill_one()
                next_kill = time.monotonic() + random.uniform(*KILL_EVERY_S)
            time.sleep(0.01)
        for call in chaos.calls:
            b.relay.cancel(call.run_id)
        return chaos.took
    finally:
        time.sleep(1)  # (a replacement still starting is in the list by then)
        for worker in chaos.workers:
            worker.stop()
        b.clear()


def run(b: Bench) -> dict[str, Any]:
    settings = Settings.from_env({**os.environ, **b.env})  # (the workers' settings)
    parts = recovery_parts(settings)
    kills = b.pick(24, 4)
    picked = _chaos(b, kills, Timing.of(settings).lease_ms)
    seconds = [p.took_s for p in picked]
    bound = parts.bound_s
    return {
        "kills": kills,
        "picked_up": len(seconds),
        "each_s": [round(s, 2) for s in seconds],
        "median_s": median(seconds),
        "max_s": max(seconds),
        "over_bound": sum(1 for s in seconds if s > bound),
        "lease_s": parts.lease_s,
        "tick_s": parts.tick_s,
        "allowance_s": parts.allowance_s,
        "goal_s": bound,
        # Where the time went, at worst: past the lease, past the tick interval, taking.
        "max_lease_left_s": round(max(p.lease_left_s for p in picked), 3),
        "max_tick_s": round(max(p.tick_s for p in picked), 3),
        "max_taken_s": round(max(p.taken_s for p in picked), 3),
        "slowest": asdict(max(picked, key=lambda p: p.took_s)),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.recovery", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="4 kills instead of 24")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as work, bench(Path(work), quick=args.quick) as b:
        r = run(b)
    print(f"lease {r['lease_s']:g} s + tick {r['tick_s']:g} s + allowance {r['allowance_s']:g} s")
    print(f"  = the bound, {r['goal_s']:g} s (RELAY_RECOVERY_SECONDS)")
    print(f"{r['kills']} kills, one every 5-10 s; {r['picked_up']} calls picked up again")
    print(f"  median {r['median_s']:.2f} s, max {r['max_s']:.2f} s")
    print(f"  over the bound: {r['over_bound']} of {r['picked_up']}")
    print(
        f"at worst: lease left after the kill {r['max_lease_left_s']:.2f} s,"
        f" tick after the lease {r['max_tick_s']:.2f} s, taken after the tick"
        f" {r['max_taken_s']:.2f} s"
    )
    slowest = {k: round(v, 2) for k, v in r["slowest"].items()}
    print(f"the slowest pick-up: {slowest}")
    return 0 if r["over_bound"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
