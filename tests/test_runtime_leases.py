"""Leases under a live call, and durable claims.

A live worker keeps its call's lease however long the call takes; a worker that
cannot renew (C code holding the GIL) loses it, another worker takes the call
over, and the late outcome is fenced off and logged; a tool that asks for a
longer lease keeps it. With RELAY_DURABLE_CLAIMS=1 a worker starts only on a
Redis that can make a claim durable, and waits for it before a call that must
not run twice. Real Redis servers (a replica too), real workers.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import redis

from agent_core import Stop
from tests.support.brain import call, final
from tests.support.fleet import Fleet, fleet
from tests.support.redis_server import RedisServer
from tests.support.waiting import prompts_for
from tests.support.worker_process import RelayProcess

SHORT_LEASE = {"RELAY_RECOVERY_SECONDS": "2", "RELAY_TICK_SECONDS": "0.5"}
"""A one-second lease (recovery minus one tick), renewed every third of a second."""


def _attempts(f: Fleet, run_id: str, call_id: str) -> list[str]:
    """Lines of the worker logs that name an attempt of the call other than the first."""
    return [
        line
        for line in f.full_logs().splitlines()
        if f"{call_id} of run {run_id} (attempt" in line and "(attempt 1)" not in line
    ]


def test_a_live_worker_keeps_its_lease_through_a_long_call(tmp_path: Path) -> None:
    with fleet(tmp_path, extra_env=SHORT_LEASE) as f:
        f.brain.script("LONG:", {0: call("once", label="long", seconds=6), 1: final("done")})
        for name in ("a", "b"):
            f.worker("--concurrency", "2", "--pool", "threads", name=name)
        run_id = f.relay.start("LONG: do it once, slowly")
        outcome = f.relay.wait(run_id, 90)
        assert outcome.stop is Stop.DONE, f.logs()
        # Six times its lease, yet it ran once, and its outcome is known.
        assert f.ledger().count("once start long") == 1
        assert f.ledger().count("once end long") == 1
        results = [e for e in f.relay.trace(run_id) if e.kind == "result"]
        assert [r.status for r in results] == ["ok"]
        assert "lost its lease" not in f.full_logs()


def test_a_call_that_holds_the_gil_past_its_lease_is_taken_over_and_fenced(
    tmp_path: Path,
) -> None:
    with fleet(tmp_path, extra_env=SHORT_LEASE) as f:
        f.brain.script("GIL:", {0: call("crunch", label="gil", seconds=5), 1: final("crunched")})
        for name in ("a", "b"):
            f.worker("--concurrency", "2", "--pool", "threads", name=name)
        run_id = f.relay.start("GIL: crunch")
        outcome = f.relay.wait(run_id, 90)
        assert outcome.stop is Stop.DONE, f.logs()
        f.until(lambda: "crunch end gil" in f.ledger(), 30, what="the crunch to end")
        # Its worker could not renew; another attempt took over and, the tool not
        # being idempotent, reported the outcome unknown rather than run it again.
        assert f.ledger().count("crunch start gil") == 1
        results = [e for e in f.relay.trace(run_id) if e.kind == "result"]
        assert [r.status for r in results] == ["unknown"]
        assert "outcome unknown" in prompts_for(f, "GIL:")[-1]
        # The first attempt's late "ok" was fenced off, and its log says so.
        f.until(lambda: "outcome is discarded" in f.full_logs(), 30, what="the fence")
        assert f"tool call call-1 of run {run_id} (attempt 1) lost its lease" in f.full_logs()


def test_the_attempt_that_took_a_call_over_keeps_it_against_the_late_first(
    tmp_path: Path,
) -> None:
    # Each call's first attempt holds the GIL past its lease; the second (the tool may run
    # again) takes the call over and is still running when the first wakes up. "fence":
    # the first returns at once, and SAVE's attempt fence keeps its outcome out. "renew":
    # the first goes on, its next RENEW says "lost" and it is told to stop. Either way
    # the second's outcome is kept and the tool runs twice, never a third time.
    with fleet(tmp_path, extra_env=SHORT_LEASE) as f:
        steps = {
            0: call("crunch_then_wait", label="fence", seconds=5),
            1: call("crunch_then_wait", label="renew", seconds=5, linger=3),
            2: final("done"),
        }
        f.brain.script("TAKEN:", steps)
        for name in ("a", "b"):
            f.worker("--concurrency", "2", "--pool", "threads", name=name)
        run_id = f.relay.start("TAKEN: crunch twice")
        outcome = f.relay.wait(run_id, 120)
        assert outcome.stop is Stop.DONE, f.logs()
        f.until(lambda: f.ledger().count("crunch_then_wait end renew") == 2, 30, what="ends")
        results = [(e.status, e.text) for e in f.relay.trace(run_id) if e.kind == "result"]
        assert results == [("ok", "crunched fence (run 2)"), ("ok", "crunched renew (run 2)")]
        ledger = f.ledger()
        assert ledger.count("crunch_then_wait start fence") == 2, ledger
        assert ledger.count("crunch_then_wait start renew") == 2, ledger
        assert "crunch_then_wait told to stop renew" in ledger  # its RENEW said "lost"


def test_a_tool_that_asks_for_a_longer_lease_keeps_it(tmp_path: Path) -> None:
    with fleet(tmp_path, extra_env=SHORT_LEASE) as f:
        f.brain.script(
            "GIL-LEASE:",
            {0: call("crunch_long_lease", label="held", seconds=5), 1: final("crunched")},
        )
        for name in ("a", "b"):
            f.worker("--concurrency", "2", "--pool", "threads", name=name)
        run_id = f.relay.start("GIL-LEASE: crunch")
        assert f.relay.wait(run_id, 90).stop is Stop.DONE, f.logs()
        assert f.ledger().count("crunch_long_lease start held") == 1
        results = [e for e in f.relay.trace(run_id) if e.kind == "result"]
        assert [r.status for r in results] == ["ok"]
        assert _attempts(f, run_id, "call-1") == []


# --- durable claims --------------------------------------------------------------------------


def _worker_exit(f: Fleet, env: dict[str, str]) -> tuple[int, str]:
    args = ["--app", "tests.apps.notes:relay", "worker", "--pool", "solo"]
    process = RelayProcess(args, {**f.env, **env}, f.directory / "refused.log", ready_text="")
    process.start()
    assert process.process is not None
    code = process.process.wait(60)
    output = process.output()
    process.stop()
    return code, output


def test_durable_claims_refuse_a_redis_that_cannot_keep_them(tmp_path: Path) -> None:
    with fleet(tmp_path) as f:  # no AOF, no replica: a crash forgets the last writes
        code, output = _worker_exit(f, {"RELAY_DURABLE_CLAIMS": "1"})
        assert code != 0
        lines = [line for line in output.splitlines() if line.startswith("relay:")]
        assert len(lines) == 1, output
        assert "RELAY_DURABLE_CLAIMS" in lines[0]
        assert "appendfsync always" in lines[0]
        assert "ready." not in output


def test_durable_claims_on_an_aof_that_fsyncs_every_write(tmp_path: Path) -> None:
    env = {"RELAY_DURABLE_CLAIMS": "1"}
    with fleet(tmp_path, appendonly=True, extra_env=env) as f:  # appendfsync always
        worker = f.worker("--pool", "threads")
        assert "durable claims on (fsync-always)" in worker.output()
        f.brain.script("DURABLE:", {0: call("once", label="d"), 1: final("done")})
        assert f.relay.wait(f.relay.start("DURABLE: once"), 60).stop is Stop.DONE
        assert f.ledger().count("once start d") == 1


def _waits(client: redis.Redis) -> int:
    stats = client.info("commandstats")
    return int(stats.get("cmdstat_wait", {}).get("calls", 0))


def test_durable_claims_wait_for_a_replica(tmp_path: Path) -> None:
    env = {"RELAY_DURABLE_CLAIMS": "1"}
    with fleet(tmp_path, extra_env=env) as f:
        replica_dir = tmp_path / "replica"
        replica_dir.mkdir()
        follow = ("--replicaof", "127.0.0.1", str(f.redis.port))
        with RedisServer(replica_dir, extra=follow):
            master = f.redis.client()
            f.until(
                lambda: master.info("replication").get("slave0", {}).get("state") == "online",
                60,
                what="the replica to be in sync",
            )
            worker = f.worker("--pool", "threads")
            assert "durable claims on (replica)" in worker.output()
            f.brain.script(
                "REPLICATED:",
                {0: call("once", label="r"), 1: call("read_note", name="x"), 2: final("ok")},
            )
            before = _waits(master)
            run_id = f.relay.start("REPLICATED: once, then read")
            assert f.relay.wait(run_id, 60).stop is Stop.DONE, f.logs()
            assert f.ledger().count("once start r") == 1
            # One wait, for the call that must not run twice; the read needs none.
            assert _waits(master) - before == 1


def test_a_claim_no_replica_confirms_is_given_back_and_runs_once_later(tmp_path: Path) -> None:
    env = {"RELAY_DURABLE_CLAIMS": "1", "RELAY_TICK_SECONDS": "1"}
    with fleet(tmp_path, extra_env=env) as f:
        replica_dir = tmp_path / "replica"
        replica_dir.mkdir()
        follow = ("--replicaof", "127.0.0.1", str(f.redis.port))
        with RedisServer(replica_dir, extra=follow) as replica:
            master = f.redis.client()
            f.until(
                lambda: master.info("replication").get("slave0", {}).get("state") == "online",
                60,
                what="the replica to be in sync",
            )
            f.worker("--pool", "threads")
            assert replica.process is not None
            os.kill(replica.process.pid, signal.SIGSTOP)  # the replica stops answering
            try:
                f.brain.script("UNCONFIRMED:", {0: call("once", label="u"), 1: final("ok")})
                run_id = f.relay.start("UNCONFIRMED: once")
                f.until(lambda: "did not confirm" in f.full_logs(), 60, what="a refused wait")
                assert "once start u" not in f.ledger()  # it never started
            finally:
                os.kill(replica.process.pid, signal.SIGCONT)
            assert f.relay.wait(run_id, 60).stop is Stop.DONE, f.logs()
            assert f.ledger().count("once start u") == 1
            results = [e for e in f.relay.trace(run_id) if e.kind == "result"]
            assert [r.status for r in results] == ["ok"]  # a first attempt, not "unknown"
