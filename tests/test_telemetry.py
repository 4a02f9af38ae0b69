"""OpenTelemetry: one trace per run across workers and resumes, a span per model call and
tool call with the GenAI semantic conventions' attributes, checked with the SDK's own
in-memory exporter. The workers here run in this process (Celery's embedded worker),
so their spans reach the exporter; a worker is stopped and another started while a run
waits for a person, and the run's spans stay in one trace."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from celery.contrib.testing.worker import start_worker
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from tests.support.brain import call, final
from tests.support.fleet import Fleet, fleet
from workers.runtime.telemetry import trace_ids

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)  # once per process: this module is its only setter
    yield exporter
    provider.shutdown()


def _worker(f: Fleet) -> object:
    return start_worker(
        f.relay.celery,
        pool="threads",
        concurrency=4,
        perform_ping_check=False,
        loglevel="WARNING",
        no_tick=True,  # (its tick thread outlived it, logging to stderr once Redis was gone)
    )


def _of(exporter: InMemorySpanExporter, run_id: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.attributes["relay.root_id"] == run_id]


@pytest.mark.timeout(120)
def test_one_trace_per_run_across_workers_and_resumes(
    tmp_path: Path, spans: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RELAY_TEST_DIR", str(tmp_path))  # the tools run in this process
    with fleet(tmp_path) as f:
        f.brain.script("OTEL-1", {0: call("delete_note", name="x.txt"), 1: final("deleted")})
        f.brain.script("OTEL-2", {0: call("boom"), 1: final("it failed")})
        with _worker(f):
            first = f.relay.start("OTEL-1: delete a note")
            f.until(lambda: f.relay.status(first).state == "waiting", what="the approval")
            second = f.relay.start("OTEL-2: the tool that fails")
            f.relay.wait(second, timeout=30)
        with _worker(f):  # another worker picks the run up once a person decides
            f.relay.approve(first, "call-1")
            assert f.relay.wait(first, timeout=30).summary == "deleted"
        assert f.ledger() == ["delete_note x.txt"]

    mine = _of(spans, first)
    assert sorted(s.name for s in mine) == [
        "chat default",
        "chat default",
        "execute_tool delete_note",
    ]
    trace_id, parent_id = trace_ids(first)
    assert {s.context.trace_id for s in mine} == {trace_id}
    assert {s.parent.span_id for s in mine if s.parent} == {parent_id}
    assert {s.context.trace_id for s in _of(spans, second)} == {trace_ids(second)[0]}
    assert trace_ids(second)[0] != trace_id

    chat = [s for s in mine if s.name == "chat default"]
    for span in chat:
        attributes = span.attributes
        assert span.kind is SpanKind.CLIENT
        assert attributes["gen_ai.operation.name"] == "chat"
        assert attributes["gen_ai.request.model"] == "default"
        assert attributes["gen_ai.provider.name"] == "openai"
        assert attributes["server.address"] == "127.0.0.1"
        assert attributes["gen_ai.usage.input_tokens"] > 0
        assert attributes["gen_ai.usage.output_tokens"] > 0
        assert attributes["relay.run_id"] == first
        assert span.end_time >= span.start_time
    assert {s.attributes["relay.call_id"] for s in chat} == {"m1", "m3"}
    (tool,) = [s for s in mine if s.name.startswith("execute_tool")]
    assert tool.attributes["gen_ai.operation.name"] == "execute_tool"
    assert tool.attributes["gen_ai.tool.name"] == "delete_note"
    assert tool.attributes["gen_ai.tool.call.id"] == "call-1"
    assert tool.status.status_code is StatusCode.UNSET

    (failed,) = [s for s in _of(spans, second) if s.name == "execute_tool boom"]
    assert failed.status.status_code is StatusCode.ERROR
    assert failed.attributes["error.type"] == "tool_failed"
    assert "RuntimeError: kaboom" in (failed.status.description or "")


def test_without_opentelemetry_nothing_is_traced() -> None:
    probe = (
        "import sys; sys.modules['opentelemetry'] = None\n"
        "from workers.runtime.reports import CallFacts\n"
        "from workers.runtime.telemetry import Telemetry\n"
        "t = Telemetry('http://127.0.0.1:1/v1')\n"
        "t.record(CallFacts('model', 'r', 'r', 'm1', 'default', '', 0, 1, True))\n"
        "print(t.enabled)"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "False"
    assert out.stderr == ""


def test_without_a_tracer_provider_no_span_is_built() -> None:
    """OpenTelemetry is installed, but no provider is set: a span would be dropped, so none
    is built (it cost a step tens of µs); once the app sets one, calls are traced."""
    probe = (
        "from opentelemetry import trace\n"
        "from opentelemetry.sdk.trace import TracerProvider\n"
        "from workers.runtime.reports import CallFacts\n"
        "from workers.runtime.telemetry import Telemetry\n"
        "Telemetry._span = lambda self, facts: print('span', facts.call_id)\n"
        "t = Telemetry('http://127.0.0.1:1/v1')\n"
        "t.record(CallFacts('model', 'r', 'r', 'm1', 'default', '', 0, 1, True))\n"
        "trace.set_tracer_provider(TracerProvider())\n"
        "t.record(CallFacts('model', 'r', 'r', 'm2', 'default', '', 0, 1, True))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.splitlines() == ["span m2"]
    assert out.stderr == ""
