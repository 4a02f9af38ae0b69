"""What each worker process holds, on /metrics: calls in flight, capacity and loop lag
per worker (`FleetMetrics.held`, written to Redis by its flushes), and their sums, the
ratio an autoscaler scales on (docs/autoscaling.md). Real Redis; Prometheus's parser."""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.redis_server import RedisServer
from workers.loop import process_loop
from workers.runtime.metrics import GAUGES_EVERY_S, FleetMetrics
from workers.runtime.reports import Report
from workers.store.runs import RunStore
from workers.web.exporter import registry_for

ME = f"{socket.gethostname()}:{os.getpid()}"
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[RunStore]:
    with RedisServer(tmp_path) as server:
        yield RunStore(server.url, "relay:")


def _now_ms() -> int:
    return int(time.time() * 1000)


@pytest.fixture
def make_metrics(store: RunStore) -> Iterator[Callable[..., FleetMetrics]]:
    """FleetMetrics on `store` (counts held a minute unless told), stopped after the test."""
    made: list[FleetMetrics] = []

    def make(flush_ms: int = 60_000) -> FleetMetrics:
        made.append(FleetMetrics(store.connection, store.shards, store.people, flush_ms))
        return made[-1]

    yield make
    for metrics in made:
        metrics.stop()


def _scrape(metrics: FleetMetrics) -> Samples:
    text = generate_latest(registry_for(metrics, _now_ms)).decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def _written(store: RunStore) -> dict[str, dict[str, float]]:
    keys = store.connection.keys
    raw = store.connection.redis.hgetall(keys.worker_gauges)
    return {field.decode(): json.loads(value) for field, value in raw.items()}


def test_what_a_worker_holds_is_on_metrics(
    store: RunStore, make_metrics: Callable[..., FleetMetrics]
) -> None:
    metrics = make_metrics()
    metrics.held(7, 100)
    assert _written(store) == {}  # held does no I/O: the flush writes it
    metrics.flush()
    samples = _scrape(metrics)
    assert samples[("relay_worker_calls_in_flight", (("worker", ME),))] == 7
    assert samples[("relay_worker_call_capacity", (("worker", ME),))] == 100
    assert samples[("relay_calls_in_flight", ())] == 7
    assert samples[("relay_call_capacity", ())] == 100
    for quantile in ("0.99", "1"):
        assert samples[("relay_loop_lag_seconds", (("quantile", quantile), ("worker", ME)))] >= 0
    text = generate_latest(registry_for(metrics, _now_ms)).decode()
    for name in ("relay_worker_calls_in_flight", "relay_loop_lag_seconds", "relay_call_capacity"):
        assert f"# TYPE {name} gauge" in text
        assert f"# HELP {name} " in text


def test_the_loop_lag_a_worker_exports(
    store: RunStore, make_metrics: Callable[..., FleetMetrics]
) -> None:
    metrics = make_metrics()
    metrics.held(1, 10)
    process_loop().loop.call_soon_threadsafe(time.sleep, 0.3)  # a callback that holds the loop
    give_up = time.monotonic() + 5
    while process_loop().lag_max() < 0.25 and time.monotonic() < give_up:
        time.sleep(0.02)
    metrics.flush()
    samples = _scrape(metrics)
    assert samples[("relay_loop_lag_seconds", (("quantile", "1"), ("worker", ME)))] >= 0.25
    assert samples[("relay_loop_lag_seconds", (("quantile", "0.99"), ("worker", ME)))] > 0


def test_a_worker_that_ends_no_task_still_reports(
    store: RunStore, make_metrics: Callable[..., FleetMetrics]
) -> None:
    # Counts are held for a minute; the gauges are written every few seconds regardless.
    metrics = make_metrics()
    metrics.count("advance", Report("advanced"))
    metrics.held(3, 10)
    give_up = time.monotonic() + 5 * GAUGES_EVERY_S
    while ME not in _written(store) and time.monotonic() < give_up:
        time.sleep(0.05)
    assert _written(store)[ME]["in_flight"] == 3
    metrics.held(1_000, 1_000)
    while _written(store)[ME]["in_flight"] != 1_000 and time.monotonic() < give_up:
        time.sleep(0.05)
    assert _written(store)[ME]["in_flight"] == 1_000
    assert metrics.totals().steps == {}  # (the counts' interval is their own)


def test_stale_gauges_are_skipped_and_old_ones_deleted(
    store: RunStore, make_metrics: Callable[..., FleetMetrics]
) -> None:
    metrics = make_metrics()
    keys, redis = store.connection.keys, store.connection.redis
    now = _now_ms()

    def gauges(in_flight: int, age_ms: int) -> str:
        value = {"in_flight": in_flight, "capacity": 50, "lag_p99_s": 0.001}
        return json.dumps({**value, "lag_max_s": 0.002, "at_ms": now - age_ms})

    odd_name = 'pod "a"\\b\nc:12'  # a label value Prometheus's format must escape
    written = {
        odd_name: gauges(4, 1_000),
        "busy:7": gauges(6, 29_000),
        "killed:1": gauges(40, 31_000),
        "gone:2": gauges(400, 3_601_000),
        "garbled:3": "not json",
    }
    redis.hset(keys.worker_gauges, mapping=written)
    samples = _scrape(metrics)
    found = {
        dict(labels)["worker"]: value
        for (name, labels), value in samples.items()
        if name == "relay_worker_calls_in_flight"
    }
    assert found == {odd_name: 4, "busy:7": 6}
    assert samples[("relay_calls_in_flight", ())] == 10
    assert samples[("relay_call_capacity", ())] == 100
    lag = "relay_loop_lag_seconds"
    assert samples[(lag, (("quantile", "0.99"), ("worker", odd_name)))] == 0.001
    assert samples[(lag, (("quantile", "1"), ("worker", odd_name)))] == 0.002
    # A stale field stays a while (it may be a stuck worker's); an hour old, it goes.
    assert set(_written_fields(store)) == {odd_name, "busy:7", "killed:1"}


def _written_fields(store: RunStore) -> list[str]:
    keys = store.connection.keys
    return [field.decode() for field in store.connection.redis.hkeys(keys.worker_gauges)]


def test_a_clean_stop_takes_the_worker_off(
    store: RunStore, make_metrics: Callable[..., FleetMetrics]
) -> None:
    metrics = make_metrics(flush_ms=100)  # its flusher writes the gauges every 100 ms
    metrics.held(2, 8)
    metrics.flush()
    assert _written_fields(store) == [ME]
    metrics.stop()
    assert _written_fields(store) == []
    metrics.flush()  # a flush after the stop (its flusher's last) writes no gauges
    time.sleep(0.3)
    assert _written_fields(store) == []
    assert ("relay_calls_in_flight", ()) in _scrape(metrics)
    assert _scrape(metrics)[("relay_calls_in_flight", ())] == 0
