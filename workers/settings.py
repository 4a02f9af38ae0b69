"""Relay's settings, read once from `RELAY_*` environment variables into one frozen value.

    RELAY_REDIS_URL              redis://, rediss:// or unix:// URL; unset: the CLI
                                 starts an embedded Redis; redis+cluster:// (or
                                 rediss+cluster://) for Redis Cluster, any one node
    RELAY_REDIS_CLUSTER          1: the Redis URL is a node of a Redis Cluster (0); a
                                 cluster holds run state only: set RELAY_BROKER_URL
    RELAY_BROKER_URL             Celery's broker; default: the Redis URL (a unix://
                                 URL becomes kombu's redis+socket://); amqp:// or
                                 amqps:// for RabbitMQ (see workers.celery_app.brokers)
    RELAY_QUEUE_TYPE             RabbitMQ's queue type: quorum (default) or classic
    RELAY_MODEL_URL              OpenAI-compatible base URL (http://localhost:11434/v1)
                                 or its /chat/completions URL; unset: the demo model
    RELAY_MODEL                  model name sent with each call (default "default")
    RELAY_MODEL_KEY              bearer key (optional)
    RELAY_APP                    module:attr of the Relay object (optional)
    RELAY_PREFIX                 Redis key prefix (default "relay:"; ":" is added if missing)
    RELAY_MODEL_CONNECT_TIMEOUT  seconds (5)
    RELAY_MODEL_TIMEOUT          seconds without a byte from the model server (120)
    RELAY_MODEL_RETRIES          retries of a transient model failure (4)
    RELAY_MODEL_DEADLINE         seconds a whole model call may take, retries and all (600)
    RELAY_MODEL_MAX_TOKENS       a reply's cap in tokens, sent as max_tokens; 0 = none (4096)
    RELAY_PRICES                 a JSON or TOML file of prices per model (optional)
    RELAY_MODELS                 a JSON or TOML file of model routes (optional)
    RELAY_MCP                    a JSON or TOML file of MCP servers (optional)
    RELAY_MCP_TOKEN              `relay mcp --http`'s bearer token: a random secret,
                                 checked when that server starts (workers.fleet_mcp.tokens)
    RELAY_MCP_CLIENTS            a JSON or TOML file of `relay mcp --http` clients: each
                                 a name, a token and the apps (and keys) it may see
    RELAY_KEY_CONCURRENCY        each key's model calls in flight, fleet-wide; 0 = no cap (0)
    RELAY_TOOL_TIMEOUT           seconds a tool may run (300)
    RELAY_TOOL_OUTPUT_CHARS      a tool's output is cut to this (20000)
    RELAY_RECOVERY_SECONDS       how soon a dead worker's call is picked up again (15):
                                 its lease lapses, the next tick sends it again, and a
                                 live worker takes it (lease + tick + 2 s at most)
    RELAY_HELD_OUTCOMES          outcomes a worker process holds through a Redis outage
                                 for as long as it lasts (1000); one more is held up to
                                 RELAY_RECOVERY_SECONDS, then given up
    RELAY_APPROVAL_TTL           seconds an approval waits before it is declined;
                                 0 = never (7 days)
    RELAY_RETENTION              seconds a finished run is kept (7 days)
    RELAY_TICK_SECONDS           how often the fleet ticks: one tick per interval, run
                                 by whichever worker gets there first (5, or less: at
                                 most half of RELAY_RECOVERY_SECONDS less a second)
    RELAY_DURABLE_CLAIMS         1: a claim of a call that is not idempotent waits until
                                 Redis has it on disk or on a replica (0)
    RELAY_EVENTS                 Celery task events for Flower: 1 or 0 (1)
    RELAY_INLINE_MS              a worker continues a run's next step in the same task
                                 (no broker hop) for up to this many ms; 0 = off (250)
    RELAY_MODEL_CARRIED          model calls a worker process holds on its event loop
                                 past their tasks (the task claims the call and ends;
                                 no thread per call); 0 = each call holds its task's
                                 slot (1000)
    RELAY_METRICS_FLUSH_MS       a worker process writes its tasks' counters at most
                                 this many ms after they end, all in one round trip;
                                 0 = each task writes its own (500)

A variable that is unset or blank takes its default; surrounding spaces are
ignored. A bad value raises `SettingsError` with one line naming the variable.
Passwords in URLs, secret query values (`?api-key=...`, see `workers.redact`) and
the key never appear in `repr`, `str`, `redacted()` or errors. `ModelSettings` is
what one model client needs: the endpoint RELAY_MODEL_URL names, or a route's.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar
from urllib.parse import urlsplit, urlunsplit

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    model_validator,
)

from workers.errors import SettingsError
from workers.redact import redact_url

__all__ = [
    "ModelProtocol",
    "ModelSettings",
    "RecoveryParts",
    "Settings",
    "SettingsError",
    "Timing",
    "chat_completions_url",
    "check_api_key",
    "now_ms",
    "recovery_parts",
    "redact_url",
]

_DAY = 24 * 60 * 60.0
_DECIMAL = re.compile(r"[0-9]+(\.[0-9]*)?|\.[0-9]+")
_INTEGER = re.compile(r"[0-9]+")
_URL_FIELDS = ("redis_url", "broker_url", "model_url")


# --- a model endpoint: its URL, key, timeouts and limits ------------------------------

_CHAT_PATH = "/chat/completions"
_API_KEY = re.compile(r"[\x21-\x7e]+")  # what an HTTP header value can carry as is


def chat_completions_url(url: str) -> str:
    """Return the chat completions endpoint for an OpenAI-compatible `url`.

    A base URL (`http://localhost:11434/v1`) gets `/chat/completions` added; a
    URL that already ends with it is kept. The result is the same if applied twice.
    Raises ValueError (without echoing the URL) for anything but an http(s) URL
    with a host, and for a URL that carries credentials: the key goes in its own
    setting, so it can be kept out of logs.
    """
    expected = "expected an http:// or https:// URL such as http://localhost:11434/v1"
    if not url or any(char.isspace() for char in url):
        raise ValueError(expected)
    try:
        parts = urlsplit(url)
        _ = parts.port  # raises ValueError for a port that is not a number
    except ValueError:
        raise ValueError(expected) from None
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname or parts.fragment:
        raise ValueError(expected)
    if "@" in parts.netloc:
        raise ValueError("expected no credentials in the URL (set the key on its own)")
    path = parts.path.rstrip("/")
    if not path.endswith(_CHAT_PATH):
        path += _CHAT_PATH
    return urlunsplit((parts.scheme.lower(), parts.netloc, path, parts.query, ""))


def check_api_key(key: str) -> str:
    """Return `key` if it can be sent as a bearer token; raise ValueError (not naming it)."""
    if not _API_KEY.fullmatch(key):
        raise ValueError("expected printable ASCII without spaces")
    return key


def _bearer_token(value: object) -> SecretStr | None:
    # Held to the token rule only by `relay mcp`, the server it guards
    # (workers.fleet_mcp.tokens): a weak one left in a shared environment must not stop
    # workers and commands that never read it.
    if value is None or isinstance(value, SecretStr):
        return value
    if not isinstance(value, str):
        raise ValueError("expected a token")
    return SecretStr(value)


def _check_secret_key(key: SecretStr | None) -> SecretStr | None:
    if key is not None:
        check_api_key(key.get_secret_value())
    return key


ModelProtocol = Literal["text", "json", "tools"]
"""How a model server is asked for the agent's reply object (`workers.model.protocols`):
in the text alone, held to a JSON schema as well, or as native function calls."""


class ModelSettings(BaseModel):
    """What one model client needs: where, which model, the key, timeouts and limits."""

    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)

    url: Annotated[str, AfterValidator(chat_completions_url)]
    """The chat completions endpoint; a base URL is completed on validation."""
    model: str = Field(default="default", min_length=1)
    key: Annotated[SecretStr | None, AfterValidator(_check_secret_key)] = None
    connect_timeout: float = Field(default=5.0, gt=0, allow_inf_nan=False)
    read_timeout: float = Field(default=120.0, gt=0, allow_inf_nan=False)
    """Seconds without a byte from the server before the attempt is given up."""
    retries: int = Field(default=4, ge=0, le=100)
    """Attempts after the first one, for transient failures only."""
    deadline: float = Field(default=600.0, gt=0, allow_inf_nan=False)
    """Seconds the whole call may take: every attempt, its reads, the waits between them."""
    backoff_base: float = Field(default=0.5, gt=0, allow_inf_nan=False)
    backoff_cap: float = Field(default=30.0, gt=0, allow_inf_nan=False)
    """No wait between attempts is longer, whatever a server's Retry-After says."""
    max_tokens: int = Field(default=4096, ge=0, le=10**7)
    """The reply's cap in tokens, sent as `max_tokens` (0: not sent): it bounds what a
    call can cost, so budgets hold exactly."""
    max_body_bytes: int = Field(default=8 * 1024 * 1024, gt=0)
    attachment_chars: int = Field(default=20_000, gt=0)
    """A text attachment is cut to this many characters."""
    protocol: ModelProtocol = "text"
    """How the reply object is asked for (`ModelRoute.protocol`)."""


# --- the settings ----------------------------------------------------------------------


def now_ms() -> int:
    """The wall clock, in milliseconds since the epoch: the one clock of the runtime."""
    return time.time_ns() // 1_000_000


# --- parsers: each takes a value from the environment (a str) or from code -------


def _number(value: object, pattern: re.Pattern[str]) -> float | None:
    """Return `value` as a finite number if it is one (a bool is not), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        if not pattern.fullmatch(value.strip()):
            return None
    elif not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def _seconds(value: object) -> float:
    number = _number(value, _DECIMAL)
    if number is None or number <= 0:
        raise ValueError("expected a number of seconds > 0")
    return number


def _seconds_or_never(value: object) -> float | None:
    if value is None:
        return None
    number = _number(value, _DECIMAL)
    if number is None or number < 0:
        raise ValueError("expected a number of seconds >= 0 (0 = never)")
    return number or None


_FLAGS = {
    "1": True,
    "true": True,
    "yes": True,
    "on": True,
    "0": False,
    "false": False,
    "no": False,
    "off": False,
}


def _flag(value: object) -> bool:
    if isinstance(value, bool):
        return value
    flag = _FLAGS.get(str(value).strip().lower())
    if flag is None:
        raise ValueError("expected 1 or 0 (true/false, yes/no, on/off)")
    return flag


def _count(minimum: int) -> Callable[[object], int]:
    def parse(value: object) -> int:
        if isinstance(value, float) and not value.is_integer():
            value = None  # 4.5 retries is not a count
        number = _number(value, _INTEGER)
        if number is None or number < minimum or number > 2**53:
            raise ValueError(f"expected a whole number >= {minimum}")
        return int(number)

    return parse


def _url(schemes: tuple[str, ...]) -> Callable[[object], str | None]:
    names = [f"{scheme}://" for scheme in schemes]
    expected = f"expected a {', '.join(names[:-1])} or {names[-1]} URL"

    def parse(value: object) -> str | None:
        if value is None:
            return None
        if not isinstance(value, str) or any(char.isspace() for char in value):
            raise ValueError(expected)
        try:
            parts = urlsplit(value)
            _ = parts.port  # raises ValueError for a port that is not a number
        except ValueError:
            raise ValueError(expected) from None
        scheme = parts.scheme.lower()
        socket = scheme in ("unix", "redis+socket")
        if scheme not in schemes or not (parts.path if socket else parts.hostname):
            raise ValueError(expected)
        if scheme == "unix" and "redis+socket" in schemes:
            # kombu spells a socket URL its own way; redis-py's would not load.
            return "redis+socket" + value[len("unix") :]
        return value

    return parse


def _queue_type(value: object) -> str:
    kind = str(value).strip().lower()
    if kind not in ("quorum", "classic"):
        raise ValueError("expected quorum or classic")
    return kind


def _model_url(value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValueError("expected a URL")
    return chat_completions_url(value)


def _model_name(value: object) -> str:
    if not isinstance(value, str) or not value.strip() or not value.isprintable():
        raise ValueError("expected a model name")
    return value.strip()


def _key(value: object) -> SecretStr | None:
    if value is None:
        return None
    if isinstance(value, SecretStr):
        value = value.get_secret_value()
    if not isinstance(value, str):
        raise ValueError("expected a key")
    return SecretStr(check_api_key(value))


def _app(value: object) -> str | None:
    if value is None:
        return None
    expected = "expected module:attribute, like mymodule:relay"
    if not isinstance(value, str):
        raise ValueError(expected)
    module, colon, attribute = value.partition(":")
    names = module.split(".") + attribute.split(".")
    if not colon or not all(name.isidentifier() for name in names):
        raise ValueError(expected)
    return value


def _path(value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ValueError("expected a file path")
    return value


def _prefix(value: object) -> str:
    if not isinstance(value, str) or not value or not value.isprintable():
        raise ValueError("expected a non-empty prefix")
    if any(char.isspace() or char in "*?[]\\" for char in value):
        # Spaces break the CLI's output; glob characters break SCAN MATCH patterns.
        raise ValueError("expected a prefix without spaces or any of * ? [ ] \\")
    return value if value.endswith(":") else value + ":"


_Seconds = Annotated[float, BeforeValidator(_seconds)]
_RedisUrl = Annotated[
    str | None,
    BeforeValidator(_url(("redis", "rediss", "unix", "redis+cluster", "rediss+cluster"))),
]
_BrokerUrl = Annotated[
    str | None,
    BeforeValidator(_url(("redis", "rediss", "redis+socket", "unix", "amqp", "amqps"))),
]


class Settings(BaseModel):
    """Everything Relay's runtime reads from the environment; build it with `from_env`."""

    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)

    redis_url: _RedisUrl = None
    redis_cluster: Annotated[bool, BeforeValidator(_flag)] = False
    """Run state on Redis Cluster (also said by a redis+cluster:// URL; workers.store.cluster)."""
    broker_url: _BrokerUrl = None
    queue_type: Annotated[Literal["quorum", "classic"], BeforeValidator(_queue_type)] = "quorum"
    """On RabbitMQ: quorum queues, or classic ones for a server without them."""
    model_url: Annotated[str | None, BeforeValidator(_model_url)] = None
    """The chat completions endpoint (a base URL is completed); None: the demo model."""
    model: Annotated[str, BeforeValidator(_model_name)] = "default"
    model_key: Annotated[SecretStr | None, BeforeValidator(_key)] = None
    app: Annotated[str | None, BeforeValidator(_app)] = None
    prefix: Annotated[str, BeforeValidator(_prefix)] = "relay:"
    model_connect_timeout: _Seconds = 5.0
    model_timeout: _Seconds = 120.0
    model_retries: Annotated[int, BeforeValidator(_count(0))] = 4
    model_deadline: _Seconds = 600.0
    """Seconds one model call may take, every attempt and wait included."""
    model_max_tokens: Annotated[int, BeforeValidator(_count(0))] = 4096
    """The reply's cap in tokens (0: none): what admission reserves for a reply."""
    models: Annotated[str | None, BeforeValidator(_path)] = None
    """A JSON or TOML file of model routes (RELAY_MODELS), for apps that give none."""
    mcp: Annotated[str | None, BeforeValidator(_path)] = None
    """A JSON or TOML file of MCP servers (RELAY_MCP), for apps that give none."""
    mcp_token: Annotated[SecretStr | None, BeforeValidator(_bearer_token)] = None
    """`relay mcp --http`'s one bearer token (RELAY_MCP_TOKEN): its client sees the app's runs."""
    mcp_clients: Annotated[str | None, BeforeValidator(_path)] = None
    """A JSON or TOML file of `relay mcp --http` clients (RELAY_MCP_CLIENTS), each with its
    token and the apps and keys whose runs it sees (`workers.fleet_mcp.access`)."""
    key_concurrency: Annotated[int, BeforeValidator(_count(0))] = 0
    """Each key's model calls in flight at once, across the fleet (0: no cap), for apps
    that set none (`Relay(key_concurrency=...)`)."""
    prices: Annotated[str | None, BeforeValidator(_path)] = None
    """A JSON or TOML file of prices per model (RELAY_PRICES), for apps that set none."""
    tool_timeout: _Seconds = 300.0
    tool_output_chars: Annotated[int, BeforeValidator(_count(1))] = 20_000
    recovery_seconds: _Seconds = 15.0
    held_outcomes: Annotated[int, BeforeValidator(_count(0))] = 1000
    """Finished calls' outcomes a worker process holds unsaved through a Redis outage for
    as long as it lasts (memory's bound); more are held up to `recovery_seconds` each
    (`workers.runtime.leases.save_holding`)."""
    approval_ttl: Annotated[float | None, BeforeValidator(_seconds_or_never)] = 7 * _DAY
    """None: approvals never expire."""
    retention: _Seconds = 7 * _DAY
    tick_seconds: _Seconds = 5.0
    """How often the fleet ticks (schedules, expiries, healing), whoever runs it."""
    durable_claims: Annotated[bool, BeforeValidator(_flag)] = False
    """Make each claim of a non-idempotent call durable before the call runs."""
    events: Annotated[bool, BeforeValidator(_flag)] = True
    """Celery task events, which Flower shows; off saves four Redis round trips per task."""
    inline_ms: Annotated[int, BeforeValidator(_count(0))] = 250
    """How long a task may go on with its run's next step in place of publishing it (the
    slice, from the task's start); 0: every step is published (`workers.runtime.continuation`)."""
    model_carried: Annotated[int, BeforeValidator(_count(0))] = 1000
    """Model calls a worker process holds on its event loop past their tasks at once (0:
    none; each call holds its task's pool slot; `workers.runtime.on_loop`)."""
    metrics_flush_ms: Annotated[int, BeforeValidator(_count(0))] = 500
    """How long a worker process holds its tasks' counters before it writes them (0: each
    task writes its own; `workers.runtime.metrics`)."""

    @model_validator(mode="before")
    @classmethod
    def _broker_defaults_to_redis(cls, data: Any) -> Any:
        if not isinstance(data, dict) or data.get("broker_url") is not None:
            return data
        url = data.get("redis_url")
        flag = data.get("redis_cluster")
        clustered = flag is True or _FLAGS.get(str(flag).strip().lower()) is True
        if url and (clustered or "+cluster:" in str(url)):
            # Celery's Redis transport cannot use a cluster (its messages go through
            # keys of every slot): run state may live there, messages may not.
            raise ValueError(
                "RELAY_BROKER_URL: not set, and a Redis Cluster (RELAY_REDIS_URL) holds run"
                " state only: set a broker (amqp://... for RabbitMQ, or a plain redis://)"
            )
        if url:
            return {**data, "broker_url": url}
        return data

    @model_validator(mode="after")
    def _tick_fits_the_recovery_time(self) -> Settings:
        if "tick_seconds" in self.model_fields_set:
            longest = longest_tick_s(self.recovery_seconds)
            if self.tick_seconds > longest:
                raise ValueError(
                    f"RELAY_TICK_SECONDS: at most {longest:g} s with RELAY_RECOVERY_SECONDS"
                    f"={self.recovery_seconds:g} (a dead worker's call is sent again by a tick"
                    f" once its lease lapsed), got {self.tick_seconds:g}"
                )
        return self

    @property
    def tick_interval(self) -> float:
        """Seconds between the fleet's ticks: RELAY_TICK_SECONDS, or if it is unset, 5 s
        or less, as the recovery time needs (`longest_tick_s`); never under 0.1 s."""
        tick = self.tick_seconds
        if "tick_seconds" not in self.model_fields_set:
            tick = min(tick, longest_tick_s(self.recovery_seconds))
        return max(tick, SHORTEST_TICK_S)

    @property
    def cluster(self) -> bool:
        """Run state is on Redis Cluster."""
        return self.redis_cluster or "+cluster:" in (self.redis_url or "")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Return the settings in `environ` (default: `os.environ`).

        Raises SettingsError, one line naming the first bad variable and (with any
        password masked, and never for the key) the value it had.
        """
        env = os.environ if environ is None else environ
        given = {
            field: env[variable].strip()
            for field, variable in _VARIABLES.items()
            if env.get(variable, "").strip()
        }
        try:
            return cls.model_validate(given)
        except ValidationError as error:
            raise SettingsError(_describe(error, given)) from None

    def model_settings(self) -> ModelSettings:
        """Return what the model client needs; raise SettingsError if RELAY_MODEL_URL is unset."""
        if self.model_url is None:
            raise SettingsError("RELAY_MODEL_URL: not set (the demo model needs no client)")
        return ModelSettings(
            url=self.model_url,
            model=self.model,
            key=self.model_key,
            connect_timeout=self.model_connect_timeout,
            read_timeout=self.model_timeout,
            retries=self.model_retries,
            deadline=self.model_deadline,
            max_tokens=self.model_max_tokens,
        )

    @property
    def timing(self) -> Timing:
        """The time spans the runtime works with (leases, grace, expiry, retention)."""
        return Timing.of(self)

    def redacted(self) -> dict[str, Any]:
        """Return every setting by field name, safe to log: URL passwords and the key masked."""
        values = self.model_dump()
        for name in _URL_FIELDS:
            if values[name] is not None:
                values[name] = redact_url(values[name])
        for name in _SECRET_FIELDS:
            values[name] = None if getattr(self, name) is None else "***"
        return values

    def __repr_args__(self) -> Iterable[tuple[str | None, Any]]:
        # pydantic builds both repr() and str() from this.
        return self.redacted().items()


_VARIABLES = {field: "RELAY_" + field.upper() for field in Settings.model_fields}
_SECRET_FIELDS = ("model_key", "mcp_token")


SHORTEST_TICK_S = 0.1
"""Ticks come no closer together than this, whatever RELAY_TICK_SECONDS says."""
RECOVERY_MARGIN_MS = 2_000
"""What the recovery time keeps, after the lease and a tick interval, for a re-sent call
to be taken: the tick's jitter (`runtime.tick.JITTER_S`) and lateness on a busy machine,
its work before it sends, the broker's delivery, a worker's claim. With a worker killed
every 5 to 10 s, `bench.recovery` saw at most 0.06 s of it on two busy cores; issue 52's
harness at least 1.53 s once (15.53 s with a 9 s lease and a 5 s tick), when a second was
kept. Two hold that; a second more comes out of the lease (renewed every third of it)."""


def recovery_margin_ms(recovery_s: float) -> int:
    """The part of the recovery time kept for a re-sent call to be taken: two seconds, or
    a fifth of it if less."""
    return min(RECOVERY_MARGIN_MS, int(recovery_s * 1000) // 5)


def longest_tick_s(recovery_s: float) -> float:
    """The longest tick interval that keeps a dead worker's call within `recovery_s`: the
    lease (never under half the recovery time), a tick interval and the margin fit in it."""
    return (int(recovery_s * 1000) // 2 - recovery_margin_ms(recovery_s)) / 1000


@dataclass(frozen=True)
class RecoveryParts:
    """How a dead worker's call is picked up within the recovery time, part by part."""

    lease_s: float
    """The lease lapses this long after its last renewal at most."""
    tick_s: float
    """The first tick after that sends the call again, at most an interval later."""
    allowance_s: float
    """What is left for the re-sent call to be taken (`recovery_margin_ms`)."""

    @property
    def bound_s(self) -> float:
        """The worst case: lease + tick interval + allowance, the recovery time."""
        return round(self.lease_s + self.tick_s + self.allowance_s, 3)


def recovery_parts(settings: Settings) -> RecoveryParts:
    """The parts of the recovery time as `settings` make them (`Timing.of`)."""
    return RecoveryParts(
        lease_s=Timing.of(settings).lease_ms / 1000,
        tick_s=settings.tick_interval,
        allowance_s=recovery_margin_ms(settings.recovery_seconds) / 1000,
    )


@dataclass(frozen=True)
class Timing:
    """The runtime's time spans, derived from the settings (`Settings.timing`)."""

    lease_ms: int
    """How long a call's claim lasts unless renewed (every third of it, while it runs)."""
    grace_ms: int
    """How long a message may go unhandled before the tick sends it again."""
    approval_ttl_ms: int | None
    retention_s: int

    @classmethod
    def of(cls, settings: Settings) -> Timing:
        # A dead worker's call is sent again by the first tick after its lease
        # lapses, and taken by a live worker a moment later: at worst lease + one tick
        # interval + that moment (`recovery_margin_ms`), which is the recovery time. The
        # tick interval is at most `longest_tick_s`, so a lease is never under half of it.
        recovery_ms = int(settings.recovery_seconds * 1000)
        margin_ms = recovery_margin_ms(settings.recovery_seconds)
        lapse_ms = recovery_ms - int(settings.tick_interval * 1000) - margin_ms
        ttl = settings.approval_ttl
        return cls(
            lease_ms=max(lapse_ms, 200),
            grace_ms=max(lapse_ms, 1_000),
            approval_ttl_ms=None if ttl is None else int(ttl * 1000),
            retention_s=max(int(settings.retention), 1),
        )


def _describe(error: ValidationError, given: Mapping[str, str]) -> str:
    """Return one line for the first problem in `error`, naming the variable."""
    first = error.errors(include_url=False)[0]
    field = str(first["loc"][0]) if first["loc"] else ""
    cause = first.get("ctx", {}).get("error")
    reason = str(cause) if isinstance(cause, ValueError) else first["msg"]
    line = f"{_VARIABLES.get(field, field)}: {reason}" if field else reason
    value = given.get(field)
    if value is None or field in _SECRET_FIELDS:
        return line
    shown = redact_url(value) if field in _URL_FIELDS else value
    return f"{line}, got {shown!r}"


M = TypeVar("M", bound=BaseModel)


def load_entries(
    path: str | os.PathLike[str], model: type[M], *, variable: str, what: str
) -> tuple[M, ...]:
    """Read a JSON or TOML file of entries (`RELAY_MODELS`' routes, `RELAY_MCP`'s
    servers): a list of tables, or a table with the list under `what` + "s".

    Raises:
        SettingsError: the file cannot be read (nested too deeply, too), lists none, or
            an entry is not one (one line naming the variable, the file, the entry's
            number and its field).
    """
    where = Path(path)
    try:
        text = where.read_text(encoding="utf-8")
        data: Any = tomllib.loads(text) if where.suffix.lower() == ".toml" else json.loads(text)
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, ValueError) as error:
        raise SettingsError(f"{variable}: cannot read {where}: {error}") from error
    except RecursionError:  # json and tomllib parse nested tables by recursion
        raise SettingsError(f"{variable}: cannot read {where}: it is nested too deeply") from None
    listed = data.get(f"{what}s") if isinstance(data, dict) else data
    if not isinstance(listed, list) or not listed:
        raise SettingsError(f"{variable}: {where} lists no {what}s")
    entries = []
    for n, item in enumerate(listed, start=1):
        if not isinstance(item, dict):
            raise SettingsError(f"{variable}: {where}: {what} {n} is not a table of fields")
        try:
            entries.append(model.model_validate(item))
        except ValidationError as error:
            first = error.errors(include_url=False)[0]
            field = ".".join(str(p) for p in first["loc"]) or f"the {what}"
            problem = f"{what} {n}: {field}: {first['msg']}"
            raise SettingsError(f"{variable}: {where}: {problem}") from None
    return tuple(entries)
