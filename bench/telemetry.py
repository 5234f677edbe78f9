"""Telemetry: what tracing costs a turn, and what a Prometheus scrape costs.

* Tracing: the same 11-step turn (model, tool, ..., the model's reply; an in-process model,
  real Postgres) delivered with ``DURABLE_AGENT_TRACING`` off and on, in alternating
  repetitions, each delivery with the trace context in its message; on, the process has the
  SDK's tracer provider with a batch processor whose exporter drops the spans (what a worker
  pays on the turn's path: the spans, their attributes, the processor's queue; the export
  runs on the processor's thread). The ratio is traced / untraced time per turn.
* Metrics: the workers count nothing on a turn's path (a worker's counters are the sweeper's
  and the consumer's); the cost is ``durable-agent metrics`` reading the fleet's figures at
  each scrape, measured on the turns of the tracing rows and on 100,000 turns with their
  journals (the web console benchmark's table).
"""

from __future__ import annotations

import statistics
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import psycopg
from rich.table import Table

from durable_agent.cli.console import out
from durable_agent.delivery.turn_worker import TurnWorker
from durable_agent.journal import migrate
from durable_agent.runtime import MAX_LIST, Runtime
from durable_agent.settings import Settings
from durable_agent.step.tools import ToolRegistry, tool

from . import interleaved, scratch_database, spread

STEPS = 11
TURNS_PER_REP = 20
SCRAPE_SAMPLES = 7
HEADERS = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
"""The message's trace context, as start_turn's messages carry it (the application's span)."""


@tool(replay="safe")
def lookup_note(name: str) -> str:
    """Read a note."""
    return f"The note {name} says the launch is on Friday at 10:00 in room 4."


TOOLS = ToolRegistry([lookup_note])


def scripted_model(steps: int) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """Calls lookup_note until the turn has ``steps`` steps, then answers; bills tokens."""

    def call(request: dict[str, Any]) -> dict[str, Any]:
        done = len(request["messages"]) - 2
        if done + 1 >= steps:
            message: dict[str, Any] = {"role": "assistant", "content": "Friday at 10:00."}
        else:
            message = {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"call_{done}",
                        "type": "function",
                        "function": {"name": "lookup_note", "arguments": '{"name":"launch"}'},
                    }
                ],
            }
        return {
            "message": message,
            "finish_reason": "stop" if message.get("content") else "tool_calls",
            "model": "gpt-4o-mini",
            "usage": {"prompt_tokens": 200 + done, "completion_tokens": 12},
        }

    return call


def _install_dropping_provider() -> None:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )

    class Drop(SpanExporter):
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(BatchSpanProcessor(Drop()))
        trace.set_tracer_provider(provider)


def _worker(runtime: Runtime) -> TurnWorker:
    tracing = runtime.tracing
    return TurnWorker(
        runtime.settings,
        store=runtime.journal,
        leases=runtime.leases,
        operator_store=runtime.operator_store,
        agents=runtime.agents,
        model=scripted_model(STEPS),
        outage=runtime.outage,
        observe_steps=tracing.steps if tracing is not None else None,
    )


def _turns_timer(runtime: Runtime, turns: int) -> Callable[[], float]:
    """Per call: record ``turns`` turns (untimed), then deliver them; ms per turn."""
    worker = _worker(runtime)
    tracing = runtime.tracing
    store = runtime.journal

    def deliver(turn_id: str) -> None:
        if tracing is None:
            outcome = worker.handle(turn_id).outcome
        else:
            with tracing.delivery(turn_id, HEADERS, lambda: store.trace_context(turn_id)):
                outcome = worker.handle(turn_id).outcome
        assert outcome == "done", outcome

    def measure() -> float:
        ids = [
            store.create_turn(f"bench-{uuid.uuid4().hex[:10]}", "What do the notes say?").turn_id
            for _ in range(turns)
        ]
        started = time.perf_counter()
        for turn_id in ids:
            deliver(turn_id)
        return (time.perf_counter() - started) * 1000 / turns

    return measure


def _scrape_ms(runtime: Runtime, samples: int) -> list[float]:
    from durable_agent.telemetry.exporter import FleetCollector

    collector = FleetCollector(
        runtime.journal, lambda: runtime.spend(by="agent", limit=MAX_LIST), lambda queues: {}
    )
    times = []
    for _ in range(samples + 1):
        started = time.perf_counter()
        families = list(collector.collect())
        times.append((time.perf_counter() - started) * 1000)
        assert any(f.name == "durable_agent_turns" for f in families)
    return times[1:]  # the first warms the plans


def run(reps: int = 7, turns: int = TURNS_PER_REP, big: int = 100_000) -> dict[str, Any]:
    out.print(
        f"[bold]telemetry[/bold]: a {STEPS}-step turn with tracing off and on "
        f"({reps} x {turns} turns each); a metrics scrape"
    )
    _install_dropping_provider()
    results: dict[str, Any] = {"steps": STEPS, "turns_per_rep": turns}
    with scratch_database() as url:
        settings = Settings(database_url=url, model="gpt-4o-mini", lease_seconds=600.0)
        off = Runtime(settings, tools=TOOLS)
        on = Runtime(settings.model_copy(update={"tracing": True}), tools=TOOLS)
        try:
            migrate(off.database)
            untraced, traced = interleaved(
                _turns_timer(off, turns), _turns_timer(on, turns), reps=reps
            )
            results["tracing"] = {
                "unit": "ms per turn",
                "off": {"median": statistics.median(untraced), "samples": untraced},
                "on": {"median": statistics.median(traced), "samples": traced},
                "ratio": statistics.median(traced) / statistics.median(untraced),
            }
            recorded = (reps + 1) * turns * 2
            small = _scrape_ms(off, SCRAPE_SAMPLES)
            results["scrape_small"] = {"turns": recorded, "ms": small}
        finally:
            off.close()
            on.close()
    if big:
        from .console_pages import _fill

        with scratch_database() as url:
            with psycopg.connect(url, autocommit=True) as conn:
                _fill(conn, big)
            runtime = Runtime(Settings(database_url=url))
            try:
                results["scrape_big"] = {"turns": big, "ms": _scrape_ms(runtime, SCRAPE_SAMPLES)}
            finally:
                runtime.close()
    _print(results)
    return results


def _print(results: dict[str, Any]) -> None:
    tracing = results["tracing"]
    table = Table(title=f"tracing: ms per {results['steps']}-step turn (real Postgres)")
    for column in ("tracing off", "tracing on", "on / off"):
        table.add_column(column, justify="right")
    table.add_row(
        f"{tracing['off']['median']:.2f} ({spread(tracing['off']['samples'], '{:.2f}')})",
        f"{tracing['on']['median']:.2f} ({spread(tracing['on']['samples'], '{:.2f}')})",
        f"{tracing['ratio']:.3f}x",
    )
    out.print(table)
    scrape = Table(title="a metrics scrape (durable-agent metrics), ms")
    for column in ("turns in Postgres", "median", "max"):
        scrape.add_column(column, justify="right")
    for key in ("scrape_small", "scrape_big"):
        if key in results:
            found = results[key]
            scrape.add_row(
                f"{found['turns']:,}",
                f"{statistics.median(found['ms']):.1f}",
                f"{max(found['ms']):.1f}",
            )
    out.print(scrape)
