"""Traces of turns in-process, with the SDK's in-memory exporter: the application's span is
the parent of each delivery (through the trace context stored with the turn, as a message
the sweeper re-sends carries it), each step a child of its delivery, read back or run."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

import pytest
from inprocess import CrashAt, SimulatedCrash

pytest.importorskip("opentelemetry.sdk", reason="needs the 'otel' extra")

from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from durable_agent.delivery.celery_tasks import handle_delivery
from durable_agent.delivery.doorbell import trace_headers
from durable_agent.runtime import Runtime
from durable_agent.settings import Settings
from durable_agent.step.tools import load_tools
from durable_agent.testing import ScriptedModelServer, SmtpInbox

if TYPE_CHECKING:
    from conftest import DatabaseClock

MESSAGE = "Please email the note launch to ada@example.com"


@pytest.fixture
def traced(settings: Settings, model_server: ScriptedModelServer, inbox: SmtpInbox) -> Runtime:
    runtime = Runtime(
        settings.model_copy(
            update={"openai_base_url": model_server.base_url, "tracing": True, "lease_seconds": 0.5}
        ),
        tools=load_tools(["durable_agent_examples.email_tools"]),
    )
    yield runtime  # type: ignore[misc]
    runtime.close()


def _by_name(spans: Any, name: str) -> list[Any]:
    return [s for s in spans if s.name == name]


def test_deliveries_and_steps_are_spans_of_the_applications_trace(
    traced: Runtime, otel_spans: InMemorySpanExporter, clock: DatabaseClock, inbox: SmtpInbox
) -> None:
    tracer = trace.get_tracer("the-application")
    with tracer.start_as_current_span("POST /notes") as request:
        turn_id = traced.start_turn("s-traced", MESSAGE)
    context = request.get_span_context()
    stored = traced.journal.trace_context(turn_id)
    headers = trace_headers(stored)
    assert headers is not None and set(headers) == {"traceparent"}
    assert headers["traceparent"].startswith(f"00-{context.trace_id:032x}-{context.span_id:016x}-")

    # the first delivery dies after send_email ran (on a thread: another lease owner)
    doomed = traced.build_turn_worker(faults=CrashAt((3, "after_run")))
    caught: list[BaseException] = []

    def first() -> None:
        try:
            with traced.tracing.delivery(  # type: ignore[union-attr]
                turn_id, None, lambda: traced.journal.trace_context(turn_id)
            ):
                doomed.handle(turn_id)
        except BaseException as error:
            caught.append(error)

    thread = threading.Thread(target=first)
    thread.start()
    thread.join(60)
    assert len(caught) == 1 and isinstance(caught[0], SimulatedCrash)
    clock.advance(5.0)  # the dead claim's lease runs out

    # the second delivery, as the task runs it (no headers in hand: the stored context)
    assert handle_delivery(traced, turn_id) == "done"
    assert inbox.count == 1

    spans = otel_spans.get_finished_spans()
    assert {s.context.trace_id for s in spans} == {context.trace_id}
    deliveries = _by_name(spans, "durable_agent.delivery")
    assert len(deliveries) == 2
    assert all(d.parent.span_id == context.span_id for d in deliveries)
    crashed, finished = sorted(deliveries, key=lambda d: d.attributes["durable_agent.epoch"])
    # (a real crash ends no span: a SIGKILLed worker exports only the steps it finished; the
    # simulated one, a BaseException, goes through the spans without an outcome)
    assert "durable_agent.outcome" not in crashed.attributes
    assert finished.attributes["durable_agent.outcome"] == "done"
    assert finished.attributes["durable_agent.crashes"] == 1
    assert finished.attributes["durable_agent.resumed"] is True

    steps = [s for s in spans if "durable_agent.step" in s.attributes]
    second = {
        s.attributes["durable_agent.step"]: s
        for s in steps
        if s.parent.span_id == finished.context.span_id
    }
    # the model checks the state after the uncertain call (list_sent_emails), then replies
    assert [second[n].name.split()[-1] for n in sorted(second)] == [
        *(traced.settings.model, "lookup_note", traced.settings.model, "send_email"),
        *(traced.settings.model, "list_sent_emails", traced.settings.model),
    ]
    assert [second[n].attributes["durable_agent.step.read_back"] for n in sorted(second)] == [
        *(True, True, True),
        *(False, False, False, False),
    ]
    send = second[3]
    assert send.name == "execute_tool send_email"
    assert send.attributes["durable_agent.tool.uncertain"] is True
    assert send.attributes["durable_agent.tool.replay"] == "never"
    assert send.attributes["durable_agent.epoch"] == 2
    model = second[4]
    assert model.name == f"chat {traced.settings.model}"
    assert model.kind == trace.SpanKind.CLIENT
    assert model.attributes["gen_ai.operation.name"] == "chat"
    assert model.attributes["gen_ai.provider.name"] == "openai"
    assert model.attributes["gen_ai.usage.input_tokens"] > 0
    assert model.attributes["gen_ai.usage.output_tokens"] > 0
    read_back_model = second[0]
    assert read_back_model.attributes["gen_ai.usage.input_tokens"] > 0  # from the journal

    first_steps = [s for s in steps if s.parent.span_id == crashed.context.span_id]
    assert sorted(s.attributes["durable_agent.step"] for s in first_steps) == [0, 1, 2, 3]
    died = next(s for s in first_steps if s.attributes["durable_agent.step"] == 3)
    assert "durable_agent.step.ran" not in died.attributes  # it ran; its outcome never came


def test_a_turn_started_outside_any_span_starts_its_own_trace(
    traced: Runtime, otel_spans: InMemorySpanExporter
) -> None:
    turn_id = traced.start_turn("s-untraced", MESSAGE)
    assert traced.journal.trace_context(turn_id) is None
    assert handle_delivery(traced, turn_id) == "done"
    (delivery,) = _by_name(otel_spans.get_finished_spans(), "durable_agent.delivery")
    assert delivery.parent is None
    assert delivery.attributes["durable_agent.epoch"] == 1


def test_without_tracing_nothing_is_stored_or_spanned(
    settings: Settings, otel_spans: InMemorySpanExporter
) -> None:
    runtime = Runtime(settings)
    try:
        tracer = trace.get_tracer("the-application")
        with tracer.start_as_current_span("POST /notes"):
            turn_id = runtime.start_turn("s-off", MESSAGE)
        assert runtime.tracing is None
        assert runtime.journal.trace_context(turn_id) is None
        assert [s.name for s in otel_spans.get_finished_spans()] == ["POST /notes"]
    finally:
        runtime.close()
