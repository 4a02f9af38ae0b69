"""docker-compose.yml: every service's command is a working invocation of this project.

There is no Docker engine here, so each command runs as the container would run
it, on this machine: Redis with the compose file's own arguments and config
file, the two workers (which also tick: no beat) and Flower against that Redis,
and the demo service's run served by those workers. No password is on any
command line. The workers make claims durable (RELAY_DURABLE_CLAIMS=1): the
compose image's Redis has WAITAOF; this machine's may be older, and then the
test turns on `appendfsync always`, the other setting durable claims accept.

The `rabbitmq` profile: a RabbitMQ node of its own, started with the profile's
config file, passes the service's healthcheck, and the workers and the demo,
given the README's RELAY_BROKER_URL, run through it.
"""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import redis
import yaml

from tests.support.cli import ROOT, clean_env, relay
from tests.support.rabbitmq import private_node
from tests.support.redis_server import free_port
from tests.support.worker_process import RelayProcess
from workers import Settings

COMPOSE = ROOT / "docker-compose.yml"
SECRETS = {
    "REDIS_PASSWORD": "compose-redis-pw",
    "RELAY_FLOWER_PASSWORD": "compose-flower-pw",
    "RELAY_WEB_PASSWORD": "compose-web-pw",
    "RABBITMQ_PASSWORD": "compose-rabbit-pw",
}
_VARIABLE = re.compile(r"\$\$|\$\{(\w+)(?::([-?])([^}]*))?\}")


def interpolate(value: str, env: Mapping[str, str]) -> str:
    """Expand `${X}`, `${X:-default}` and `${X:?error}` as docker compose does (`$$` is `$`)."""

    def expand(found: re.Match[str]) -> str:
        if found[0] == "$$":
            return "$"
        name, how, rest = found[1], found[2], found[3]
        if env.get(name):
            return env[name]
        if how == "?":
            raise KeyError(f"{name}: {rest}")
        return rest or ""

    return _VARIABLE.sub(expand, value)


def resolved(value: Any, env: Mapping[str, str]) -> Any:
    if isinstance(value, str):
        return interpolate(value, env)
    if isinstance(value, list):
        return [resolved(item, env) for item in value]
    if isinstance(value, dict):
        return {key: resolved(item, env) for key, item in value.items()}
    return value


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return dict(resolved(yaml.safe_load(COMPOSE.read_text()), SECRETS))


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, Any]:
    return dict(compose["services"])


def readme_broker_url() -> str:
    """The RELAY_BROKER_URL the README gives for the rabbitmq profile (the password filled in)."""
    readme = (ROOT / "README.md").read_text()
    start = readme.index("--profile rabbitmq")
    section = readme[readme.rindex("```bash", 0, start) : start]
    [line] = [x for x in section.splitlines() if x.startswith("export RELAY_BROKER_URL=")]
    return line.split("=", 1)[1].replace("$RABBITMQ_PASSWORD", SECRETS["RABBITMQ_PASSWORD"])


@pytest.fixture(scope="module")
def rabbit_compose() -> dict[str, Any]:
    """The compose file as `--profile rabbitmq` runs it, with the README's RELAY_BROKER_URL."""
    env = {**SECRETS, "RELAY_BROKER_URL": readme_broker_url()}
    return dict(resolved(yaml.safe_load(COMPOSE.read_text()), env))


def test_the_services_are_all_there(services: dict[str, Any]) -> None:
    assert set(services) == {
        "redis",
        "rabbitmq",
        "worker-model",
        "worker-tools",
        "flower",
        "web",
        "demo",
    }
    servers = {"redis": "redis-server", "rabbitmq": "rabbitmq-server"}
    for name, service in services.items():
        command = service["command"]
        assert isinstance(command, list), name  # exec form: no shell between Docker and relay
        assert command[0] == servers.get(name, "relay"), name
    assert services["flower"]["ports"] == ["127.0.0.1:5555:5555"]
    assert services["web"]["ports"] == ["127.0.0.1:5556:5556"]
    assert services["demo"]["profiles"] == ["demo"]
    assert services["rabbitmq"]["profiles"] == ["rabbitmq"]


@pytest.mark.parametrize(
    "needed", ["REDIS_PASSWORD", "RELAY_FLOWER_PASSWORD", "RELAY_WEB_PASSWORD"]
)
def test_the_passwords_must_be_given(needed: str) -> None:
    without = {k: v for k, v in SECRETS.items() if k != needed}
    with pytest.raises(KeyError, match=needed):
        resolved(yaml.safe_load(COMPOSE.read_text()), without)


def test_no_password_is_on_a_command_line(services: dict[str, Any]) -> None:
    for name, service in services.items():
        shown = [*service["command"], *service.get("healthcheck", {}).get("test", [])]
        for secret in SECRETS.values():
            assert not [part for part in shown if secret in str(part)], name


def _seconds(duration: str) -> float:
    """A compose duration (`6m`, `2m30s`, `90s`) in seconds."""
    units = {"h": 3600, "m": 60, "s": 1}
    found = re.findall(r"([0-9]+)([hms])", duration)
    assert "".join(n + u for n, u in found) == duration, duration
    return sum(int(n) * units[u] for n, u in found)


def test_a_stopping_worker_is_given_the_time_its_calls_may_take(
    services: dict[str, Any],
) -> None:
    # Docker's default is 10 s, then SIGKILL: every tool under way would end "unknown".
    settings = Settings.from_env({})
    tools = _seconds(services["worker-tools"]["stop_grace_period"])
    model = _seconds(services["worker-model"]["stop_grace_period"])
    assert tools >= settings.tool_timeout + 60
    assert model >= settings.model_timeout + 20


def test_the_model_key_reaches_only_the_workers(services: dict[str, Any]) -> None:
    keyed = {"RELAY_MODEL_KEY": "sk-compose-key-0123456789"}
    with_key = dict(resolved(yaml.safe_load(COMPOSE.read_text()), {**SECRETS, **keyed}))
    given = {
        name: service.get("environment", {}).get("RELAY_MODEL_KEY", "")
        for name, service in with_key["services"].items()
    }
    assert {name for name, key in given.items() if key} == {"worker-model", "worker-tools"}


def test_the_workers_split_model_calls_and_tools(services: dict[str, Any]) -> None:
    model = services["worker-model"]["command"]
    tools = services["worker-tools"]["command"]
    assert _option(model, "--queues") == "model"
    assert _option(model, "--pool") == "threads"
    assert int(_option(model, "--concurrency")) >= 16
    assert _option(tools, "--queues") == "tools,advance"
    assert _option(tools, "--pool") == "prefork"


def _option(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def _configs_in(compose: dict[str, Any], service: str, into: Path) -> dict[str, str]:
    """Write the service's configs (inline content) into `into`; return target -> file."""
    written = {}
    for given in compose["services"][service].get("configs", []):
        source = given["source"] if isinstance(given, dict) else given
        target = given.get("target", f"/{source}") if isinstance(given, dict) else f"/{source}"
        path = into / source
        path.write_text(compose["configs"][source]["content"])
        written[target] = str(path)
    return written


@pytest.fixture
def compose_redis(compose: dict[str, Any], tmp_path: Path) -> Iterator[str]:
    """redis-server started with the compose file's command and config (plus a port and a dir)."""
    executable = shutil.which("redis-server")
    assert executable is not None
    port = free_port()
    files = _configs_in(compose, "redis", tmp_path)
    assert files, "the redis service has no config file"
    args = [executable, *(files.get(a, a) for a in compose["services"]["redis"]["command"][1:])]
    args += ["--port", str(port), "--bind", "127.0.0.1", "--dir", str(tmp_path)]
    process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    assert SECRETS["REDIS_PASSWORD"] not in " ".join(args)
    url = f"redis://:{SECRETS['REDIS_PASSWORD']}@127.0.0.1:{port}/0"
    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=0.5)
        deadline = time.monotonic() + 15
        while True:
            try:
                client.ping()
                break
            except redis.RedisError:
                assert process.poll() is None, "redis-server rejected the compose arguments"
                assert time.monotonic() < deadline
                time.sleep(0.05)
        settings = {**client.config_get("appendonly"), **client.config_get("appendfsync")}
        settings.update(client.config_get("maxmemory-policy"))
        assert settings == {
            "appendonly": "yes",
            "appendfsync": "everysec",
            "maxmemory-policy": "noeviction",
        }
        if _version(client.info("server")["redis_version"]) < (7, 2):
            client.config_set("appendfsync", "always")  # no WAITAOF before Redis 7.2
        client.close()
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=port).ping()
        command_line = Path(f"/proc/{process.pid}/cmdline").read_bytes()
        assert SECRETS["REDIS_PASSWORD"].encode() not in command_line
        yield url
    finally:
        process.terminate()
        process.wait(10)


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(".")[:2])


def test_the_workers_make_claims_durable_on_a_redis_that_can(compose: dict[str, Any]) -> None:
    services = compose["services"]
    for name in ("worker-model", "worker-tools"):
        assert services[name]["environment"]["RELAY_DURABLE_CLAIMS"] == "1"
    tag = services["redis"]["image"].split(":")[1]
    assert _version(tag.removesuffix("-alpine")) >= (7, 2)  # WAITAOF
    assert "appendonly yes" in compose["configs"]["redis-conf"]["content"]


def _start(
    services: dict[str, Any],
    name: str,
    url: str,
    tmp_path: Path,
    ready: str,
    *,
    broker: dict[str, str] | None = None,
) -> RelayProcess:
    service = services[name]
    assert service["environment"]["RELAY_REDIS_URL"].endswith("@redis:6379/0")
    env = clean_env(
        **{
            **service["environment"],
            "RELAY_REDIS_URL": url,
            "RELAY_DEMO_DIR": str(tmp_path / "notes"),
            **(broker or {}),
        }
    )
    args = list(service["command"][1:])
    process = RelayProcess(args, env, tmp_path / f"{name}.log", ready_text=ready)
    return process.start()


def _flower_on_loopback(services: dict[str, Any], name: str = "flower") -> int:
    """Make the flower (or web) service listen on 127.0.0.1 and a free port; return the port.

    The container listens on every address, Docker publishes it on 127.0.0.1 only;
    here, with no container around it, it listens on 127.0.0.1 itself.
    """
    command = services[name]["command"]
    port = free_port()
    services[name]["command"] = [
        *command[: command.index("--address")],
        "--address",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    return port


def _workers_in_flower(port: int) -> set[str]:
    password = SECRETS["RELAY_FLOWER_PASSWORD"]
    workers = httpx.get(
        f"http://127.0.0.1:{port}/api/workers?refresh=1", auth=("admin", password), timeout=10
    ).json()
    return {name.split("@")[0] for name in workers}


def test_every_command_runs_the_demo_end_to_end(
    services: dict[str, Any], compose_redis: str, tmp_path: Path
) -> None:
    services = copy.deepcopy(services)
    port = _flower_on_loopback(services)
    web_port = _flower_on_loopback(services, "web")
    started: list[RelayProcess] = []
    try:
        started.append(_start(services, "worker-model", compose_redis, tmp_path, "ready."))
        started.append(_start(services, "worker-tools", compose_redis, tmp_path, "ready."))
        assert all("durable claims on" in p.output() for p in started)
        started.append(_start(services, "flower", compose_redis, tmp_path, "Visit me at"))
        assert httpx.get(f"http://127.0.0.1:{port}/api/workers", timeout=10).status_code == 401
        assert _workers_in_flower(port) == {"model", "tools"}
        started.append(_start(services, "web", compose_redis, tmp_path, "Uvicorn running on"))
        web = f"http://127.0.0.1:{web_port}"
        assert httpx.get(f"{web}/api/runs", timeout=10).status_code == 401
        web_auth = ("admin", SECRETS["RELAY_WEB_PASSWORD"])
        assert httpx.get(f"{web}/api/runs", auth=web_auth, timeout=10).json() == []

        demo = services["demo"]
        env = clean_env(**{**demo["environment"], "RELAY_REDIS_URL": compose_redis})
        done = relay(*demo["command"][1:], env=env, cwd=tmp_path)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "demo model" in done.stdout
        assert "■ Done: I listed 3 notes" in done.stdout
        assert "Started a private Redis" not in done.stdout  # the fleet served it
        assert (tmp_path / "notes" / "summary.md").is_file()  # written by the tools worker
        runs = httpx.get(f"{web}/api/runs", auth=web_auth, timeout=10).json()
        assert [run["state"] for run in runs] == ["finished"]
        ports = {"flower": (5555, port), "web": (5556, web_port)}
        for name in ("worker-model", "worker-tools", "flower", "web"):
            assert _healthcheck(services, name, compose_redis, ports.get(name)) == 0, name
        started[0].stop()  # worker-model: its check now fails
        assert _healthcheck(services, "worker-model", compose_redis, None) == 1
    finally:
        for process in reversed(started):
            process.stop()


def _healthcheck(
    services: dict[str, Any], name: str, url: str, ports: tuple[int, int] | None
) -> int:
    """Run the service's healthcheck here as Docker runs it in the container; its exit code.

    `ports`: (the container's port, the one the service listens on here)."""
    test = services[name]["healthcheck"]["test"]
    assert test[0] == "CMD"
    argv = [str(part) for part in test[1:]]
    if ports is not None:
        argv = [part.replace(f":{ports[0]}/", f":{ports[1]}/") for part in argv]
    env = clean_env(**{**services[name]["environment"], "RELAY_REDIS_URL": url})
    if argv[0] == "relay":
        return relay(*argv[1:], env=env).returncode
    assert argv[0] == "python"
    done = subprocess.run([sys.executable, *argv[1:]], env=env, timeout=30, check=False)
    return done.returncode


# --- the rabbitmq profile ------------------------------------------------------------------


def test_without_the_profile_redis_is_the_broker(services: dict[str, Any]) -> None:
    env = services["worker-model"]["environment"]
    assert env["RELAY_BROKER_URL"] == ""  # blank: the Redis URL
    assert Settings.from_env(env).broker_url == env["RELAY_REDIS_URL"]
    without = {k: v for k, v in SECRETS.items() if k != "RABBITMQ_PASSWORD"}
    resolved(yaml.safe_load(COMPOSE.read_text()), without)  # needs no RabbitMQ password


def test_the_rabbitmq_profile_is_wired_to_every_relay_service(
    rabbit_compose: dict[str, Any],
) -> None:
    services = rabbit_compose["services"]
    rabbit = services["rabbitmq"]
    conf = dict(
        line.split(" = ", 1)
        for line in rabbit_compose["configs"]["rabbitmq-conf"]["content"].splitlines()
    )
    [mounted] = rabbit["configs"]
    assert mounted == {"source": "rabbitmq-conf", "target": "/etc/rabbitmq/conf.d/20-relay.conf"}
    # The README's URL names the profile's user, password, vhost, host and port.
    url = urlsplit(readme_broker_url())
    assert (url.scheme, url.hostname, url.port) == ("amqp", "rabbitmq", 5672)
    assert (url.username, url.password) == (conf["default_user"], conf["default_pass"])
    assert url.path == f"/{conf['default_vhost']}"
    assert conf["default_pass"] == SECRETS["RABBITMQ_PASSWORD"]
    for name in ("worker-model", "worker-tools", "flower", "demo"):
        service = services[name]
        assert service["environment"]["RELAY_BROKER_URL"] == readme_broker_url(), name
        assert service["depends_on"]["rabbitmq"] == {
            "condition": "service_healthy",
            "required": False,  # there only with the profile
        }
    # Per-consumer timeouts (x-consumer-timeout, set by Relay) came with RabbitMQ 3.12.
    tag = rabbit["image"].split(":")[1]
    assert _version(tag.split("-")[0]) >= (3, 12)
    assert rabbit["ports"] == ["127.0.0.1:15672:15672"]


def test_the_rabbitmq_profile_runs_the_demo_end_to_end(
    rabbit_compose: dict[str, Any], compose_redis: str, tmp_path: Path
) -> None:
    services = copy.deepcopy(rabbit_compose["services"])
    flower_port = _flower_on_loopback(services)
    rabbit = services["rabbitmq"]
    content = rabbit_compose["configs"]["rabbitmq-conf"]["content"]
    with private_node(content) as (node, port, pid):
        assert (
            SECRETS["RABBITMQ_PASSWORD"].encode() not in Path(f"/proc/{pid}/cmdline").read_bytes()
        )
        check, *args = rabbit["healthcheck"]["test"][1:]
        healthy = subprocess.run(
            [shutil.which(check) or check, "-n", node, *args],
            capture_output=True,
            timeout=60,
            check=False,
        )
        assert healthy.returncode == 0, healthy.stdout + healthy.stderr
        broker = readme_broker_url().replace("@rabbitmq:5672/", f"@127.0.0.1:{port}/")
        on_rabbit = {"RELAY_BROKER_URL": broker}
        started: list[RelayProcess] = []
        try:
            for name in ("worker-model", "worker-tools"):
                started.append(
                    _start(services, name, compose_redis, tmp_path, "ready.", broker=on_rabbit)
                )
                assert "relay: broker RabbitMQ" in started[-1].output()
            started.append(
                _start(services, "flower", compose_redis, tmp_path, "Visit me at", broker=on_rabbit)
            )
            assert _workers_in_flower(flower_port) == {"model", "tools"}  # over RabbitMQ
            demo = services["demo"]
            env = clean_env(
                **{**demo["environment"], "RELAY_REDIS_URL": compose_redis, **on_rabbit}
            )
            done = relay(*demo["command"][1:], env=env, cwd=tmp_path)
            assert done.returncode == 0, done.stdout + done.stderr
            assert "■ Done: I listed 3 notes" in done.stdout
            assert (tmp_path / "notes" / "summary.md").is_file()  # written by the tools worker
            logs = "".join(p.output() for p in started)
            assert "Task relay.run_tool[" in logs  # over RabbitMQ: Redis only keeps the runs
        finally:
            for process in reversed(started):
                process.stop()
