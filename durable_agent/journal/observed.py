"""What the telemetry reads: the fleet's figures for the metrics exporter (the ``metric_*``
queries) and a turn's stored trace context for the tracer. One method per named query,
read-only; mixed into :class:`~durable_agent.journal.store.JournalStore`."""

from __future__ import annotations

from typing import Any

from .db import Database


class Observed:
    """Counts over ``turns``, ``journal``, ``approvals`` and ``resolutions``; trace contexts."""

    db: Database

    def trace_context(self, turn_id: str) -> str | None:
        """The W3C headers (JSON) stored with the turn by a traced ``start_turn``, or None."""
        value: str | None = self.db.value("trace_context", turn_id=turn_id)
        return value

    def metric_turns(self) -> list[dict[str, Any]]:
        """(agent, status, turns, takeovers) rows."""
        return self.db.run("metric_turns")

    def metric_steps(self, bounds: list[float]) -> list[dict[str, Any]]:
        """(kind, name, replay, bucket, steps, seconds) rows; ``bucket`` is
        ``width_bucket`` of the step's seconds over ``bounds``."""
        return self.db.run("metric_steps", bounds=bounds)

    def metric_turn_latency(self, bounds: list[float]) -> list[dict[str, Any]]:
        """(agent, status, bucket, turns, seconds) rows of the finished turns."""
        return self.db.run("metric_turn_latency", bounds=bounds)

    def metric_open_work(self) -> list[dict[str, Any]]:
        """(agent, what, open) rows: what is ``uncertain`` or ``approval``."""
        return self.db.run("metric_open_work")

    def metric_queues(self) -> list[str]:
        """The queues turns were sent to."""
        return [row["queue"] for row in self.db.run("metric_queues")]
