"""OpenTelemetry traces from real worker processes, exported over OTLP/HTTP to a receiver in
this test, decoded with opentelemetry-proto: the application's request span and every
delivery of its turn, on whichever worker, are one trace, a SIGKILLed worker's included."""

from __future__ import annotations

import os
import signal
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

import pytest

pytest.importorskip("opentelemetry.sdk", reason="needs the 'otel' extra")
pytest.importorskip("opentelemetry.proto", reason="needs opentelemetry-proto (the test extra)")

from opentelemetry import trace
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from durable_agent import start_turn
from durable_agent.testing.harness import wait_until

if TYPE_CHECKING:
    from conftest import Spawn, Stack


@dataclass
class ReceivedSpan:
    trace_id: str
    span_id: str
    parent_span_id: str
    name: str
    service: str
    attributes: dict[str, Any]


class OtlpReceiver:
    """A small OTLP/HTTP trace receiver: POST /v1/traces, protobuf in, protobuf out."""

    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.requests = 0
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                receiver._add(request)
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def _add(self, request: ExportTraceServiceRequest) -> None:
        found = []
        for resource_spans in request.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    found.append(
                        ReceivedSpan(
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_span_id=span.parent_span_id.hex(),
                            name=span.name,
                            service=str(resource.get("service.name")),
                            attributes={a.key: _value(a.value) for a in span.attributes},
                        )
                    )
        with self._lock:
            self.requests += 1
            self.spans.extend(found)

    def of_trace(self, trace_id: str) -> list[ReceivedSpan]:
        with self._lock:
            return [s for s in self.spans if s.trace_id == trace_id]


def _value(value: Any) -> Any:
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind else None


@pytest.fixture
def otlp() -> Iterator[OtlpReceiver]:
    receiver = OtlpReceiver()
    receiver.thread.start()
    try:
        yield receiver
    finally:
        receiver.server.shutdown()
        receiver.server.server_close()


def _otel_env(otlp: OtlpReceiver, service: str) -> dict[str, str]:
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": otlp.endpoint,
        "OTEL_SERVICE_NAME": service,
        "OTEL_BSP_SCHEDULE_DELAY": "100",
    }


def _step_spans(spans: list[ReceivedSpan], epoch: int) -> dict[int, ReceivedSpan]:
    return {
        s.attributes["durable_agent.step"]: s
        for s in spans
        if "durable_agent.step" in s.attributes and s.attributes["durable_agent.epoch"] == epoch
    }


def test_a_turn_killed_mid_way_and_finished_elsewhere_is_one_trace(
    stack: Stack, spawn: Spawn, otlp: OtlpReceiver, otel_spans: InMemorySpanExporter
) -> None:
    """The application starts a turn inside its request span. A prefork worker runs steps
    0-1 and is SIGKILLed (main process and child) while the model holds step 2; a second
    worker (solo) takes the turn over and finishes it. Every span either worker exported is
    in the application's trace: the first worker's steps (epoch 1), the second's delivery
    (epoch 2, its parent the request span) and its steps, read back or run, with the GenAI
    attributes of the model calls and the labels of the tools."""
    settings = stack.settings.model_copy(
        update={"tracing": True, "sweep_interval_seconds": 0.1, "lease_seconds": 3.0}
    )
    first = spawn(settings=settings, pool="prefork", **_otel_env(otlp, "worker-a"))
    wait_until(lambda: len(first.children()) == 1, 20, "the pool child")
    stack.on_first_request(stack.model.hold)  # step 0 is answered; step 2 is held

    tracer = trace.get_tracer("the-application")
    with tracer.start_as_current_span("POST /notes") as request_span:
        turn_id = start_turn(f"s-trace-{uuid.uuid4().hex[:6]}", stack.message, settings=settings)
    trace_id = format(request_span.get_span_context().trace_id, "032x")
    request_span_id = format(request_span.get_span_context().span_id, "016x")

    stack.model.wait_for_waiting(1, timeout=30)  # step 2 (a model call) is held
    wait_until(
        lambda: set(_step_spans(otlp.of_trace(trace_id), 1)) >= {0, 1},
        20,
        "the first worker's spans of steps 0 and 1",
    )
    for child in first.children():
        os.kill(child, signal.SIGKILL)
    first.kill()
    stack.model.release()

    spawn(settings=settings, **_otel_env(otlp, "worker-b"))
    turn = stack.wait_turn(turn_id, 60)
    assert turn.status == "done" and turn.reply == stack.clean_reply, stack.report(turn_id)
    assert turn.crashes == 1, stack.report(turn_id)

    def finished() -> bool:
        return any(
            s.name == "durable_agent.delivery" and s.attributes.get("durable_agent.outcome")
            for s in otlp.of_trace(trace_id)
        )

    wait_until(finished, 20, "the second worker's delivery span")
    spans = otlp.of_trace(trace_id)
    assert {s.trace_id for s in spans} == {trace_id}
    deliveries = [s for s in spans if s.name == "durable_agent.delivery"]
    done = [d for d in deliveries if d.attributes.get("durable_agent.outcome") == "done"]
    assert len(done) == 1, deliveries
    delivery = done[0]
    assert delivery.service == "worker-b"
    assert delivery.parent_span_id == request_span_id  # a child of the request span
    assert delivery.attributes["durable_agent.epoch"] == 2
    assert delivery.attributes["durable_agent.turn_id"] == turn_id
    assert delivery.attributes["durable_agent.crashes"] == 1

    first_steps = _step_spans(spans, 1)
    assert {first_steps[0].service, first_steps[1].service} == {"worker-a"}
    assert first_steps[0].attributes["durable_agent.step.ran"] is True
    assert 2 not in first_steps  # held at the model when the worker was killed

    second_steps = _step_spans(spans, 2)
    assert sorted(second_steps) == [0, 1, 2, 3, 4], sorted(second_steps)
    for step in second_steps.values():
        assert step.parent_span_id == delivery.span_id
        assert step.service == "worker-b"
    assert [second_steps[n].attributes["durable_agent.step.read_back"] for n in range(5)] == [
        True,
        True,
        False,
        False,
        False,
    ]
    model = second_steps[2]
    assert model.name.startswith("chat")
    assert model.attributes["gen_ai.operation.name"] == "chat"
    assert model.attributes["gen_ai.request.model"] == settings.model
    assert model.attributes["gen_ai.system"] == "openai"
    assert model.attributes["gen_ai.usage.input_tokens"] > 0
    assert model.attributes["gen_ai.usage.output_tokens"] > 0
    send = second_steps[3]
    assert send.name == "execute_tool send_email"
    assert send.attributes["gen_ai.tool.name"] == "send_email"
    assert send.attributes["durable_agent.tool.replay"] == "never"
    assert send.attributes["durable_agent.tool.uncertain"] is False
    assert second_steps[1].attributes["durable_agent.tool.replay"] == "safe"
    assert len(stack.inbox.messages) == 1
    assert any(
        s.name == "POST /notes" and format(s.context.trace_id, "032x") == trace_id
        for s in otel_spans.get_finished_spans()
    )


def test_an_uncertain_effect_is_marked_on_its_span(
    stack: Stack, spawn: Spawn, otlp: OtlpReceiver, otel_spans: InMemorySpanExporter
) -> None:
    """CRASH_AT=send_email:after_run: the email went out, its outcome was never recorded.
    The worker that takes the turn over answers the call as "may or may not have happened":
    its span says uncertain, and it is in the same trace as the request."""
    settings = stack.settings.model_copy(
        update={"tracing": True, "sweep_interval_seconds": 0.1, "lease_seconds": 3.0}
    )
    first = spawn(settings=settings, CRASH_AT="send_email:after_run", **_otel_env(otlp, "worker-a"))
    tracer = trace.get_tracer("the-application")
    with tracer.start_as_current_span("POST /notes") as request_span:
        turn_id = start_turn(f"s-unc-{uuid.uuid4().hex[:6]}", stack.message, settings=settings)
    trace_id = format(request_span.get_span_context().trace_id, "032x")
    stack.wait_exit(first)
    spawn(settings=settings, **_otel_env(otlp, "worker-b"))
    turn = stack.wait_turn(turn_id, 60)
    assert turn.status == "done", stack.report(turn_id)

    def uncertain() -> list[ReceivedSpan]:
        return [
            s
            for s in otlp.of_trace(trace_id)
            if s.attributes.get("gen_ai.tool.name") == "send_email"
            and s.attributes.get("durable_agent.tool.uncertain") is True
        ]

    wait_until(lambda: bool(uncertain()), 20, "the uncertain send_email span")
    span = uncertain()[0]
    assert span.attributes["durable_agent.epoch"] == 2
    assert span.attributes["durable_agent.step.ran"] is True  # answered, not read back


def test_the_trace_context_travels_in_the_message_headers(
    stack: Stack, spawn: Spawn, otlp: OtlpReceiver, otel_spans: InMemorySpanExporter
) -> None:
    """A turn recorded with no trace context, sent with one in its message's headers only:
    the worker's delivery joins that trace (the context came through Celery, not Postgres).
    And agent_turn.delay() inside a span: its delivery is a child of that span."""
    import json

    from durable_agent.runtime import Runtime

    settings = stack.settings.model_copy(update={"tracing": True})
    spawn(settings=settings, **_otel_env(otlp, "worker-h"))
    runtime = Runtime(settings)
    try:
        turn = runtime.journal.create_turn(f"s-hdr-{uuid.uuid4().hex[:6]}", stack.message)
        assert runtime.journal.trace_context(turn.turn_id) is None
        trace_id, span_id = uuid.uuid4().hex, uuid.uuid4().hex[:16]
        headers = {"traceparent": f"00-{trace_id}-{span_id}-01"}
        runtime.enqueue(turn.session_id, turn.turn_id, turn.queue, json.dumps(headers))
        assert stack.wait_turn(turn.turn_id, 40).status == "done"

        tracer = trace.get_tracer("the-application")
        with tracer.start_as_current_span("POST /delay") as request_span:
            result = runtime.celery.tasks["durable_agent.agent_turn"].delay(
                f"s-delay-{uuid.uuid4().hex[:6]}", stack.message
            )
        assert stack.wait_turn(result.id, 40).status == "done"
    finally:
        runtime.close()

    def delivery_of(trace_hex: str) -> list[ReceivedSpan]:
        return [
            s
            for s in otlp.of_trace(trace_hex)
            if s.name == "durable_agent.delivery" and s.attributes.get("durable_agent.outcome")
        ]

    wait_until(lambda: bool(delivery_of(trace_id)), 20, "the delivery span of the header's trace")
    (delivery,) = delivery_of(trace_id)
    assert delivery.parent_span_id == span_id
    assert delivery.attributes["durable_agent.turn_id"] == turn.turn_id

    context = request_span.get_span_context()
    delayed = format(context.trace_id, "032x")
    wait_until(lambda: bool(delivery_of(delayed)), 20, "the delivery span of agent_turn")
    (delivery,) = delivery_of(delayed)
    assert delivery.parent_span_id == format(context.span_id, "016x")
    assert delivery.attributes["durable_agent.turn_id"] == result.id
