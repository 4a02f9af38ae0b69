"""`relay flower`: Flower on a real worker, behind basic auth, never showing the broker password."""

from __future__ import annotations

import secrets
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.apps.notes import build
from tests.support.brain import Brain, call, final
from tests.support.cli import clean_env, relay
from tests.support.model_server import ModelServer
from tests.support.redis_server import RedisServer, free_port
from tests.support.worker_process import RelayProcess
from workers import Settings

APP = "tests.apps.notes:relay"


def _listening_address(port: int) -> str:
    """Return the local address a LISTEN socket on `port` is bound to, as /proc/net/tcp says."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        address, hex_port = fields[1].split(":")
        if int(hex_port, 16) == port and fields[3] == "0A":
            octets = [str(int(address[i : i + 2], 16)) for i in range(6, -1, -2)]
            return ".".join(octets)
    raise AssertionError(f"nothing listens on port {port}")


def _relay_tasks(client: httpx.Client, run_id: str, timeout: float = 30) -> list[dict[str, Any]]:
    """Poll Flower's task list until it holds the run's model call and tool call."""
    deadline = time.monotonic() + timeout
    while True:
        tasks = client.get("/api/tasks").raise_for_status().json()
        mine = [t for t in tasks.values() if run_id in str(t.get("args"))]
        names = {t["name"] for t in mine}
        if {"relay.call_model", "relay.run_tool"} <= names or time.monotonic() > deadline:
            return mine
        time.sleep(0.3)


def test_flower_shows_relay_tasks_behind_basic_auth(tmp_path: Path) -> None:
    broker_password = f"broker-{secrets.token_hex(8)}"
    flower_password = f"flower-{secrets.token_hex(8)}"
    brain = Brain()
    brain.script("FLOWER-1", {0: call("read_note", name="a.txt"), 1: final("read it")})
    with (
        RedisServer(tmp_path, password=broker_password) as redis_server,
        ModelServer(brain) as model,
    ):
        env = clean_env(
            RELAY_REDIS_URL=redis_server.url,
            RELAY_MODEL_URL=model.url,
            RELAY_TEST_DIR=str(tmp_path),
            RELAY_FLOWER_USER="watcher",
            RELAY_FLOWER_PASSWORD=flower_password,
            RELAY_INLINE_MS="0",  # each step its own task, as this test looks for them
        )
        port = free_port()
        flower = RelayProcess(
            ["--app", APP, "flower", "--port", str(port)],
            env,
            tmp_path / "flower.log",
            ready_text="Visit me at",
        )
        worker_args = ["--app", APP, "worker", "--pool", "threads", "-c", "4", "-n", "fw@test"]
        worker = RelayProcess(worker_args, env, tmp_path / "worker.log")
        with flower, worker:
            assert _listening_address(port) == "127.0.0.1"
            client = httpx.Client(
                base_url=f"http://127.0.0.1:{port}", auth=("watcher", flower_password), timeout=10
            )
            with client:
                _check_tasks_and_pages(client, env, port, broker_password, flower)


def _check_tasks_and_pages(
    client: httpx.Client, env: dict[str, str], port: int, secret: str, flower: RelayProcess
) -> None:
    relay_client = build(Settings.from_env(env))
    run_id = relay_client.start("FLOWER-1: read a note")
    assert relay_client.wait(run_id, timeout=30).summary == "read it"

    tasks = _relay_tasks(client, run_id)
    by_name = {t["name"]: t for t in tasks}
    assert by_name["relay.call_model"]["args"].startswith(f"run={run_id} step=")
    assert by_name["relay.run_tool"]["args"] == f"run={run_id} call=call-1 tool=read_note"
    assert by_name["relay.advance"]["args"] == f"run={run_id}"

    anonymous = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10)
    wrong = httpx.Client(base_url=f"http://127.0.0.1:{port}", auth=("watcher", "no"), timeout=10)
    with anonymous, wrong:
        for path in ("/", "/tasks", "/workers", "/broker", "/api/tasks", "/api/workers"):
            assert anonymous.get(path).status_code == 401, path
            assert wrong.get(path).status_code == 401, path

    task_id = next(iter(_ids(client, run_id)))
    pages = [
        "/",
        "/workers",
        "/worker/fw@test",
        "/tasks",
        "/broker",
        f"/task/{task_id}",
        "/api/tasks",
        "/api/workers?refresh=1",
        f"/api/task/info/{task_id}",
        "/api/queues/length",
    ]
    for path in pages:
        answer = client.get(path)
        assert answer.status_code == 200, (path, answer.status_code)
        assert secret not in answer.text, path
    workers = client.get("/api/workers?refresh=1").json()
    broker = workers["fw@test"]["stats"]["broker"]  # described, without its password
    assert broker["hostname"] == "127.0.0.1"
    assert "fw@test" in client.get("/worker/fw@test").text
    assert secret not in flower.output()


def _ids(client: httpx.Client, run_id: str) -> list[str]:
    tasks = client.get("/api/tasks").raise_for_status().json()
    return [task_id for task_id, task in tasks.items() if run_id in str(task.get("args"))]


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ({}, "refusing to start Flower without credentials"),
        ({"RELAY_FLOWER_USER": "watcher"}, "set both RELAY_FLOWER_USER and RELAY_FLOWER_PASSWORD"),
        (
            {"RELAY_FLOWER_USER": "a:b", "RELAY_FLOWER_PASSWORD": "pw"},
            "RELAY_FLOWER_USER may not hold ':'",
        ),
    ],
)
def test_flower_refuses_to_start_without_credentials(given: dict[str, str], says: str) -> None:
    done = relay("--app", APP, "flower", "--port", str(free_port()), env=clean_env(**given))
    assert done.returncode == 1
    assert done.stderr.strip().startswith("relay: ")
    assert says in done.stderr
