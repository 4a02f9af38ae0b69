"""The broker matrix: the runtime's scenarios on RabbitMQ with the run state on a Redis
Cluster, the layout furthest from every other runtime test's (one Redis, broker and
store); the schedule's on Redis, on RabbitMQ with Redis, and on RabbitMQ with the
cluster. RabbitMQ with one Redis is the layout of the RabbitMQ tests at the end.

Each scenario is the one its own module tests on Redis: approvals, a parallel
batch, specialists (usage rolled up, cancel), a worker killed mid-call, every
message delivered twice, and a schedule firing once. (Each ran on RabbitMQ with
one Redis too: a minute and more of CI, for what the RabbitMQ tests below and the
scenarios on the cluster cover between them.) On RabbitMQ each fleet gets a vhost
of its own on the machine's server, removed when the test ends
(tests/support/rabbitmq.py); on the cluster (three masters, one replica each:
tests/support/redis_cluster.py, one for the session) each fleet has a key prefix of
its own. Then what only RabbitMQ has: its queues, a dead worker's message handed
back at once, a countdown kept by the broker, a move from Redis that loses nothing,
and the worker's one-line refusals.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
from amqp.exceptions import PreconditionFailed
from kombu import Queue

import tests.test_runtime_crash as crash
import tests.test_runtime_people as people
import tests.test_runtime_specialists as specialists
from agent_core import Every, Recipe, Stop
from tests.apps.notes import build
from tests.support.brain import call, final
from tests.support.cli import clean_env, relay
from tests.support.fleet import Fleet, fleet, on_broker, on_cluster
from tests.support.rabbitmq import VHOSTS_MADE, rabbit_vhost, require_rabbitmq
from tests.support.redis_cluster import Cluster, redis_cluster
from workers import Settings
from workers.celery_app.brokers import check_broker
from workers.settings import now_ms

BROKERS = ["amqp", "amqp+cluster"]
"""RabbitMQ with Redis; RabbitMQ with the run state on a Redis Cluster."""

__all__ = ["redis_cluster"]  # the session's cluster fixture, used here


@pytest.fixture(params=["amqp+cluster"])
def broker(request: pytest.FixtureRequest) -> Iterator[str]:
    """Every fleet the test makes uses this broker (and, for amqp+cluster, the cluster)."""
    layout: str = request.param
    if layout.startswith("amqp"):
        require_rabbitmq()
    made = len(VHOSTS_MADE)
    cluster: Cluster | None = None
    with ExitStack() as stack:
        stack.enter_context(on_broker("amqp" if layout.startswith("amqp") else "redis"))
        if layout.endswith("+cluster"):
            cluster = request.getfixturevalue("redis_cluster")
            stack.enter_context(on_cluster(cluster))
        keys_before = cluster.key_count() if cluster else 0
        yield "amqp" if layout.startswith("amqp") else "redis"
    # The scenario's fleets really ran on RabbitMQ (each in a vhost of its own), or not at all.
    assert (len(VHOSTS_MADE) > made) == layout.startswith("amqp")
    if cluster is not None:  # and their runs are on the cluster
        assert cluster.key_count() > keys_before


# --- the scenarios, on each broker ------------------------------------------------------------


def test_approvals(broker: str, tmp_path: Path) -> None:
    with fleet(tmp_path) as f:
        assert f.broker == broker
        f.worker("--concurrency", "1")
        people.test_a_call_waits_for_approval_then_runs(f)
        people.test_calls_needing_no_approval_run_while_another_waits(f)
        people.test_a_repeated_decision_is_refused_and_the_call_runs_once(f)


def test_a_parallel_batch(broker: str, tmp_path: Path) -> None:
    crash.test_a_batch_runs_side_by_side(tmp_path)


def test_specialists_side_by_side_with_usage_rolled_up(broker: str, tmp_path: Path) -> None:
    specialists.test_three_specialists_run_side_by_side(tmp_path)


def test_cancel_reaches_running_specialists(broker: str, tmp_path: Path) -> None:
    specialists.test_cancel_reaches_running_children(tmp_path)


def test_a_worker_killed_during_a_non_idempotent_tool(broker: str, tmp_path: Path) -> None:
    crash.test_a_worker_killed_during_a_non_idempotent_tool(tmp_path)


def test_a_worker_killed_during_a_model_call(broker: str, tmp_path: Path) -> None:
    crash.test_a_worker_killed_during_a_model_call(tmp_path)


def test_every_message_delivered_twice(broker: str, tmp_path: Path) -> None:
    crash.test_every_message_delivered_twice(tmp_path)


@pytest.mark.parametrize("broker", ["redis", *BROKERS], indirect=True)
def test_a_schedule_fires_once_with_two_ticking_workers_and_a_beat(
    broker: str, tmp_path: Path
) -> None:
    recipe = Recipe("hello", "BROKER-SCHED: say hello to {who}.").param("who")
    with fleet(tmp_path, extra_env={"RELAY_TICK_SECONDS": "1"}) as f:
        f.brain.script("BROKER-SCHED", {0: final("hello")})
        workers = [f.worker("--pool", "threads", name=f"t{n}") for n in range(2)]
        beat = f.beat()  # its ticks go through the broker, on the tick's own queue
        # Made two minutes ago: two slots missed, which fire once, not twice.
        f.relay.schedule("hello", recipe, {"who": "the team"}, Every(1), now_ms=now_ms() - 120_000)

        def fired() -> list[str]:
            return [r.id for r in f.relay.runs(limit=100) if r.schedule == "hello"]

        f.until(fired, 30, what="the schedule to fire")
        [run_id] = fired()
        assert f.relay.wait(run_id, timeout=30).stop is Stop.DONE, f.logs()
        time.sleep(4)  # four more ticks, from the workers and from the beat
        assert fired() == [run_id], f.logs()
        [stored] = f.relay.schedules()
        assert stored.next_due_ms is not None
        assert stored.next_due_ms > now_ms()
        # The beat's ticks were delivered to the workers over the broker.
        assert "Sending due task relay-tick" in beat.output()
        assert any("Task relay.tick[" in w.output() for w in workers), f.logs()


# --- what only RabbitMQ has -------------------------------------------------------------------


@pytest.fixture
def rabbit(tmp_path: Path) -> Iterator[Fleet]:
    require_rabbitmq()
    with fleet(tmp_path, broker="amqp") as running:
        yield running


def _ready(f: Fleet, queue: str) -> int:
    """Messages waiting in `queue` on RabbitMQ (not those delivered and not yet acknowledged)."""
    with f.relay.celery.connection_for_write() as connection:
        declared = Queue(queue, no_declare=True).bind(connection.channel())
        return int(declared.queue_declare(passive=True).message_count)


def test_on_rabbitmq_the_queues_are_durable_quorum_queues(rabbit: Fleet) -> None:
    f = rabbit
    worker = f.worker("--concurrency", "1")
    assert "relay: broker RabbitMQ" in worker.output()
    assert ", quorum queues" in worker.output()
    with f.relay.celery.connection_for_write() as connection:
        for name in f.relay.queues.all():  # the tick's queue among them, apart from the others
            channel = connection.channel()
            classic = Queue(name, durable=True).bind(channel)
            # Declared again as a classic queue, it is refused: it is a quorum queue.
            with pytest.raises(PreconditionFailed, match="x-queue-type"):
                classic.declare()
    stats = f.relay.celery.control.inspect(timeout=5).stats() or {}
    [seen] = stats.values()
    assert seen["prefetch_count"] == 1  # prefetch 1 (per queue: quorum queues have no global QoS)


def test_on_rabbitmq_a_dead_workers_message_comes_back_at_once(rabbit: Fleet) -> None:
    f = rabbit
    f.brain.script("AMQP-BACK", {0: call("sleep", seconds=3), 1: final("slept")})
    # The tool gets a message of its own (not continued in place), to be the one handed back.
    first = f.worker("--concurrency", "1", env={"RELAY_INLINE_MS": "0"})
    run_id = f.relay.start("AMQP-BACK: sleep")
    f.until(lambda: "sleep start 3" in f.ledger(), 30, what="the tool to start")
    tools = f.relay.queues.tools
    assert _ready(f, tools) == 0  # delivered, not acknowledged: acks are late
    first.kill()
    # Handed back by RabbitMQ as the connection closed: no worker is left to tick.
    f.until(lambda: _ready(f, tools) == 1, 5, what="the message back in its queue")
    f.worker("--concurrency", "1", name="second")
    outcome = f.relay.wait(run_id, timeout=60)
    assert outcome.stop is Stop.DONE, f.logs()
    assert f.ledger().count("sleep end 3") == 1, f.ledger()


def test_on_rabbitmq_a_countdown_waits_in_the_broker(rabbit: Fleet) -> None:
    f = rabbit
    worker = f.worker("--concurrency", "1")
    sent = time.monotonic()
    f.relay.celery.send_task(
        "relay.advance",
        args=["no-such-run"],
        task_id="countdown-probe",
        countdown=2,
        queue=f.relay.queues.advance,
    )
    f.until(lambda: "relay.advance[countdown-probe] received" in worker.output(), 30)
    # Native delayed delivery: the worker is handed the message when it is due,
    # rather than holding it (and its one prefetch slot) until then.
    assert time.monotonic() - sent >= 1.9


def test_moving_the_broker_to_rabbitmq_loses_nothing(rabbit: Fleet) -> None:
    f = rabbit
    f.brain.script("MOVED", {0: call("read_note", name="m.txt"), 1: final("moved")})
    on_redis = build(Settings.from_env({**f.env, "RELAY_BROKER_URL": f.env["RELAY_REDIS_URL"]}))
    run_id = on_redis.start("MOVED: read a note")  # its wake-up waits in Redis, for no one
    started = time.monotonic()
    f.worker("--concurrency", "1")  # the fleet, moved to RabbitMQ
    outcome = f.relay.wait(run_id, timeout=60)
    assert outcome.stop is Stop.DONE, f.logs()
    # The tick sent it again from the run's outbox: the old message is still in Redis.
    assert f.redis.client().llen(f.relay.queues.advance) == 1
    print(f"picked up on RabbitMQ {time.monotonic() - started:.1f} s after the move")


def test_relay_worker_refuses_a_broker_it_cannot_use_in_one_line(tmp_path: Path) -> None:
    require_rabbitmq()
    with rabbit_vhost() as url:
        env = {"RELAY_REDIS_URL": "redis://127.0.0.1:1/0", "RELAY_BROKER_URL": url}
        quorum = build(Settings.from_env(env))
        assert check_broker(quorum.celery, quorum.queues.all(), "quorum")  # declares them
        password = "guest:guest"
        refused = {
            "RELAY_QUEUE_TYPE: queue relay:advance already exists": {"RELAY_QUEUE_TYPE": "classic"},
            "RELAY_BROKER_URL: the broker refused it: Login was refused": {
                "RELAY_BROKER_URL": url.replace(password, "guest:not-the-password")
            },
            "RELAY_BROKER_URL: the broker refused it: vhost": {"RELAY_BROKER_URL": url + "-none"},
        }
        for said, changed in refused.items():
            run = relay(
                "--app", "tests.apps.notes:relay", "worker",
                env=clean_env(**{**env, **changed}), cwd=tmp_path,
            )  # fmt: skip
            assert run.returncode != 0, run.stdout + run.stderr
            errors = [line for line in run.stderr.splitlines() if line.strip()]
            assert len(errors) == 1, run.stderr
            assert said in errors[0], run.stderr
            assert "not-the-password" not in run.stdout + run.stderr
