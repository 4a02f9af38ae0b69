"""`/metrics` of relay web: the fleet in Prometheus's text format, read from Redis at each scrape.

    relay_runs{state,waiting_for,outcome}            runs now (the newest 10,000; cached 5 s);
                                                     outcome: done, failed, cancelled, declined
    relay_runs_read                                  how many runs the numbers above count
    relay_waiting_on_person{kind}                    plans, calls, questions, budgets pending
    relay_oldest_wait_seconds                        how long the oldest of them has waited
    relay_steps_total{task,outcome}                  tasks, by name: ok, failed, idle (a
                                                     duplicate or refused message) or waiting
    relay_model_calls_total{model,route,key,outcome} model calls
    relay_tokens_total{model,route,key,direction}    tokens, input and output
    relay_cost_usd_total{model,route,key}            dollars, where models have prices
    relay_model_call_seconds{model,route}            a histogram of model calls' durations
    relay_rate_limit_waits_total{task}               calls sent again later: no route had room
    relay_tool_calls_total{tool,outcome}             tool calls
    relay_held_outcomes_total{outcome}               outcomes held through a Redis outage:
                                                     saved once it was back, or lost
    relay_route_circuit{route,state}                 1 for each route's circuit state now
    relay_route_failures{route}                      failures in a row (the circuit opens at 5)
    relay_route_paused{route}                        1 while a 429 pauses the route
    relay_route_in_flight{route}, relay_route_waiting{route}   calls on it, calls queued for it
    relay_worker_calls_in_flight{worker}             model calls a worker process's loop holds
    relay_worker_call_capacity{worker}               the most it may hold (RELAY_MODEL_CARRIED)
    relay_loop_lag_seconds{worker,quantile}          how late its loop ran a timer over the last
                                                     minute: quantile 0.99, and 1 (the max)
    relay_calls_in_flight, relay_call_capacity       the same two, summed over the workers:
                                                     the ratio an autoscaler scales on
                                                     (docs/autoscaling.md)

Counts come from the workers (`workers.runtime.metrics`), so every worker of the fleet
is in them, however many there are; one relay web scrapes them all. The routes'
states are `Relay.route_states()`, read from their limits in Redis. A worker process
is `<host>:<pid>`, as it last said within GAUGES_FRESH_MS (30 s): one that was killed,
or has not written for that long, is in none of the worker gauges.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Sequence

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector, CollectorRegistry

from workers.model.limits import RouteState
from workers.runtime.metrics import (
    LATENCY_BUCKETS,
    MAX_RUNS_SCANNED,
    FleetMetrics,
    FleetState,
    WorkerGauges,
)

__all__ = ["STATE_CACHE_MS", "RelayCollector", "registry_for"]

STATE_CACHE_MS = 5_000
"""How long one reading of the runs' states serves scrapes (counters are always read fresh)."""


def _counter(
    name: str, text: str, labels: list[str], values: Iterable[tuple[tuple[str, ...], float]]
) -> Metric:
    family = CounterMetricFamily(name, text, labels=labels)
    for found, value in sorted(values):
        family.add_metric(list(found), value)
    return family


class RelayCollector(Collector):
    """Reads the fleet's state and counters each time Prometheus scrapes."""

    def __init__(
        self,
        metrics: FleetMetrics,
        clock: Callable[[], int],
        route_states: Callable[[], Sequence[RouteState]] = tuple,
    ) -> None:
        self._metrics = metrics
        self._clock = clock
        self._read_routes = route_states
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
        yield from self._routes()
        yield from _workers(self._metrics.worker_gauges(self._clock()))

    def _state(self) -> Iterator[Metric]:
        state = self._fleet_state()
        runs = GaugeMetricFamily(
            "relay_runs", "Runs by state", labels=["state", "waiting_for", "outcome"]
        )
        for labels, count in sorted(state.runs.items()):
            runs.add_metric(list(labels), count)
        yield runs
        yield GaugeMetricFamily(
            "relay_runs_read",
            f"Runs whose state was read (the newest, at most {MAX_RUNS_SCANNED})",
            value=state.scanned,
        )
        people = GaugeMetricFamily(
            "relay_waiting_on_person", "What waits on a person, by kind", labels=["kind"]
        )
        for kind in ("plan", "call", "question", "budget"):
            people.add_metric([kind], state.waiting_on_person.get(kind, 0))
        yield people
        yield GaugeMetricFamily(
            "relay_oldest_wait_seconds",
            "How long the oldest thing waiting on a person has waited",
            value=state.oldest_wait_s,
        )

    def _counters(self) -> Iterator[Metric]:
        totals = self._metrics.totals()
        spent = ["model", "route", "key"]
        yield _counter("relay_steps", "Tasks done", ["task", "outcome"], totals.steps.items())
        yield _counter(
            "relay_model_calls", "Model calls", [*spent, "outcome"], totals.calls.items()
        )
        yield _counter("relay_tokens", "Tokens used", [*spent, "direction"], totals.tokens.items())
        yield _counter("relay_cost_usd", "Dollars spent", spent, totals.cost_usd.items())
        yield self._latency(totals.latency, totals.latency_sum)
        waits = [((task,), count) for task, count in totals.waits.items()]
        yield _counter(
            "relay_rate_limit_waits", "Calls sent again later: no route had room", ["task"], waits
        )
        yield _counter("relay_tool_calls", "Tool calls", ["tool", "outcome"], totals.tools.items())
        held = [((outcome,), count) for outcome, count in totals.held.items()]
        yield _counter(
            "relay_held_outcomes",
            "Call outcomes a worker held through a Redis outage, by what became of them",
            ["outcome"],
            held,
        )

    def _latency(
        self, counts: dict[tuple[str, str], list[int]], sums: dict[tuple[str, str], float]
    ) -> Metric:
        histogram = HistogramMetricFamily(
            "relay_model_call_seconds", "How long model calls took", labels=["model", "route"]
        )
        for labels, per_bucket in sorted(counts.items()):
            running, buckets = 0, []
            for top, count in zip([*map(str, LATENCY_BUCKETS), "+Inf"], per_bucket, strict=True):
                running += count
                buckets.append((top, running))
            histogram.add_metric(list(labels), buckets, sums.get(labels, 0.0))
        return histogram

    def _routes(self) -> Iterator[Metric]:
        states = self._read_routes()
        if not states:
            return
        circuit = GaugeMetricFamily(
            "relay_route_circuit", "Each route's circuit state", labels=["route", "state"]
        )
        gauges = {
            name: GaugeMetricFamily(f"relay_route_{name}", text, labels=["route"])
            for name, text in (
                ("failures", "Failures in a row"),
                ("paused", "1 while a 429 pauses the route"),
                ("in_flight", "Calls on the route now"),
                ("waiting", "Calls queued for the route's capacity"),
            )
        }
        for state in states:
            circuit.add_metric([state.name, state.circuit], 1)
            gauges["failures"].add_metric([state.name], state.failures)
            gauges["paused"].add_metric([state.name], 1 if state.paused_until_ms else 0)
            gauges["in_flight"].add_metric([state.name], state.in_flight)
            gauges["waiting"].add_metric([state.name], state.waiting)
        yield circuit
        yield from gauges.values()


def _workers(found: Sequence[WorkerGauges]) -> Iterator[Metric]:
    """What each worker process holds now, and the fleet's sums of it."""
    in_flight = GaugeMetricFamily(
        "relay_worker_calls_in_flight",
        "Model calls the worker process's event loop holds",
        labels=["worker"],
    )
    capacity = GaugeMetricFamily(
        "relay_worker_call_capacity",
        "The most model calls the worker process's event loop may hold",
        labels=["worker"],
    )
    lag = GaugeMetricFamily(
        "relay_loop_lag_seconds",
        "How late the worker process's event loop ran a timer over the last minute",
        labels=["worker", "quantile"],
    )
    for gauges in found:
        in_flight.add_metric([gauges.worker], gauges.in_flight)
        capacity.add_metric([gauges.worker], gauges.capacity)
        lag.add_metric([gauges.worker, "0.99"], gauges.lag_p99_s)
        lag.add_metric([gauges.worker, "1"], gauges.lag_max_s)
    yield from (in_flight, capacity, lag)
    yield GaugeMetricFamily(
        "relay_calls_in_flight",
        "Model calls the fleet's worker processes hold (scale on this / relay_call_capacity)",
        value=sum(gauges.in_flight for gauges in found),
    )
    yield GaugeMetricFamily(
        "relay_call_capacity",
        "The most model calls the fleet's worker processes may hold",
        value=sum(gauges.capacity for gauges in found),
    )


def registry_for(
    metrics: FleetMetrics,
    clock: Callable[[], int],
    route_states: Callable[[], Sequence[RouteState]] = tuple,
) -> CollectorRegistry:
    """A registry holding only Relay's collector (not this process's own metrics);
    `route_states` reads the model routes' states (`Relay.route_states`)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RelayCollector(metrics, clock, route_states))
    return registry
