"""The spend page's figures: one pass of the ``spend`` query per (day, agent), summed by
day and by agent here, and kept for a minute.

The ledger is read from the journal (nothing is written on the hot path to keep it), so
its cost grows with the model calls in the window: with 100,000 turns, a 14-day window is
about half a second of Postgres. The page shows the figures of the last pass, at most
:data:`FRESH_SECONDS` old, with the time they were read; an older one is shown once more
while a thread reads the new one, so only the first visit of a window waits for the query.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from ..journal import Spend
from ..operate.spend import total
from ..runtime import Runtime

FRESH_SECONDS = 60.0


@dataclass(frozen=True, slots=True)
class SpendFigures:
    """By day (oldest first), by agent (most tokens first), by day and agent."""

    since: datetime
    by_day: list[Spend]
    by_agent: list[Spend]
    by_day_agent: list[Spend]
    read_at: datetime
    read_ms: float


def read_figures(runtime: Runtime, days: int) -> SpendFigures:
    started = time.perf_counter()
    today = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    since = today - timedelta(days=days - 1)
    rows = runtime.spend("day_agent", limit=10_000, since=since)
    days_of: dict[str, list[Spend]] = {}
    agents_of: dict[str, list[Spend]] = {}
    for row in rows:
        day, _, agent = row.key.partition(" ")
        days_of.setdefault(day, []).append(row)
        agents_of.setdefault(agent, []).append(row)

    def summed(groups: dict[str, list[Spend]]) -> list[Spend]:
        return [_keyed(total(parts), key) for key, parts in groups.items()]

    by_agent = summed(agents_of)
    by_agent.sort(key=lambda s: -(s.billed.prompt_tokens + s.billed.completion_tokens))
    return SpendFigures(
        since=since,
        by_day=sorted(summed(days_of), key=lambda s: s.key),
        by_agent=by_agent,
        by_day_agent=sorted(rows, key=lambda s: s.key),
        read_at=datetime.now(UTC),
        read_ms=(time.perf_counter() - started) * 1000,
    )


def _keyed(spend: Spend, key: str) -> Spend:
    from dataclasses import replace

    return replace(spend, key=key)


class SpendCache:
    """The figures of each window, read at most once a minute (see the module's text)."""

    def __init__(self, runtime: Runtime, fresh_seconds: float = FRESH_SECONDS) -> None:
        self.runtime = runtime
        self.fresh_seconds = fresh_seconds
        self._figures: dict[int, tuple[float, SpendFigures]] = {}
        self._refreshing: set[int] = set()
        self._lock = threading.Lock()

    def figures(self, days: int) -> SpendFigures:
        with self._lock:
            kept = self._figures.get(days)
            stale = kept is not None and time.monotonic() - kept[0] > self.fresh_seconds
            if stale and days not in self._refreshing:
                self._refreshing.add(days)
                threading.Thread(target=self._refresh, args=(days,), daemon=True).start()
        if kept is not None:
            return kept[1]
        figures = read_figures(self.runtime, days)
        with self._lock:
            self._figures[days] = (time.monotonic(), figures)
        return figures

    def _refresh(self, days: int) -> None:
        try:
            figures = read_figures(self.runtime, days)
            with self._lock:
                self._figures[days] = (time.monotonic(), figures)
        finally:
            with self._lock:
                self._refreshing.discard(days)
