"""OpenTelemetry traces of runs: one trace per run tree, a span per model call and tool call.

Off unless the `otel` extra is installed (`pip install 'relay-agents[otel]'`)
and the process has a tracer provider (set by the app module, or by
`opentelemetry-instrument`); without either, `Telemetry.record` does nothing, and
builds no span that would go nowhere (a step's own time, issue 31).

A run is worked on by many tasks on many workers, and may wait days between
them, so no span can stay open for it. Instead every span of a run tree has
the same parent: a span context derived from the root run's id (`trace_ids`),
so the trace id is the same wherever and whenever a call of the run is made,
with no context carried in messages. Spans are written when the call has
ended, with its real start and end times, and carry the GenAI semantic
conventions' attributes (`gen_ai.operation.name`, `gen_ai.request.model`,
`gen_ai.usage.*`, `gen_ai.tool.*`, `error.type`) and Relay's ids (`relay.*`).
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any
from urllib.parse import urlsplit

from workers.runtime.reports import CallFacts

__all__ = ["Telemetry", "trace_ids"]

log = logging.getLogger(__name__)

try:
    from opentelemetry import trace
    from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, StatusCode, TraceFlags
except ImportError:  # the `otel` extra is not installed: no traces
    trace = None  # type: ignore[assignment]


def trace_ids(root_id: str) -> tuple[int, int]:
    """Return (trace id, parent span id) of a run tree, derived from its root run's id."""
    digest = hashlib.sha256(f"relay-run:{root_id}".encode()).digest()
    trace_id = int.from_bytes(digest[:16], "big") or 1
    span_id = int.from_bytes(digest[16:24], "big") or 1
    return trace_id, span_id


def _no_provider() -> bool:
    """No tracer provider is set (yet), or a no-op one: a span would be dropped unseen.
    (Asked at each call: an app may set its provider after the runtime was made.)"""
    assert trace is not None
    provider = trace.get_tracer_provider()
    return isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider)


class Telemetry:
    """Writes a span for each call, through the process's tracer provider."""

    def __init__(self, model_url: str | None = None) -> None:
        parts = urlsplit(model_url) if model_url else None
        self._server = (parts.hostname, parts.port) if parts and parts.hostname else None

    @property
    def enabled(self) -> bool:
        return trace is not None

    def record(self, facts: CallFacts) -> None:
        """Write the span of one call (nothing without OpenTelemetry); never raises."""
        if trace is None:
            return
        try:
            if not _no_provider():
                self._span(facts)
        except Exception:  # a tracing failure must not fail the task
            log.exception("could not record the span of %s", facts.call_id)

    def _span(self, facts: CallFacts) -> None:
        assert trace is not None
        trace_id, parent_id = trace_ids(facts.root_id)
        parent = SpanContext(
            trace_id, parent_id, is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED)
        )
        context = trace.set_span_in_context(NonRecordingSpan(parent))
        model = facts.kind == "model"
        operation = "chat" if model else "execute_tool"
        span = trace.get_tracer("relay").start_span(
            f"{operation} {facts.name}",
            context=context,
            kind=SpanKind.CLIENT if model else SpanKind.INTERNAL,
            start_time=facts.started_ns,
            attributes=self._attributes(facts, operation),
        )
        if not facts.ok:
            span.set_status(StatusCode.ERROR, facts.error)
        span.end(end_time=max(facts.ended_ns, facts.started_ns))

    def _attributes(self, facts: CallFacts, operation: str) -> dict[str, Any]:
        found: dict[str, Any] = {
            "gen_ai.operation.name": operation,
            "relay.run_id": facts.run_id,
            "relay.root_id": facts.root_id,
            "relay.call_id": facts.call_id,
            "relay.attempt": facts.attempt,
        }
        if facts.key:
            found["relay.key"] = facts.key
        if facts.route:
            found["relay.route"] = facts.route
        if operation == "chat":
            found["gen_ai.provider.name"] = "openai"  # the wire protocol Relay speaks
            found["gen_ai.request.model"] = facts.name
            if self._server is not None:
                found["server.address"] = self._server[0]
                if self._server[1] is not None:
                    found["server.port"] = self._server[1]
            if facts.usage is not None:
                found["gen_ai.usage.input_tokens"] = facts.usage.prompt_tokens
                found["gen_ai.usage.output_tokens"] = facts.usage.completion_tokens
        else:
            found["gen_ai.tool.name"] = facts.name
            found["gen_ai.tool.call.id"] = facts.call_id
            found["gen_ai.tool.type"] = "function"
        if not facts.ok:
            found["error.type"] = "model_failed" if operation == "chat" else "tool_failed"
        return found
