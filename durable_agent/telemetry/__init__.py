"""Traces and metrics of the fleet, both optional (``docs/how-to/observability.md``).

* ``tracing.py``: OpenTelemetry spans of each delivery and step (the ``otel`` extra,
  ``DURABLE_AGENT_TRACING``);
* ``counters.py``: the Prometheus counters of a worker's main process (sweeper re-sends,
  poison messages; ``DURABLE_AGENT_METRICS_PORT``);
* ``exporter.py``: ``durable-agent metrics``, the fleet's figures read from Postgres at each
  scrape (the ``metrics`` extra).

This module imports neither ``opentelemetry`` nor ``prometheus_client``: a runtime reaches
them through :class:`TelemetryParts` only when they are configured.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from ..settings import Settings

if TYPE_CHECKING:
    from .counters import WorkerCounters
    from .tracing import Tracing

T = TypeVar("T")


class TelemetryParts:
    """The runtime's telemetry parts (mixed into ``Runtime``), built on first use and only
    when configured."""

    settings: Settings

    def _part(self, name: str, build: Callable[[], T]) -> T:
        raise NotImplementedError

    @property
    def tracing(self) -> Tracing | None:
        """The spans of turns (``DURABLE_AGENT_TRACING``), or None."""
        if not self.settings.tracing:
            return None
        from .tracing import Tracing

        return self._part("tracing", Tracing)

    @property
    def counters(self) -> WorkerCounters | None:
        """The counters a worker's main process serves (``DURABLE_AGENT_METRICS_PORT``)."""
        if not self.settings.metrics_port:
            return None
        from .counters import WorkerCounters

        return self._part("counters", WorkerCounters)

    def trace_context(self) -> str | None:
        """The caller's trace context to store with a new turn (None: tracing off, or no
        span to join)."""
        tracing = self.tracing
        return tracing.stored_context() if tracing is not None else None

    def start_tracing(self) -> None:
        """In a worker, before its pool forks: a tracer provider exporting over OTLP/HTTP,
        unless the process has one (each child inherits it)."""
        if self.tracing is not None:
            from .tracing import install_exporter

            install_exporter()

    def flush_traces(self) -> None:
        """Export the spans ended so far (as a worker process stops)."""
        if self.tracing is not None:
            from .tracing import flush

            flush()
