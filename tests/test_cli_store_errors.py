"""A Redis URL that cannot work (no password, a wrong one, no such database or host) as an
operator meets it: `relay worker` stops at once with one line and exit 1, the other verbs
say what is wrong and how to mend it, not "unreachable"; a Redis merely away is waited for."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.cli import clean_env, relay
from tests.support.redis_server import RedisServer
from tests.support.worker_process import RelayProcess
from workers.errors import StoreMisconfigured, StoreUnavailable
from workers.store.aconnection import AsyncConnection
from workers.store.connection import redis_errors

APP = "tests.apps.notes:relay"
HINT = "set the password in RELAY_REDIS_URL as redis://:PASSWORD@host:port/db"


def _one_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert lines[0].startswith("relay: "), stderr
    return lines[0]


@pytest.mark.parametrize("password", ["", "wrong"], ids=["no password", "wrong password"])
def test_a_worker_without_the_password_stops_at_once_saying_so(
    tmp_path: Path, password: str
) -> None:
    secret = f"redis-{secrets.token_hex(8)}"
    with RedisServer(tmp_path, password=secret) as server:
        auth = f":{password}@" if password else ""
        url = f"redis://{auth}127.0.0.1:{server.port}/0"
        env = clean_env(RELAY_REDIS_URL=url, RELAY_TEST_DIR=str(tmp_path))
        # Before: Celery's "Trying again in 2.00 seconds... (1/100)", for many minutes.
        done = relay("--app", APP, "worker", "--pool", "threads", env=env, timeout=60)
        assert done.returncode == 1, done.stdout + done.stderr
        line = _one_line(done.stderr)
        assert "authentication failed" in line
        assert HINT in line
        assert "unreachable" not in line
        assert "Trying again" not in done.stdout + done.stderr
        assert "ready." not in done.stdout + done.stderr  # it never served
        if password:
            assert password not in line.replace("password", "")  # masked: redis://:***@
        beat = relay("--app", APP, "beat", env=env, timeout=60)
        assert beat.returncode == 1
        assert "authentication failed" in _one_line(beat.stderr)


def test_a_broker_of_its_own_without_the_password_is_named_as_the_broker(tmp_path: Path) -> None:
    secret = f"broker-{secrets.token_hex(8)}"
    with RedisServer(tmp_path) as store, RedisServer(tmp_path, password=secret) as broker:
        env = clean_env(
            RELAY_REDIS_URL=store.url,
            RELAY_BROKER_URL=f"redis://127.0.0.1:{broker.port}/0",
            RELAY_TEST_DIR=str(tmp_path),
        )
        done = relay("--app", APP, "worker", "--pool", "threads", env=env, timeout=60)
        assert done.returncode == 1, done.stdout + done.stderr
        line = _one_line(done.stderr)
        assert "authentication failed" in line
        assert "set the password in RELAY_BROKER_URL as redis://:PASSWORD@" in line


def test_the_verbs_say_authentication_failed_not_unreachable(tmp_path: Path) -> None:
    secret = f"redis-{secrets.token_hex(8)}"
    with RedisServer(tmp_path, password=secret) as server:
        no_password = clean_env(RELAY_REDIS_URL=f"redis://127.0.0.1:{server.port}/0")
        for verb in (["runs"], ["show", "nosuchrun"], ["pending"], ["status", "nosuchrun"]):
            done = relay(*verb, env=no_password, timeout=60)
            assert done.returncode == 1, verb
            line = _one_line(done.stderr)
            assert "authentication failed (Authentication required.)" in line, verb
            assert HINT in line, verb
            assert "unreachable" not in line, verb


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis://127.0.0.1:{port}/99", "the database in the URL does not exist"),
        ("redis://no-such-host.invalid:{port}/0", "no such host"),
    ],
    ids=["database 99", "unknown host"],
)
def test_a_worker_on_a_url_that_cannot_work_stops_at_once(
    tmp_path: Path, url: str, says: str
) -> None:
    with RedisServer(tmp_path) as server:
        env = clean_env(RELAY_REDIS_URL=url.format(port=server.port), RELAY_TEST_DIR=str(tmp_path))
        done = relay("--app", APP, "worker", "--pool", "threads", env=env, timeout=60)
        assert done.returncode == 1, done.stdout + done.stderr
        line = _one_line(done.stderr)
        assert says in line
        assert "unreachable" not in line


def test_a_worker_waits_for_a_redis_that_is_only_away(tmp_path: Path) -> None:
    # Nothing listens yet (a fleet may start before its Redis): that can mend, so it waits.
    server = RedisServer(tmp_path)
    env = clean_env(RELAY_REDIS_URL=server.url, RELAY_TEST_DIR=str(tmp_path))
    worker = RelayProcess(
        ["--app", APP, "worker", "--pool", "threads", "-c", "1", "-n", "patient@test"],
        env,
        tmp_path / "worker.log",
        ready_text="waiting for it",
    )
    with worker:
        assert worker.process is not None
        assert "is unreachable" in worker.output()
        with server:
            _until(lambda: "patient@test ready." in worker.output(), 60)
            assert worker.process.poll() is None
        assert worker.output().count("waiting for it") == 1  # said once


def test_a_redis_that_comes_up_wanting_a_password_stops_the_waiting_worker(
    tmp_path: Path,
) -> None:
    server = RedisServer(tmp_path, password=f"redis-{secrets.token_hex(8)}")
    url = f"redis://127.0.0.1:{server.port}/0"  # without the password
    env = clean_env(RELAY_REDIS_URL=url, RELAY_TEST_DIR=str(tmp_path))
    worker = RelayProcess(
        ["--app", APP, "worker", "--pool", "threads", "-c", "1"],
        env,
        tmp_path / "worker.log",
        ready_text="waiting for it",
    )
    with worker, server:
        process = worker.process
        assert process is not None
        _until(lambda: process.poll() is not None, 60)
        assert process.returncode == 1
        assert "authentication failed" in worker.output()
        assert "ready." not in worker.output()


def _until(check: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def test_the_asyncio_client_says_the_same(tmp_path: Path) -> None:
    # AsyncRelay (and what is built on it) reads through AsyncConnection: same words.
    async def ping(url: str) -> None:
        connection = AsyncConnection(url, "relay:")
        try:
            with redis_errors(url):
                await connection.redis.ping()
        finally:
            await connection.aclose()

    with RedisServer(tmp_path, password=f"redis-{secrets.token_hex(8)}") as server:
        with pytest.raises(StoreMisconfigured, match="authentication failed") as refused:
            asyncio.run(ping(f"redis://127.0.0.1:{server.port}/0"))
        assert HINT in str(refused.value)
    with pytest.raises(StoreUnavailable, match="is unreachable") as away:
        asyncio.run(ping(server.url))  # stopped now: only away
    assert not isinstance(away.value, StoreMisconfigured)
