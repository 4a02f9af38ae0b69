"""The broker: Redis (the default) or RabbitMQ, and how Relay's queues are declared on each.

Either way the broker only moves wake-up messages; run state, leases, the outbox
and the tick live in Redis, so recovery is the same on both: a message lost or
delivered twice changes nothing, and the tick sends again what was never done.

On Redis, a delivered message that is not acknowledged comes back after the
visibility timeout, which is kept longer than any task.

On RabbitMQ (`RELAY_BROKER_URL=amqp://...` or `amqps://`):
- the queues are durable, quorum queues unless `RELAY_QUEUE_TYPE=classic` (for a
  server without them: RabbitMQ before 3.8, or some hosted brokers); messages are
  persistent;
- they are bound to one topic exchange per app (`<prefix>tasks`), each by its own
  name, so Celery's native delayed delivery can carry a countdown on quorum
  queues (a direct exchange would make the worker hold the message until then);
- an unacknowledged message comes back as soon as its worker's connection closes
  (a dead worker), not after a timeout; a live worker may keep one for as long as
  the visibility timeout above (`x-consumer-timeout`, RabbitMQ 3.12 and later;
  older servers apply their own `consumer_timeout`, 30 minutes by default);
- quorum queues have no channel-wide prefetch: prefetch 1 holds per queue a
  worker consumes;
- `amqps://` checks the server's certificate and that it names the host.
"""

from __future__ import annotations

import ssl
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit, urlunsplit

from amqp.exceptions import AccessRefused, AMQPError, NotAllowed, PreconditionFailed
from celery import Celery
from kombu import Exchange, Queue
from kombu.exceptions import OperationalError

from workers.errors import SettingsError

__all__ = [
    "AMQP_SCHEMES",
    "MIN_QUORUM_VERSION",
    "broker_conf",
    "check_broker",
    "is_amqp",
    "kombu_url",
]

AMQP_SCHEMES = ("amqp", "amqps")
MIN_QUORUM_VERSION = (3, 8)
"""Quorum queues came with RabbitMQ 3.8."""


def is_amqp(url: str) -> bool:
    """Whether `url` names a RabbitMQ broker (rather than Redis)."""
    return urlsplit(url).scheme.lower() in AMQP_SCHEMES


def kombu_url(url: str) -> str:
    """`url` as kombu reads it: a `username` or `password` in the query string (which
    redis-py takes) moved into the URL's user part, where kombu looks. kombu would
    otherwise see the password twice and fail with a traceback at the worker's start."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    given = {name: value for name, value in query if name in ("username", "password")}
    if not given or parts.scheme.lower() not in ("redis", "rediss"):
        return url
    if "@" in parts.netloc:
        user, _, password = parts.netloc.rpartition("@")[0].partition(":")
    else:
        user, password = "", ""
    user = quote(given.get("username", unquote(user)), safe="")
    password = quote(given.get("password", unquote(password)), safe="")
    where = parts.netloc.rpartition("@")[2]
    rest = urlencode([(name, value) for name, value in query if name not in given])
    netloc = f"{user}:{password}@{where}" if password else f"{user}@{where}"
    return urlunsplit((parts.scheme, netloc, parts.path, rest, parts.fragment))


def broker_conf(
    url: str, names: list[str], *, prefix: str, queue_type: str, visibility_timeout_s: int
) -> dict[str, Any]:
    """Return the Celery settings that declare queues `names` on the broker at `url`.

    The first name is the default queue.
    """
    if not is_amqp(url):
        return {
            "task_queues": [Queue(name) for name in names],
            "broker_transport_options": {"visibility_timeout": visibility_timeout_s},
        }
    exchange = Exchange(f"{prefix}tasks", type="topic", durable=True)
    arguments = {"x-queue-type": "quorum"} if queue_type == "quorum" else None
    consumer = {"x-consumer-timeout": visibility_timeout_s * 1000}
    conf: dict[str, Any] = {
        "task_queues": [
            Queue(
                name,
                exchange,
                routing_key=name,
                durable=True,
                queue_arguments=arguments,
                consumer_arguments=consumer,
            )
            for name in names
        ],
        "broker_transport_options": {},
        "task_default_exchange": exchange.name,
        "task_default_exchange_type": "topic",
        "task_default_routing_key": names[0],
        "task_default_delivery_mode": "persistent",
        "task_default_queue_type": queue_type,
        "task_create_missing_queue_type": queue_type,
        "task_create_missing_queue_exchange_type": "topic",
        "broker_native_delayed_delivery_queue_type": queue_type,
        "worker_detect_quorum_queues": True,
    }
    if urlsplit(url).scheme.lower() == "amqps":
        # kombu fills in the URL's host name, and the certificate must name it.
        conf["broker_use_ssl"] = {"server_hostname": None, "cert_reqs": ssl.CERT_REQUIRED}
    return conf


def check_broker(app: Celery, names: list[str], queue_type: str) -> str | None:
    """Declare the queues `names` of `app` on RabbitMQ; return a line saying what it found.

    Returns None for a Redis broker, or a RabbitMQ that cannot be reached now
    (the worker keeps trying, as Celery does). Raises SettingsError, one line
    naming the variable to change, for what retrying cannot mend: credentials or
    a vhost the broker refuses, a server too old for quorum queues, or a queue
    that already exists with other arguments (say, of the other type).
    """
    if not is_amqp(str(app.conf.broker_url)):
        return None
    with app.connection_for_write() as connection:
        try:
            connection.ensure_connection(max_retries=1, interval_start=0)
        except (AccessRefused, NotAllowed) as error:
            refused = _said(error)
            raise SettingsError(f"RELAY_BROKER_URL: the broker refused it: {refused}") from None
        except (OSError, AMQPError, OperationalError):
            return None
        server = connection.connection.server_properties
        version = str(server.get("version", "?"))
        if queue_type == "quorum" and _version(version) < MIN_QUORUM_VERSION:
            raise SettingsError(
                f"RELAY_QUEUE_TYPE: RabbitMQ {version} has no quorum queues"
                " (3.8 and later do): set RELAY_QUEUE_TYPE=classic"
            )
        channel = connection.channel()
        for name in names:
            queue = app.amqp.queues[name]
            try:
                queue.bind(channel).declare()
            except PreconditionFailed as error:
                raise SettingsError(
                    f"RELAY_QUEUE_TYPE: queue {name} already exists on the broker with"
                    f" other arguments ({_said(error)}): set RELAY_QUEUE_TYPE to its type,"
                    " or delete the queue once it is empty"
                ) from None
            except AccessRefused as error:
                raise SettingsError(
                    f"RELAY_BROKER_URL: may not declare queue {name}: {_said(error)}"
                ) from None
    return f"{server.get('product', 'broker')} {version}, {queue_type} queues"


def _said(error: AMQPError) -> str:
    """The server's words in an AMQP error, without the method and code in front."""
    text = str(getattr(error, "reply_text", "") or error)
    return text.split(" - ", 1)[-1]


def _version(text: str) -> tuple[int, ...]:
    numbers = []
    for part in text.split(".")[:2]:
        digits = "".join(char for char in part if char.isdigit())
        numbers.append(int(digits or 0))
    return tuple(numbers)
