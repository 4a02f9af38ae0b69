"""Settings: read from the environment once, strictly, with one-line errors and no secrets."""

from __future__ import annotations

import logging
import traceback

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from pydantic import SecretStr, ValidationError

from workers.settings import (
    ModelSettings,
    Settings,
    SettingsError,
    Timing,
    longest_tick_s,
    recovery_margin_ms,
    redact_url,
)

DAY = 24 * 60 * 60


def test_defaults_with_an_empty_environment() -> None:
    settings = Settings.from_env({})
    assert settings.redis_url is None
    assert settings.broker_url is None
    assert settings.queue_type == "quorum"
    assert settings.model_url is None
    assert settings.model == "default"
    assert settings.model_key is None
    assert settings.app is None
    assert settings.prefix == "relay:"
    assert settings.model_connect_timeout == 5
    assert settings.model_timeout == 120
    assert settings.model_retries == 4
    assert settings.model_deadline == 600
    assert settings.tool_timeout == 300
    assert settings.tool_output_chars == 20_000
    assert settings.recovery_seconds == 15
    assert settings.tick_seconds == 5
    assert settings.durable_claims is False
    assert settings.approval_ttl == 7 * DAY
    assert settings.retention == 7 * DAY
    assert settings == Settings()


def test_every_variable_is_read() -> None:
    settings = Settings.from_env(
        {
            "RELAY_REDIS_URL": "redis://localhost:6379/2",
            "RELAY_BROKER_URL": "redis://broker:6380/0",
            "RELAY_QUEUE_TYPE": "Classic",
            "RELAY_MODEL_URL": "https://api.example.com/v1",
            "RELAY_MODEL": "llama3:8b",
            "RELAY_MODEL_KEY": "sk-abc",
            "RELAY_APP": "notes.app:relay",
            "RELAY_PREFIX": "notes:",
            "RELAY_MODEL_CONNECT_TIMEOUT": "1.5",
            "RELAY_MODEL_TIMEOUT": "30",
            "RELAY_MODEL_RETRIES": "0",
            "RELAY_MODEL_DEADLINE": "90",
            "RELAY_TOOL_TIMEOUT": "60",
            "RELAY_TOOL_OUTPUT_CHARS": "500",
            "RELAY_RECOVERY_SECONDS": "2.5",
            "RELAY_TICK_SECONDS": "0.5",
            "RELAY_DURABLE_CLAIMS": "yes",
            "RELAY_APPROVAL_TTL": "3600",
            "RELAY_RETENTION": "86400",
            "UNRELATED": "ignored",
        }
    )
    assert settings.redis_url == "redis://localhost:6379/2"
    assert settings.broker_url == "redis://broker:6380/0"
    assert settings.queue_type == "classic"
    assert settings.model_url == "https://api.example.com/v1/chat/completions"
    assert settings.model == "llama3:8b"
    assert settings.model_key is not None
    assert settings.model_key.get_secret_value() == "sk-abc"
    assert settings.app == "notes.app:relay"
    assert settings.prefix == "notes:"
    assert (settings.model_connect_timeout, settings.model_timeout) == (1.5, 30)
    assert settings.model_retries == 0
    assert settings.model_deadline == 90
    assert (settings.tool_timeout, settings.tool_output_chars) == (60, 500)
    assert settings.recovery_seconds == 2.5
    assert settings.tick_seconds == 0.5
    assert settings.durable_claims is True
    assert (settings.approval_ttl, settings.retention) == (3600, 86400)


def test_from_env_reads_os_environ_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RELAY_MODEL", "from-os")
    monkeypatch.delenv("RELAY_MODEL_TIMEOUT", raising=False)
    assert Settings.from_env().model == "from-os"


@pytest.mark.parametrize("blank", ["", "   ", "\n"])
def test_a_blank_variable_takes_the_default(blank: str) -> None:
    settings = Settings.from_env({"RELAY_MODEL_TIMEOUT": blank, "RELAY_PREFIX": blank})
    assert (settings.model_timeout, settings.prefix) == (120, "relay:")


def test_surrounding_spaces_are_ignored() -> None:
    settings = Settings.from_env({"RELAY_MODEL_RETRIES": " 7\n", "RELAY_MODEL_KEY": "sk-k\n"})
    assert settings.model_retries == 7
    assert settings.model_key is not None
    assert settings.model_key.get_secret_value() == "sk-k"


def test_the_broker_defaults_to_the_redis_url() -> None:
    settings = Settings.from_env({"RELAY_REDIS_URL": "rediss://:pw@cache:6380/1"})
    assert settings.broker_url == "rediss://:pw@cache:6380/1"


@pytest.mark.parametrize(
    "url",
    [
        "amqp://relay:pw@rabbitmq:5672/relay",
        "amqp://guest:guest@127.0.0.1:5672//",
        "amqps://relay:pw@mq.example.com/relay%2Fteam",
        "AMQP://h",
    ],
)
def test_rabbitmq_is_a_broker(url: str) -> None:
    settings = Settings.from_env(
        {"RELAY_REDIS_URL": "redis://cache:6379/0", "RELAY_BROKER_URL": url}
    )
    assert settings.broker_url == url
    assert settings.redis_url == "redis://cache:6379/0"  # run state stays in Redis


def test_rabbitmq_is_no_run_store() -> None:
    with pytest.raises(SettingsError, match=r"^RELAY_REDIS_URL: expected a redis://"):
        Settings.from_env({"RELAY_REDIS_URL": "amqp://guest:guest@h//"})


def test_a_unix_socket_broker_is_spelled_the_kombu_way() -> None:
    settings = Settings.from_env({"RELAY_REDIS_URL": "unix:///run/redis.sock"})
    assert settings.redis_url == "unix:///run/redis.sock"
    assert settings.broker_url == "redis+socket:///run/redis.sock"


@pytest.mark.parametrize(
    ("given", "endpoint"),
    [
        ("http://localhost:11434/v1", "http://localhost:11434/v1/chat/completions"),
        ("http://localhost:11434/v1/", "http://localhost:11434/v1/chat/completions"),
        ("HTTPS://api.example.com/v1", "https://api.example.com/v1/chat/completions"),
        ("http://h/v1/chat/completions", "http://h/v1/chat/completions"),
        ("http://h/v1/chat/completions/", "http://h/v1/chat/completions"),
        ("http://h", "http://h/chat/completions"),
        (
            "http://h:8080/openai/v1?api-version=2",
            "http://h:8080/openai/v1/chat/completions?api-version=2",
        ),
    ],
)
def test_the_model_url_becomes_the_chat_completions_endpoint(given: str, endpoint: str) -> None:
    assert Settings.from_env({"RELAY_MODEL_URL": given}).model_url == endpoint


@pytest.mark.parametrize(
    ("given", "prefix"), [("relay:", "relay:"), ("team-a", "team-a:"), ("a:b", "a:b:")]
)
def test_the_prefix_ends_with_a_colon(given: str, prefix: str) -> None:
    assert Settings.from_env({"RELAY_PREFIX": given}).prefix == prefix


def test_an_approval_ttl_of_zero_means_never() -> None:
    assert Settings.from_env({"RELAY_APPROVAL_TTL": "0"}).approval_ttl is None


@pytest.mark.parametrize(
    ("variable", "value", "expected"),
    [
        ("RELAY_MODEL_TIMEOUT", "abc", "expected a number of seconds > 0, got 'abc'"),
        ("RELAY_MODEL_TIMEOUT", "0", "expected a number of seconds > 0, got '0'"),
        ("RELAY_MODEL_TIMEOUT", "-1", "expected a number of seconds > 0"),
        ("RELAY_MODEL_TIMEOUT", "inf", "expected a number of seconds > 0"),
        ("RELAY_MODEL_TIMEOUT", "nan", "expected a number of seconds > 0"),
        ("RELAY_MODEL_TIMEOUT", "1" * 400, "expected a number of seconds > 0"),
        ("RELAY_MODEL_TIMEOUT", "5s", "expected a number of seconds > 0, got '5s'"),
        ("RELAY_MODEL_CONNECT_TIMEOUT", "1_000", "expected a number of seconds > 0"),
        ("RELAY_MODEL_DEADLINE", "0", "expected a number of seconds > 0, got '0'"),
        ("RELAY_TOOL_TIMEOUT", "true", "expected a number of seconds > 0"),
        ("RELAY_RECOVERY_SECONDS", "1e3", "expected a number of seconds > 0"),
        ("RELAY_RETENTION", "0", "expected a number of seconds > 0"),
        ("RELAY_APPROVAL_TTL", "-5", "expected a number of seconds >= 0 (0 = never)"),
        ("RELAY_MODEL_RETRIES", "4.0", "expected a whole number >= 0, got '4.0'"),
        ("RELAY_MODEL_RETRIES", "-1", "expected a whole number >= 0"),
        ("RELAY_MODEL_RETRIES", "four", "expected a whole number >= 0"),
        ("RELAY_TOOL_OUTPUT_CHARS", "0", "expected a whole number >= 1, got '0'"),
        (
            "RELAY_REDIS_URL",
            "localhost:6379",
            "expected a redis://, rediss://, unix://, redis+cluster:// or rediss+cluster:// URL",
        ),
        (
            "RELAY_REDIS_URL",
            "http://localhost",
            "expected a redis://, rediss://, unix://, redis+cluster:// or rediss+cluster:// URL",
        ),
        (
            "RELAY_REDIS_URL",
            "redis://",
            "expected a redis://, rediss://, unix://, redis+cluster:// or rediss+cluster:// URL",
        ),
        (
            "RELAY_REDIS_URL",
            "redis://h:port/0",
            "expected a redis://, rediss://, unix://, redis+cluster:// or rediss+cluster:// URL",
        ),
        (
            "RELAY_REDIS_URL",
            "unix://",
            "expected a redis://, rediss://, unix://, redis+cluster:// or rediss+cluster:// URL",
        ),
        ("RELAY_BROKER_URL", "http://guest@h//", "unix://, amqp:// or amqps:// URL"),
        ("RELAY_BROKER_URL", "amqp://", "expected a redis://, rediss://, redis+socket://"),
        ("RELAY_BROKER_URL", "amqp://h:5672x/v", "unix://, amqp:// or amqps:// URL"),
        ("RELAY_QUEUE_TYPE", "stream", "expected quorum or classic, got 'stream'"),
        ("RELAY_MODEL_URL", "localhost:11434/v1", "expected an http:// or https:// URL"),
        ("RELAY_MODEL_URL", "ftp://h/v1", "expected an http:// or https:// URL"),
        ("RELAY_MODEL_URL", "http://h/v1#frag", "expected an http:// or https:// URL"),
        ("RELAY_MODEL_URL", "http://h/a b", "expected an http:// or https:// URL"),
        ("RELAY_MODEL_URL", "http://u:p@h/v1", "expected no credentials in the URL"),
        ("RELAY_MODEL", "a\x00b", "expected a model name"),
        ("RELAY_APP", "mymodule", "expected module:attribute, like mymodule:relay"),
        ("RELAY_APP", "my-module:app", "expected module:attribute"),
        ("RELAY_APP", "mod:", "expected module:attribute"),
        ("RELAY_PREFIX", "my app", "expected a prefix without spaces"),
        ("RELAY_PREFIX", "relay*", "expected a prefix without spaces or any of * ? [ ] \\"),
        ("RELAY_MODEL_KEY", "sk abc", "expected printable ASCII without spaces"),
        ("RELAY_MODEL_KEY", "sk-é", "expected printable ASCII without spaces"),
    ],
)
def test_a_bad_value_is_one_line_naming_the_variable(
    variable: str, value: str, expected: str
) -> None:
    with pytest.raises(SettingsError) as caught:
        Settings.from_env({variable: value})
    message = str(caught.value)
    assert message.startswith(f"{variable}: ")
    assert expected in message
    assert "\n" not in message
    assert isinstance(caught.value, ValueError)


def test_the_first_bad_variable_is_named() -> None:
    with pytest.raises(SettingsError, match=r"^RELAY_MODEL_TIMEOUT: "):
        Settings.from_env({"RELAY_MODEL_TIMEOUT": "x", "RELAY_RETENTION": "y"})


SECRET_ENV = {
    "RELAY_REDIS_URL": "redis://:hunter2-redis@cache:6379/0",
    "RELAY_BROKER_URL": "redis://relay:hunter2-broker@broker:6379/1",
    "RELAY_MODEL_URL": "https://api.example.com/v1",
    "RELAY_MODEL_KEY": "sk-hunter2-key",
}
SECRETS = ("hunter2-redis", "hunter2-broker", "sk-hunter2-key")


def test_secret_query_values_never_appear_in_redacted_or_errors() -> None:
    url = "https://api.example.com/v1?api-version=2024-02-01&api-key=hunter2-query"
    settings = Settings.from_env({"RELAY_MODEL_URL": url})
    assert settings.redacted()["model_url"] == (
        "https://api.example.com/v1/chat/completions?api-version=2024-02-01&api-key=***"
    )
    for text in (repr(settings), str(settings), str(settings.redacted())):
        assert "hunter2-query" not in text
    bad = url.replace("https://", "ftp://")  # (a variable: the traceback quotes this source)
    with pytest.raises(SettingsError) as caught:
        Settings.from_env({"RELAY_MODEL_URL": bad})
    assert "key=***" in str(caught.value)
    assert "hunter2-query" not in "".join(traceback.format_exception(caught.value))


def test_secrets_never_appear_in_repr_str_redacted_or_logs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings = Settings.from_env(SECRET_ENV)
    with caplog.at_level(logging.INFO):
        logging.getLogger("relay.test").info("settings: %s %r", settings, settings)
    shown = [repr(settings), str(settings), str(settings.redacted()), caplog.text]
    for text in shown:
        for secret in SECRETS:
            assert secret not in text
    assert settings.redacted()["redis_url"] == "redis://:***@cache:6379/0"
    assert settings.redacted()["broker_url"] == "redis://relay:***@broker:6379/1"
    rabbit = Settings.from_env({"RELAY_BROKER_URL": "amqps://relay:hunter2-broker@mq:5671/relay"})
    assert rabbit.redacted()["broker_url"] == "amqps://relay:***@mq:5671/relay"
    assert "hunter2-broker" not in repr(rabbit) + str(rabbit)
    assert settings.redacted()["model_key"] == "***"
    # The real values are still there for the code that connects.
    assert settings.redis_url == SECRET_ENV["RELAY_REDIS_URL"]


@pytest.mark.parametrize(
    ("variable", "value", "secret"),
    [
        ("RELAY_REDIS_URL", "http://:hunter2-redis@cache:6379/0", "hunter2-redis"),
        ("RELAY_BROKER_URL", "ftp://relay:hunter2-broker@broker//", "hunter2-broker"),
        ("RELAY_BROKER_URL", "amqp://relay:hunter2-broker@broker:x//", "hunter2-broker"),
        ("RELAY_MODEL_URL", "https://me:hunter2-model@api.example.com/v1", "hunter2-model"),
        ("RELAY_MODEL_KEY", "sk-hunter2 key", "hunter2"),
    ],
)
def test_secrets_never_appear_in_errors_or_their_tracebacks(
    variable: str, value: str, secret: str
) -> None:
    with pytest.raises(SettingsError) as caught:
        Settings.from_env({variable: value})
    assert caught.value.__suppress_context__
    assert secret not in "".join(traceback.format_exception(caught.value))


def test_a_bad_value_given_in_code_does_not_echo_a_password() -> None:
    with pytest.raises(ValidationError) as caught:
        Settings(redis_url="http://:hunter2-redis@cache/0")
    assert "hunter2-redis" not in str(caught.value)


def test_settings_are_frozen() -> None:
    settings = Settings.from_env({})
    with pytest.raises(ValidationError):
        settings.model = "other"  # type: ignore[misc]


def test_model_settings_carry_the_model_values() -> None:
    settings = Settings.from_env(
        {
            "RELAY_MODEL_URL": "http://localhost:11434/v1",
            "RELAY_MODEL": "qwen",
            "RELAY_MODEL_KEY": "sk-1",
            "RELAY_MODEL_CONNECT_TIMEOUT": "2",
            "RELAY_MODEL_TIMEOUT": "9",
            "RELAY_MODEL_RETRIES": "1",
            "RELAY_MODEL_DEADLINE": "30",
        }
    )
    model = settings.model_settings()
    assert model == ModelSettings(
        url="http://localhost:11434/v1/chat/completions",
        model="qwen",
        key=SecretStr("sk-1"),
        connect_timeout=2,
        read_timeout=9,
        retries=1,
        deadline=30,
    )


def test_model_settings_need_a_model_url() -> None:
    with pytest.raises(SettingsError, match=r"^RELAY_MODEL_URL: not set"):
        Settings.from_env({}).model_settings()


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://:pw@host:6379/0", "redis://:***@host:6379/0"),
        ("redis://user:pw@host/0", "redis://user:***@host/0"),
        ("rediss://user:p%40ss@host", "rediss://user:***@host"),
        ("redis://user:p@ss@host/0", "redis://user:***@host/0"),
        ("redis://user:pa/ss@host/0", "redis://***@host/0"),
        ("redis://user:pa#ss@host", "redis://***@host"),
        ("redis://user@host/0", "redis://user@host/0"),
        ("redis://host:6379/0", "redis://host:6379/0"),
        ("unix:///run/redis.sock?db=1", "unix:///run/redis.sock?db=1"),
        ("http://h/v1?key=a", "http://h/v1?key=***"),
        (
            "https://h/openai/v1/chat/completions?api-version=2024-02-01&api-key=SECRET",
            "https://h/openai/v1/chat/completions?api-version=2024-02-01&api-key=***",
        ),
        ("https://h/v1?apiKey=x&model=m", "https://h/v1?apiKey=***&model=m"),
        ("redis://h:6379/0?password=pw&db=1", "redis://h:6379/0?password=***&db=1"),
        ("https://h/v1?access_token=t#top", "https://h/v1?access_token=***#top"),
        (
            "https://h/v1?X-Amz-Signature=abc&X-Amz-Date=1",
            "https://h/v1?X-Amz-Signature=***&X-Amz-Date=1",
        ),
        ("https://h/v1?q=sk-abcdefghijkl", "https://h/v1?q=***"),
        ("https://h/v1?id=" + "a1" * 20, "https://h/v1?id=***"),
        ("https://h/v1?key=&debug", "https://h/v1?key=&debug"),
        ("https://u:pw@h/v1?token=t&x=1", "https://u:***@h/v1?token=***&x=1"),
        ("user:pw@host", "***@host"),
        ("no url at all", "no url at all"),
        ("", ""),
    ],
)
def test_redact_url(url: str, shown: str) -> None:
    assert redact_url(url) == shown


NAME = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-_.", max_size=12)


@given(
    scheme=st.sampled_from(["redis", "rediss", "http", "https"]),
    user=NAME,
    password=st.text(min_size=4).filter(lambda text: "://" not in text),
    host=NAME.filter(bool),
    path=st.sampled_from(["", "/0", "/v1/chat", "?db=2"]),
)
def test_redact_url_never_shows_a_password(
    scheme: str, user: str, password: str, host: str, path: str
) -> None:
    url = f"{scheme}://{user}:{password}@{host}{path}"
    assume(password not in f"{scheme}://{user}:***@{host}{path}")
    shown = redact_url(url)
    assert password not in shown
    assert shown.endswith(f"@{host}{path}")


def test_a_key_given_in_code_is_checked_too() -> None:
    with pytest.raises(ValidationError) as caught:
        Settings(model_key=SecretStr("sk hunter2"))
    assert "hunter2" not in str(caught.value)


@pytest.mark.parametrize(
    ("given", "events"),
    [("1", True), ("true", True), ("On", True), ("0", False), ("no", False), ("OFF", False)],
)
def test_task_events_can_be_turned_off(given: str, events: bool) -> None:
    assert Settings.from_env({"RELAY_EVENTS": given}).events is events


def test_a_bad_events_flag_names_the_variable() -> None:
    with pytest.raises(SettingsError) as raised:
        Settings.from_env({"RELAY_EVENTS": "maybe"})
    assert str(raised.value).startswith("RELAY_EVENTS:")
    assert "\n" not in str(raised.value)


def test_a_redis_cluster_holds_run_state_only_and_needs_a_broker_of_its_own() -> None:
    cluster = {"RELAY_REDIS_URL": "redis+cluster://127.0.0.1:7000"}
    with pytest.raises(SettingsError, match="RELAY_BROKER_URL: not set, and a Redis Cluster"):
        Settings.from_env(cluster)
    flagged = {"RELAY_REDIS_URL": "redis://127.0.0.1:7000", "RELAY_REDIS_CLUSTER": "1"}
    with pytest.raises(SettingsError, match="holds run state only"):
        Settings.from_env(flagged)
    given = Settings.from_env({**flagged, "RELAY_BROKER_URL": "amqp://guest@127.0.0.1//"})
    assert given.cluster
    assert given.broker_url == "amqp://guest@127.0.0.1//"
    assert not Settings.from_env({"RELAY_REDIS_URL": "redis://127.0.0.1:7000"}).cluster


@pytest.mark.parametrize(("given", "ms"), [(None, 250), ("0", 0), (" 40 ", 40), ("5000", 5000)])
def test_continuation_in_place_has_a_slice_in_ms(given: str | None, ms: int) -> None:
    env = {} if given is None else {"RELAY_INLINE_MS": given}
    assert Settings.from_env(env).inline_ms == ms


@pytest.mark.parametrize("given", ["-1", "0.5", "soon"])
def test_a_bad_slice_names_the_variable(given: str) -> None:
    with pytest.raises(SettingsError) as raised:
        Settings.from_env({"RELAY_INLINE_MS": given})
    assert str(raised.value).startswith("RELAY_INLINE_MS:")


@pytest.mark.parametrize(
    ("env", "tick_s", "lease_ms"),
    [
        ({}, 5.0, 8_000),  # 8 s lease + 5 s tick + 2 s to be taken = the 15 s promised
        ({"RELAY_RECOVERY_SECONDS": "4"}, 1.2, 2_000),  # the tick shortened to fit
        ({"RELAY_RECOVERY_SECONDS": "60"}, 5.0, 53_000),
        ({"RELAY_RECOVERY_SECONDS": "15", "RELAY_TICK_SECONDS": "1"}, 1.0, 12_000),
        ({"RELAY_RECOVERY_SECONDS": "2", "RELAY_TICK_SECONDS": "0.5"}, 0.5, 1_100),
    ],
)
def test_lease_tick_and_margin_add_up_to_the_recovery_time(
    env: dict[str, str], tick_s: float, lease_ms: int
) -> None:
    settings = Settings.from_env(env)
    timing = Timing.of(settings)
    assert settings.tick_interval == tick_s
    assert timing.lease_ms == lease_ms
    recovery_ms = settings.recovery_seconds * 1000
    worst = (
        timing.lease_ms
        + settings.tick_interval * 1000
        + recovery_margin_ms(settings.recovery_seconds)
    )
    assert worst == recovery_ms
    assert timing.lease_ms >= recovery_ms / 2


@given(st.floats(min_value=0.5, max_value=10 * DAY), st.floats(min_value=0.01, max_value=3600))
def test_no_recovery_time_and_tick_are_accepted_that_break_the_promise(
    recovery: float, tick: float
) -> None:
    env = {"RELAY_RECOVERY_SECONDS": repr(recovery), "RELAY_TICK_SECONDS": repr(tick)}
    if tick > longest_tick_s(recovery):
        with pytest.raises(SettingsError, match="RELAY_TICK_SECONDS: at most"):
            Settings.from_env(env)
        return
    settings = Settings.from_env(env)
    timing = Timing.of(settings)
    worst = timing.lease_ms + settings.tick_interval * 1000 + recovery_margin_ms(recovery)
    assert worst <= recovery * 1000 + 1  # whole milliseconds
    for_defaults = Timing.of(Settings.from_env({"RELAY_RECOVERY_SECONDS": repr(recovery)}))
    assert for_defaults.lease_ms >= recovery * 1000 // 2


def test_a_tick_too_long_for_the_recovery_time_is_refused() -> None:
    with pytest.raises(SettingsError) as caught:
        Settings.from_env({"RELAY_RECOVERY_SECONDS": "4", "RELAY_TICK_SECONDS": "5"})
    message = str(caught.value)
    assert "RELAY_TICK_SECONDS: at most 1.2 s with RELAY_RECOVERY_SECONDS=4" in message
