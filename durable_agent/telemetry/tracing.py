"""OpenTelemetry traces of turns (the ``otel`` extra, ``DURABLE_AGENT_TRACING=true``).

Imported only when tracing is on: nothing on a turn's path imports ``opentelemetry``
otherwise.

* The application's side: ``start_turn`` and ``agent_turn.delay`` take the W3C trace context
  of the caller's current span (:meth:`Tracing.context_headers`); it travels in the Celery
  message's headers and is stored with the turn (``turns.trace_context``), so that a message
  the sweeper sends again, or the next turn of a session sent by a worker, carries it too.
* The worker's side: each delivery of a turn is a span (``durable_agent.delivery``, kind
  CONSUMER) whose parent is that context, from the message or else from the turn's row; each
  step is a span under it (:class:`StepSpans`): model calls follow the GenAI semantic
  conventions (``gen_ai.operation.name`` ``chat``, ``gen_ai.request.model``,
  ``gen_ai.usage.input_tokens`` ...), tool calls ``execute_tool`` with the tool's name, its
  replay label, whether it was read back or ran, the claim's epoch and whether its outcome is
  uncertain. So the application's request and every delivery of its turn, on whichever
  worker, are one trace.

Where the spans go is OpenTelemetry's own configuration: an application that installed a
tracer provider keeps it; a worker with none installs one that exports over OTLP/HTTP as the
standard ``OTEL_*`` variables say (``OTEL_EXPORTER_OTLP_ENDPOINT``, ``OTEL_SERVICE_NAME``,
``OTEL_BSP_SCHEDULE_DELAY`` ...).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import Span, SpanKind

from ..journal import Claim
from ..step.observe import StepNote

log = logging.getLogger(__name__)

TRACER_NAME = "durable_agent"
DELIVERY_SPAN = "durable_agent.delivery"
CONTEXT_KEYS = ("traceparent", "tracestate")
SERVICE_NAME = "durable-agent"
GEN_AI_SYSTEM = "openai"  # the API the model calls speak (Chat Completions)


class Tracing:
    """The spans of one process (the global tracer provider's tracer, looked up per use so
    that a provider installed later is the one used)."""

    def __init__(self) -> None:
        self._tracer: trace.Tracer | None = None

    @property
    def tracer(self) -> trace.Tracer:
        if self._tracer is None or isinstance(self._tracer, trace.ProxyTracer):
            self._tracer = trace.get_tracer(TRACER_NAME)
        return self._tracer

    # -- the application's side ---------------------------------------------------------

    def context_headers(self) -> dict[str, str]:
        """The W3C headers of the current span (``traceparent``, ``tracestate``); empty
        when there is no span to join."""
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        return {k: v for k, v in carrier.items() if k in CONTEXT_KEYS}

    def stored_context(self) -> str | None:
        """The current context as the text stored with a turn (None: nothing to store)."""
        headers = self.context_headers()
        return json.dumps(headers, sort_keys=True) if headers else None

    # -- the worker's side --------------------------------------------------------------

    @contextmanager
    def delivery(
        self,
        turn_id: str,
        headers: Mapping[str, Any] | None,
        stored: Callable[[], str | None],
    ) -> Iterator[Span]:
        """The span of one delivery of ``turn_id``, child of the context in the message's
        ``headers`` or else of the one stored with the turn (``stored()``, read only then)."""
        carrier = {k: str(v) for k, v in (headers or {}).items() if k in CONTEXT_KEYS and v}
        if "traceparent" not in carrier:
            carrier = _parse_stored(stored())
        parent = propagate.extract(carrier) if carrier else otel_context.Context()
        with self.tracer.start_as_current_span(
            DELIVERY_SPAN,
            context=parent,
            kind=SpanKind.CONSUMER,
            attributes={"durable_agent.turn_id": turn_id, "messaging.system": "celery"},
        ) as span:
            yield span

    def steps(self, claim: Claim) -> StepSpans:
        """The step observer of a claimed delivery; names the claim on the delivery span."""
        turn = claim.turn
        span = trace.get_current_span()
        span.set_attributes(
            {
                "durable_agent.session_id": turn.session_id,
                "durable_agent.agent": turn.agent,
                "durable_agent.epoch": claim.epoch,
                "durable_agent.attempt": turn.attempts,
                "durable_agent.crashes": turn.crashes,
                "durable_agent.resumed": claim.epoch > 1,
            }
        )
        return StepSpans(self.tracer, turn.turn_id, claim.epoch)


class StepSpans:
    """A span for each step of one delivery (``step/observe.py``'s ``StepObserver``)."""

    def __init__(self, tracer: trace.Tracer, turn_id: str, epoch: int) -> None:
        self.tracer = tracer
        self.turn_id = turn_id
        self.epoch = epoch

    def observe(self, note: StepNote) -> AbstractContextManager[object]:
        return self._span(note)

    @contextmanager
    def _span(self, note: StepNote) -> Iterator[Span]:
        common: dict[str, Any] = {
            "durable_agent.turn_id": self.turn_id,
            "durable_agent.step": note.step,
            "durable_agent.epoch": self.epoch,
        }
        if note.kind == "model":
            name = f"chat {note.model or ''}".strip()
            attributes: dict[str, Any] = {
                **common,
                "gen_ai.operation.name": "chat",
                "gen_ai.system": GEN_AI_SYSTEM,
                "gen_ai.provider.name": GEN_AI_SYSTEM,
                **({"gen_ai.request.model": note.model} if note.model else {}),
            }
            kind = SpanKind.CLIENT
        else:
            name = f"execute_tool {note.name}"
            attributes = {
                **common,
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": note.name,
                "durable_agent.tool.replay": note.replay or "",
                **({"gen_ai.tool.call.id": note.tool_call_id} if note.tool_call_id else {}),
            }
            kind = SpanKind.INTERNAL
        with self.tracer.start_as_current_span(name, kind=kind, attributes=attributes) as span:
            yield span
            span.set_attributes(_outcome(note))


def _outcome(note: StepNote) -> dict[str, Any]:
    """What the step's span says once it returned."""
    values: dict[str, Any] = {
        "durable_agent.step.ran": note.ran,
        "durable_agent.step.read_back": not note.ran,
    }
    output = note.output or {}
    if note.kind == "model":
        found = output.get("usage")
        usage: dict[str, Any] = found if isinstance(found, dict) else {}
        for ours, theirs in (
            ("gen_ai.usage.input_tokens", "prompt_tokens"),
            ("gen_ai.usage.output_tokens", "completion_tokens"),
        ):
            if isinstance(usage.get(theirs), int):
                values[ours] = usage[theirs]
        if isinstance(output.get("model"), str):
            values["gen_ai.response.model"] = output["model"]
        if isinstance(output.get("id"), str):
            values["gen_ai.response.id"] = output["id"]
    else:
        values["durable_agent.tool.uncertain"] = note.uncertain
        values["durable_agent.tool.error"] = bool(output.get("error"))
    return values


def _parse_stored(text: str | None) -> dict[str, str]:
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError:
        log.warning("a stored trace context is not JSON; the delivery starts a new trace")
        return {}
    if not isinstance(value, dict):
        return {}
    return {k: str(v) for k, v in value.items() if k in CONTEXT_KEYS and v}


def install_exporter() -> bool:
    """Give this process a tracer provider that exports over OTLP/HTTP (the ``OTEL_*``
    variables say where), unless one is installed already; True if this one was.

    A worker calls it before it forks its pool: the SDK's batch processor starts its thread
    again in each child."""
    from opentelemetry.sdk.trace import TracerProvider

    if isinstance(trace.get_tracer_provider(), TracerProvider):
        return False
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import OTELResourceDetector, Resource
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = Resource.create({"service.name": SERVICE_NAME}).merge(
        OTELResourceDetector().detect()
    )
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    return True


def flush(timeout_millis: int = 5000) -> None:
    """Export the spans ended so far (at a worker's shutdown)."""
    provider = trace.get_tracer_provider()
    force_flush = getattr(provider, "force_flush", None)
    if force_flush is not None:
        force_flush(timeout_millis)
