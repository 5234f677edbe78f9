"""The web console's listings: turns filtered and paged, the workers and the agents as
the turns table shows them. One method per named query; mixed into
:class:`~durable_agent.journal.store.JournalStore`."""

from __future__ import annotations

from datetime import datetime

from .db import Database
from .records import AgentSeen, Turn, TurnFilter, WorkerSeen


class Listings:
    """Read-only listings over ``turns`` (queries ``find_turns``, ``workers``,
    ``agents_seen``)."""

    db: Database

    def find_turns(
        self, turn_filter: TurnFilter, *, before: tuple[datetime, str] | None, limit: int
    ) -> list[Turn]:
        """Turns newest first that match the filter, after the ``before`` turn
        ((created_at, turn_id) of the last one of the page before; None: from the newest).
        A message or reply that does not open is marked (``Turn.unreadable``): one such row
        does not take the listing down."""
        before_at, before_id = before if before is not None else (None, None)
        rows = self.db.run_marked(
            "find_turns",
            **turn_filter.params(),
            before_at=before_at,
            before_id=before_id,
            limit=limit,
        )
        return [Turn.from_row(row) for row in rows]

    def workers(self, window_seconds: float) -> list[WorkerSeen]:
        """The worker processes seen in the turns table: claims held and expired, the
        furthest lease, messages received within ``window_seconds``."""
        return [WorkerSeen.from_row(r) for r in self.db.run("workers", window=window_seconds)]

    def agents_seen(self) -> list[AgentSeen]:
        """Each (agent, digest) the turns ran with, with its count and newest turn."""
        return [AgentSeen.from_row(row) for row in self.db.run("agents_seen")]
