"""relay web's /metrics, scraped from real workers' counters and parsed with Prometheus's
own text parser: runs by state, what waits on a person, steps, model calls, tokens, latency."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.brain import call, final
from tests.support.fleet import fleet
from tests.support.model_server import Reply
from tests.support.redis_server import RedisServer
from tests.support.web import RelayWeb
from workers.engine.records import Usage
from workers.runtime.metrics import FleetMetrics
from workers.runtime.reports import CallFacts, Report
from workers.store.runs import RunStore
from workers.web.exporter import registry_for

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _scrape(web: RelayWeb) -> Samples:
    answer = web.client.get("/metrics")
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/plain; version=")
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(answer.text)
        for sample in family.samples
    }


def _sum(samples: Samples, name: str, **labels: str) -> float:
    wanted = set(labels.items())
    return sum(v for (n, found), v in samples.items() if n == name and wanted <= set(found))


@pytest.mark.timeout(120)
def test_metrics_show_the_fleet(tmp_path: Path) -> None:
    with fleet(tmp_path) as f, RelayWeb(f.env, tmp_path / "web.log") as web:
        f.worker("--pool", "threads", "-c", "4")
        f.brain.script("WAITS", {0: call("delete_note", name="a.txt"), 1: final("deleted")})
        f.brain.script("READS", {0: call("read_note", name="a.txt"), 1: final("read it")})
        f.brain.script("RAISES", {0: call("boom"), 1: final("it failed")})
        waiting = f.relay.start("WAITS: delete a note")
        reads = [f.relay.start(f"READS-{i}: read a note") for i in range(3)]
        failing = f.relay.start("RAISES: call the tool that fails")
        for run_id in [*reads, failing]:
            f.relay.wait(run_id, timeout=30)
        f.until(lambda: f.relay.status(waiting).state == "waiting", what="the run to wait")
        time.sleep(1.1)  # so the oldest wait is at least a second old

        samples = _scrape(web)
        assert _sum(samples, "relay_runs", state="waiting", waiting_for="call") == 1
        assert _sum(samples, "relay_runs", state="finished") == 4
        # How the finished ones ended: the tool that raised did not fail its run.
        assert _sum(samples, "relay_runs", state="finished", outcome="done") == 4
        assert _sum(samples, "relay_waiting_on_person", kind="call") == 1
        assert _sum(samples, "relay_waiting_on_person", kind="plan") == 0
        assert 1 <= _sum(samples, "relay_oldest_wait_seconds") < 60

        # Each finished run made two model calls and one tool call; the waiting one, one call.
        model_calls = _sum(samples, "relay_model_calls_total", model="default", outcome="ok")
        assert model_calls == 4 * 2 + 1
        assert _sum(samples, "relay_steps_total", task="call_model", outcome="ok") == model_calls
        assert _sum(samples, "relay_steps_total", task="run_tool", outcome="ok") == 3
        assert _sum(samples, "relay_steps_total", task="run_tool", outcome="failed") == 1
        assert _sum(samples, "relay_tool_calls_total", tool="read_note", outcome="ok") == 3
        assert _sum(samples, "relay_tool_calls_total", tool="boom", outcome="failed") == 1
        assert _sum(samples, "relay_steps_total", task="advance") >= 5
        served = f.model.usage_total()
        assert _sum(samples, "relay_tokens_total", direction="input") == served[0]
        assert _sum(samples, "relay_tokens_total", direction="output") == served[1]
        assert _sum(samples, "relay_tokens_total", route="default", key="notes") == sum(served)
        count = _sum(samples, "relay_model_call_seconds_count", model="default", route="default")
        assert count == model_calls
        assert _sum(samples, "relay_model_call_seconds_bucket", le="+Inf") == model_calls
        assert 0 < _sum(samples, "relay_model_call_seconds_sum", route="default") < 60
        # The one route RELAY_MODEL_URL makes, as its limits in Redis say it is.
        assert _sum(samples, "relay_route_circuit", route="default", state="closed") == 1
        assert _sum(samples, "relay_route_failures", route="default") == 0
        assert _sum(samples, "relay_route_in_flight", route="default") == 0

        f.model.set_responder(lambda _: Reply(status=400, text="no"))
        f.relay.approve(waiting, "call-1")
        f.relay.wait(waiting, timeout=30)
        # The runs' states are read at most every 5 s (each scrape would read every record).
        f.until(lambda: _sum(_scrape(web), "relay_runs", state="waiting") == 0, what="a rescan")
        after = _scrape(web)
        assert _sum(after, "relay_runs", state="finished") == 5
        assert _sum(after, "relay_runs_read") == 5
        assert _sum(after, "relay_oldest_wait_seconds") == 0
        assert _sum(after, "relay_model_calls_total", outcome="failed") >= 1
        # ... counted on the route that failed, and the run that stopped for it as failed.
        assert _sum(after, "relay_model_calls_total", route="default", outcome="failed") >= 1
        assert _sum(after, "relay_model_calls_total", route="-", outcome="failed") == 0
        assert _sum(after, "relay_runs", state="finished", outcome="failed") == 1
        assert _sum(after, "relay_steps_total", task="call_model", outcome="failed") >= 1


def test_cost_and_tokens_are_counted_by_model_and_key(tmp_path: Path) -> None:
    with RedisServer(tmp_path) as server:
        store = RunStore(server.url, "relay:")
        # Held in the process (one write for them all), until the flush.
        metrics = FleetMetrics(store.connection, store.shards, store.people, flush_ms=60_000)
        for key, micro in (("tenant-a", 1_250), ("tenant-a", 750), ("tenant-b", 40)):
            usage = Usage(prompt_tokens=100, completion_tokens=20, cost_micro=micro)
            took_2s = (0, 2_000_000_000)
            facts = CallFacts(
                "model", "r", "r", "m1", "big", key, *took_2s, True, usage=usage, route="primary"
            )
            metrics.count("call_model", Report("model call m1 replied", call=facts))
        metrics.count("call_model", Report("m2: waits 900 ms for a model route", waited=True))
        assert metrics.totals().steps == {}
        metrics.flush()
        text = generate_latest(registry_for(metrics, lambda: 0)).decode()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    on = (("model", "big"), ("route", "primary"))
    assert samples[("relay_cost_usd_total", (("key", "tenant-a"), *on))] == 0.002
    assert samples[("relay_cost_usd_total", (("key", "tenant-b"), *on))] == 0.00004
    input_a = (("direction", "input"), ("key", "tenant-a"), *on)
    assert samples[("relay_tokens_total", input_a)] == 200
    assert samples[("relay_model_call_seconds_bucket", (("le", "2.5"), *on))] == 3
    assert samples[("relay_model_call_seconds_bucket", (("le", "1.0"), *on))] == 0
    assert samples[("relay_model_call_seconds_sum", on)] == 6.0
    assert samples[("relay_rate_limit_waits_total", (("task", "call_model"),))] == 1
    waiting = (("outcome", "waiting"), ("task", "call_model"))
    assert samples[("relay_steps_total", waiting)] == 1


@pytest.mark.parametrize("flush_ms", [0, 100])
def test_counts_are_written_within_the_flush_interval(tmp_path: Path, flush_ms: int) -> None:
    with RedisServer(tmp_path) as server:
        store = RunStore(server.url, "relay:")
        metrics = FleetMetrics(store.connection, store.shards, store.people, flush_ms=flush_ms)
        for _ in range(3):
            metrics.count("advance", Report("advanced"))
        if flush_ms == 0:  # each task writes its own
            assert metrics.totals().steps[("advance", "ok")] == 3
            return
        give_up = time.monotonic() + 50 * flush_ms / 1000  # (a busy machine: 50 intervals)
        while metrics.totals().steps[("advance", "ok")] < 3 and time.monotonic() < give_up:
            time.sleep(0.02)
        assert metrics.totals().steps[("advance", "ok")] == 3
        server.stop()  # a write that fails is logged and dropped; the thread goes on
        metrics.count("advance", Report("advanced"))
        time.sleep(3 * flush_ms / 1000)
        server.start()  # (no persistence: it starts empty)
        metrics.count("advance", Report("advanced"))
        give_up = time.monotonic() + 50 * flush_ms / 1000
        while metrics.totals().steps[("advance", "ok")] < 1 and time.monotonic() < give_up:
            time.sleep(0.02)
        assert metrics.totals().steps[("advance", "ok")] in (1, 2)


@pytest.mark.parametrize("pool", ["prefork", "threads"])
def test_a_worker_that_stops_writes_the_counts_it_held(tmp_path: Path, pool: str) -> None:
    with fleet(tmp_path) as f:
        # Held for a minute: only the worker's stopping can write them in this test.
        worker = f.worker("--pool", pool, "-c", "2", env={"RELAY_METRICS_FLUSH_MS": "60000"})
        f.brain.script("HELD", {0: call("read_note", name="a.txt"), 1: final("read it")})
        run_id = f.relay.start("HELD: read a note")
        assert f.relay.wait(run_id, timeout=30).summary == "read it"
        # The run is finished once its last step is saved; the task that saved it counts
        # that step just after. Stopped before then, the worker holds no count of it yet.
        f.until(lambda: _tasks_ended(worker.output()), 10, what="its tasks' ends")
        store = f.relay.store
        metrics = FleetMetrics(store.connection, store.shards, store.people)
        assert metrics.totals().tools == {}
        worker.stop()
        totals = metrics.totals()
    assert totals.tools == {("read_note", "ok"): 1}
    assert sum(n for labels, n in totals.calls.items() if labels[-1] == "ok") == 2
    assert sum(n for (task, _), n in totals.steps.items() if task == "run_tool") == 1


def _tasks_ended(log: str) -> bool:
    """Whether every task the worker received has ended: its result line is in its log,
    or, for a task whose model call was carried past it (its result line says it sends
    no final event, and that the call is carried), the line of the call's end."""
    received = log.count("] received")
    carried = sum(
        ": <no final event here: " in line and "held on the event loop" in line
        for line in log.splitlines()
    )
    returned = log.count(" succeeded in ") - carried
    ended = returned + log.count(" ended with the call it carried: ")
    return received > 0 and ended == received
