"""docker-compose.yml: every service's command is a working invocation of this project.

There is no Docker engine here, so each command runs as the container would run
it, on this machine: Redis with the compose file's own arguments and config
file, the two workers (which also tick: no beat) and Flower against that Redis,
and the demo service's run served by those workers. No password is on any
command line. The workers make claims durable (RELAY_DURABLE_CLAIMS=1): the
compose image's Redis has WAITAOF; this machine's may be older, and then the
test turns on `appendfsync always`, the other setting durable claims accept.
"""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import yaml

from tests.support.cli import ROOT, clean_env, relay
from tests.support.redis_server import free_port
from tests.support.worker_process import RelayProcess

COMPOSE = ROOT / "docker-compose.yml"
SECRETS = {
    "REDIS_PASSWORD": "compose-redis-pw",
    "RELAY_FLOWER_PASSWORD": "compose-flower-pw",
    "RELAY_WEB_PASSWORD": "compose-web-pw",
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


def test_the_services_are_all_there(services: dict[str, Any]) -> None:
    assert set(services) == {"redis", "worker-model", "worker-tools", "flower", "web", "demo"}
    for name, service in services.items():
        command = service["command"]
        assert isinstance(command, list), name  # exec form: no shell between Docker and relay
        assert command[0] == ("redis-server" if name == "redis" else "relay"), name
    assert services["flower"]["ports"] == ["127.0.0.1:5555:5555"]
    assert services["web"]["ports"] == ["127.0.0.1:5556:5556"]
    assert services["demo"]["profiles"] == ["demo"]


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
    services: dict[str, Any], name: str, url: str, tmp_path: Path, ready: str
) -> RelayProcess:
    service = services[name]
    assert service["environment"]["RELAY_REDIS_URL"].endswith("@redis:6379/0")
    env = clean_env(
        **{
            **service["environment"],
            "RELAY_REDIS_URL": url,
            "RELAY_DEMO_DIR": str(tmp_path / "notes"),
        }
    )
    args = list(service["command"][1:])
    process = RelayProcess(args, env, tmp_path / f"{name}.log", ready_text=ready)
    return process.start()


def test_every_command_runs_the_demo_end_to_end(
    services: dict[str, Any], compose_redis: str, tmp_path: Path
) -> None:
    services = copy.deepcopy(services)
    port, web_port = free_port(), free_port()
    # The containers listen on every address, Docker publishes them on 127.0.0.1 only;
    # here, with no container around them, they listen on 127.0.0.1 themselves.
    for name, at in (("flower", port), ("web", web_port)):
        command = services[name]["command"]
        at_address = command.index("--address")
        services[name]["command"] = [
            *command[:at_address],
            "--address",
            "127.0.0.1",
            "--port",
            str(at),
        ]
    started: list[RelayProcess] = []
    try:
        started.append(_start(services, "worker-model", compose_redis, tmp_path, "ready."))
        started.append(_start(services, "worker-tools", compose_redis, tmp_path, "ready."))
        assert all("durable claims on" in p.output() for p in started)
        started.append(_start(services, "flower", compose_redis, tmp_path, "Visit me at"))
        assert httpx.get(f"http://127.0.0.1:{port}/api/workers", timeout=10).status_code == 401
        password = SECRETS["RELAY_FLOWER_PASSWORD"]
        workers = httpx.get(
            f"http://127.0.0.1:{port}/api/workers?refresh=1", auth=("admin", password), timeout=10
        ).json()
        assert {name.split("@")[0] for name in workers} == {"model", "tools"}
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
    finally:
        for process in reversed(started):
            process.stop()
