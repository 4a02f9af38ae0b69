"""`/metrics` of relay web: the fleet in Prometheus's text format, read from Redis at each scrape.

    relay_runs{state,waiting_for}                  runs now (the newest 10,000; cached 5 s)
    relay_waiting_on_person{kind}                  plans, calls, questions and budgets pending
    relay_oldest_wait_seconds                      how long the oldest of them has waited
    relay_runs_read                                runs whose state the numbers above count
    relay_steps_total{task,outcome}                tasks done, by name; ok, failed or idle
                                                   (a duplicate or refused message)
    relay_model_calls_total{model,key,outcome}     model calls
    relay_tokens_total{model,key,direction}        tokens, input and output
    relay_cost_usd_total{model,key}                dollars, where models have prices
    relay_model_call_seconds{model}                a histogram of model calls' durations
    relay_tool_calls_total{tool,outcome}           tool calls

Counts come from the workers (`workers.metrics`), so every worker of the fleet
is in them, however many there are; one relay web scrapes them all. Rate-limit
waits and circuit states are not here: Relay has neither yet.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector, CollectorRegistry

from workers.metrics import LATENCY_BUCKETS, MAX_RUNS_SCANNED, FleetMetrics, FleetState

__all__ = ["STATE_CACHE_MS", "RelayCollector", "registry_for"]

STATE_CACHE_MS = 5_000
"""How long one reading of the runs' states serves scrapes (counters are always read fresh)."""


class RelayCollector(Collector):
    """Reads the fleet's state and counters each time Prometheus scrapes."""

    def __init__(self, metrics: FleetMetrics, clock: Callable[[], int]) -> None:
        self._metrics = metrics
        self._clock = clock
        self._cached: tuple[int, FleetState] | None = None
        self._lock = threading.Lock()

    def _fleet_state(self) -> FleetState:
        """The runs' state, read at most once per STATE_CACHE_MS (it reads every record)."""
        now = self._clock()
        with self._lock:
            if self._cached is None or now - self._cached[0] >= STATE_CACHE_MS:
                self._cached = (now, self._metrics.state(now))
            return self._cached[1]

    def collect(self) -> Iterator[Metric]:
        yield from self._state()
        yield from self._counters()

    def _state(self) -> Iterator[Metric]:
        state = self._fleet_state()
        runs = GaugeMetricFamily("relay_runs", "Runs by state", labels=["state", "waiting_for"])
        for (run_state, waiting_for), count in sorted(state.runs.items()):
            runs.add_metric([run_state, waiting_for], count)
        yield runs
        people = GaugeMetricFamily(
            "relay_waiting_on_person", "Plans, calls and questions waiting", labels=["kind"]
        )
        for kind in ("plan", "call", "question", "budget"):
            people.add_metric([kind], state.waiting_on_person.get(kind, 0))
        yield people
        yield GaugeMetricFamily(
            "relay_oldest_wait_seconds",
            "How long the oldest thing waiting on a person has waited",
            value=state.oldest_wait_s,
        )
        yield GaugeMetricFamily(
            "relay_runs_read",
            f"Runs whose state was read (the newest, at most {MAX_RUNS_SCANNED})",
            value=state.scanned,
        )

    def _counters(self) -> Iterator[Metric]:
        totals = self._metrics.totals()
        steps = CounterMetricFamily("relay_steps", "Tasks done", labels=["task", "outcome"])
        for labels, count in sorted(totals.steps.items()):
            steps.add_metric(list(labels), count)
        yield steps
        calls = CounterMetricFamily(
            "relay_model_calls", "Model calls", labels=["model", "key", "outcome"]
        )
        for call_labels, count in sorted(totals.calls.items()):
            calls.add_metric(list(call_labels), count)
        yield calls
        tokens = CounterMetricFamily(
            "relay_tokens", "Tokens used", labels=["model", "key", "direction"]
        )
        for token_labels, count in sorted(totals.tokens.items()):
            tokens.add_metric(list(token_labels), count)
        yield tokens
        cost = CounterMetricFamily("relay_cost_usd", "Dollars spent", labels=["model", "key"])
        for labels, dollars in sorted(totals.cost_usd.items()):
            cost.add_metric(list(labels), dollars)
        yield cost
        yield self._latency(totals.latency, totals.latency_sum)
        tools = CounterMetricFamily("relay_tool_calls", "Tool calls", labels=["tool", "outcome"])
        for labels, count in sorted(totals.tools.items()):
            tools.add_metric(list(labels), count)
        yield tools

    def _latency(self, counts: dict[str, list[int]], sums: dict[str, float]) -> Metric:
        histogram = HistogramMetricFamily(
            "relay_model_call_seconds", "How long model calls took", labels=["model"]
        )
        for model, per_bucket in sorted(counts.items()):
            running, buckets = 0, []
            for top, count in zip([*map(str, LATENCY_BUCKETS), "+Inf"], per_bucket, strict=True):
                running += count
                buckets.append((top, running))
            histogram.add_metric([model], buckets, sums.get(model, 0.0))
        return histogram


def registry_for(metrics: FleetMetrics, clock: Callable[[], int]) -> CollectorRegistry:
    """A registry holding only Relay's collector (not this process's own metrics)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RelayCollector(metrics, clock))
    return registry
