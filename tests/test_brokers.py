"""How the Celery app declares Relay's queues on each broker (no server needed).

What these declarations do on a real RabbitMQ is tests/test_runtime_brokers.py.
"""

from __future__ import annotations

import ssl
import threading

import pytest
from celery import Celery

from workers.celery_app.app import build_celery, visibility_timeout
from workers.celery_app.brokers import is_amqp, kombu_url
from workers.settings import Settings

REDIS = "redis://cache:6379/0"
RABBIT = "amqp://relay:pw@rabbitmq:5672/relay"


def _app(broker: str, **env: str) -> tuple[Settings, Celery]:
    settings = Settings.from_env({"RELAY_REDIS_URL": REDIS, "RELAY_BROKER_URL": broker, **env})
    return settings, build_celery("t", settings, broker)


@pytest.mark.parametrize(
    ("url", "amqp"),
    [
        (RABBIT, True),
        ("amqps://h/v", True),
        ("AMQP://h", True),
        (REDIS, False),
        ("unix:///s", False),
    ],
)
def test_which_urls_are_rabbitmq(url: str, amqp: bool) -> None:
    assert is_amqp(url) is amqp


def test_on_redis_the_queues_are_plain_and_the_visibility_timeout_outlasts_any_task() -> None:
    settings, app = _app(REDIS)
    conf = app.conf
    assert [q.name for q in conf.task_queues] == [
        "relay:advance",
        "relay:model",
        "relay:tools",
        "relay:tick",
    ]
    assert all(q.queue_arguments is None for q in conf.task_queues)
    timeout = conf.broker_transport_options["visibility_timeout"]
    assert timeout == visibility_timeout(settings)
    assert timeout > settings.model_deadline
    assert timeout > settings.tool_timeout
    assert conf.task_default_exchange_type == "direct"  # as before: nothing changes on Redis


def test_on_rabbitmq_the_queues_are_durable_quorum_queues_on_one_topic_exchange() -> None:
    settings, app = _app(RABBIT, RELAY_PREFIX="team-a")
    conf = app.conf
    queues = {q.name: q for q in conf.task_queues}
    assert list(queues) == ["team-a:advance", "team-a:model", "team-a:tools", "team-a:tick"]
    for name, queue in queues.items():
        assert queue.durable
        assert queue.queue_arguments == {"x-queue-type": "quorum"}
        assert (queue.exchange.name, queue.exchange.type) == ("team-a:tasks", "topic")
        assert queue.routing_key == name  # each queue its own: a tick never lands among tools
        # Unacknowledged for longer than any task can run: the same figure as Redis's.
        assert queue.consumer_arguments == {
            "x-consumer-timeout": visibility_timeout(settings) * 1000
        }
    assert "visibility_timeout" not in conf.broker_transport_options  # a Redis notion
    assert conf.task_default_delivery_mode == "persistent"
    assert conf.task_default_queue == "team-a:advance"
    assert conf.worker_prefetch_multiplier == 1
    assert conf.task_acks_late
    assert conf.task_reject_on_worker_lost
    assert conf.task_routes["relay.tick"] == {"queue": "team-a:tick"}


def test_classic_queues_for_a_rabbitmq_without_quorum_queues() -> None:
    _, app = _app(RABBIT, RELAY_QUEUE_TYPE="classic")
    conf = app.conf
    assert all(q.queue_arguments is None and q.durable for q in conf.task_queues)
    assert conf.task_default_queue_type == "classic"


def test_amqps_checks_the_certificate_and_that_it_names_the_host() -> None:
    _, app = _app("amqps://relay:pw@mq.example.com/relay")
    tls = app.conf.broker_use_ssl
    assert tls == {"server_hostname": None, "cert_reqs": ssl.CERT_REQUIRED}  # None: the URL's host
    _, plain = _app(RABBIT)
    assert not plain.conf.broker_use_ssl


@pytest.mark.parametrize(
    ("given", "read"),
    [
        ("redis://127.0.0.1:6379/0?password=sekret", "redis://:sekret@127.0.0.1:6379/0"),
        ("redis://h/0?password=a%40b&socket_timeout=3", "redis://:a%40b@h/0?socket_timeout=3"),
        ("redis://u:old@h/0?password=new", "redis://u:new@h/0"),
        ("rediss://h/0?username=bob&password=pw", "rediss://bob:pw@h/0"),
        ("redis://:pw@h/0", "redis://:pw@h/0"),
        ("amqp://guest:guest@h//", "amqp://guest:guest@h//"),
    ],
)
def test_a_password_in_the_query_string_goes_where_kombu_looks(given: str, read: str) -> None:
    assert kombu_url(given) == read


def test_every_thread_of_a_process_shares_one_result_backend() -> None:
    """Relay keeps no results, so its (disabled) backend is shared: a thread's first
    message (a carried call's thread publishing a step) does not look its class up in
    every installed package's entry points again (3-5 ms of CPU a thread)."""
    _, app = _app(REDIS)
    seen: list[object] = []
    threads = [threading.Thread(target=lambda: seen.append(app.backend)) for _ in range(3)]
    for thread in threads:
        thread.start()
        thread.join(10)
    assert len(seen) == 3
    assert all(backend is app.backend for backend in seen)
