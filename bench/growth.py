"""Growth: does anything get slower as the tables fill up or a backlog builds?

One long-lived connection (the worker's: prepared statements, cached generic plans) measures
a journal step (intent + outcome), a claim, and the sweeper's query, first on empty tables,
then after the journal has been filled to 100,000 and 1,000,000 rows of finished turns, with
autovacuum off and no ANALYZE after the fill (statistics as stale as they get). Then the
sweeper's query with a backlog of 10,000 open turns: all due (never enqueued), and all
merely waiting in their queue (nothing due). The goal: flat, and a sweep under 50 ms.
"""

from __future__ import annotations

import statistics
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from rich.table import Table

from durable_agent.cli.console import out
from durable_agent.journal import Claim, Database, JournalStore, Leases

from . import Stopwatch, scratch_database, spread

SIZES = (0, 100_000, 1_000_000)
STEPS_PER_TURN = 10
BACKLOG = 10_000
OWNER = "bench:growth"
SAMPLES = 5
OPS = 100  # calls per sample


def _fill(conn: psycopg.Connection[Any], rows: int) -> None:
    """``rows`` journal rows of finished turns (10 steps each), by COPY."""
    turns = rows // STEPS_PER_TURN
    long_ago = datetime.now(UTC) - timedelta(days=1)
    turn_ids = [f"fill_{uuid.uuid4().hex}" for _ in range(turns)]
    with conn.cursor() as cursor:
        with cursor.copy(
            "COPY turns (turn_id, session_id, seq, status, message, reply, lease_epoch, "
            "created_at, updated_at, finished_at) FROM STDIN"
        ) as copy:
            for turn_id in turn_ids:
                copy.write_row(
                    (turn_id, turn_id, 0, "done", "m", "r", 1, long_ago, long_ago, long_ago)
                )
        with cursor.copy(
            "COPY journal (turn_id, step, kind, name, input, replay, status, output, epoch, "
            "created_at, finished_at) FROM STDIN"
        ) as copy:
            for turn_id in turn_ids:
                for step in range(STEPS_PER_TURN):
                    kind = "model" if step % 2 == 0 else "tool"
                    copy.write_row(
                        (
                            turn_id,
                            step,
                            kind,
                            "llm" if kind == "model" else "lookup_note",
                            '{"messages": 4}',
                            "safe",
                            "done",
                            '{"content": "The launch is on Friday at 10:00 in room 4."}',
                            1,
                            long_ago,
                            long_ago,
                        )
                    )


def _backlog(conn: psycopg.Connection[Any], turns: int, *, due: bool) -> None:
    """``turns`` open turns: never enqueued and past the grace (due), or sent a moment ago
    and not yet received (waiting in their queue: not due)."""
    now = datetime.now(UTC)
    created = now - timedelta(minutes=1)
    with (
        conn.cursor() as cursor,
        cursor.copy(
            "COPY turns (turn_id, session_id, seq, status, message, queue, enqueued_at, "
            "message_id, created_at, updated_at) FROM STDIN"
        ) as copy,
    ):
        for n in range(turns):
            turn_id = f"backlog_{uuid.uuid4().hex}"
            enqueued, message_id = (None, None) if due else (now, f"m-{n}")
            copy.write_row(
                (
                    turn_id,
                    turn_id,
                    0,
                    "queued",
                    "m",
                    "bench",
                    enqueued,
                    message_id,
                    created,
                    created,
                )
            )


class Probe:
    """The measured calls, on one long-lived connection."""

    def __init__(self, url: str, samples: int) -> None:
        self.samples = samples
        self.db = Database(url)
        self.store = JournalStore(self.db)
        self.leases = Leases(self.db)

    def step_us(self) -> list[float]:
        """µs per journal step of a model or safe call: its intent and its outcome."""

        def sample() -> float:
            turn = self.store.create_turn(f"g-{uuid.uuid4().hex[:12]}", "m")
            claim = self.leases.claim(turn.turn_id, OWNER, 600.0)
            assert isinstance(claim, Claim)
            with Stopwatch() as sw:
                for step in range(OPS):
                    self.store.insert_intent(
                        turn.turn_id, claim.epoch, step, "tool", "lookup_note", {"n": step}, "safe"
                    )
                    self.store.record_outcome(
                        turn.turn_id, claim.epoch, step, {"content": "x"}, durable=False
                    )
            self.leases.finish(turn.turn_id, claim.epoch, "done")
            return sw.seconds * 1e6 / OPS

        return [sample() for _ in range(self.samples)]

    def claim_us(self) -> list[float]:
        def sample() -> float:
            turn_ids = [
                self.store.create_turn(f"g-{uuid.uuid4().hex[:12]}", "m").turn_id
                for _ in range(OPS)
            ]
            with Stopwatch() as sw:
                claims = [self.leases.claim(t, OWNER, 600.0) for t in turn_ids]
            for turn_id, claim in zip(turn_ids, claims, strict=True):
                assert isinstance(claim, Claim), claim
                self.leases.finish(turn_id, claim.epoch, "done")
            return sw.seconds * 1e6 / OPS

        return [sample() for _ in range(self.samples)]

    def sweep_ms(self) -> tuple[list[float], int]:
        """ms for the sweeper's query (in a transaction that is rolled back: nothing sent)."""
        samples, found = [], 0
        for _ in range(self.samples):
            with self.db.transaction() as tx, Stopwatch() as sw:
                rows = tx.run(
                    "due_turns",
                    grace=5.0,
                    lease=6.0,
                    requeue_after=3600.0,
                    dead_receivers=[],
                    batch=500,
                    claims_expire=True,
                )
            samples.append(sw.seconds * 1e3)
            found = len(rows)
        return samples, found

    def close(self) -> None:
        self.db.close()


def run(
    *, sizes: tuple[int, ...] = SIZES, backlog: int = BACKLOG, samples: int = SAMPLES
) -> dict[str, Any]:
    results: dict[str, Any] = {"tables": [], "backlog": []}
    with scratch_database() as url, psycopg.connect(url, autocommit=True) as admin:
        for table in ("turns", "journal"):
            admin.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
        probe = Probe(url, samples)
        try:
            filled = 0
            for size in sizes:
                _fill(admin, size - filled)  # no ANALYZE: stale statistics
                filled = size
                sweep, _ = probe.sweep_ms()
                results["tables"].append(
                    {
                        "journal_rows": size,
                        "step_us": probe.step_us(),
                        "claim_us": probe.claim_us(),
                        "sweep_ms": sweep,
                    }
                )
            for due in (True, False):
                admin.execute("DELETE FROM turns WHERE turn_id LIKE 'backlog_%'")
                _backlog(admin, backlog, due=due)
                sweep, found = probe.sweep_ms()
                results["backlog"].append(
                    {"turns": backlog, "due": due, "sweep_ms": sweep, "found": found}
                )
        finally:
            probe.close()

    table = Table(title=f"Growth: one long-lived connection, stale statistics ({samples} samples)")
    for column in ("journal rows", "step (intent + outcome)", "claim", "sweeper query"):
        table.add_column(column, justify="right")
    for row in results["tables"]:
        table.add_row(
            f"{row['journal_rows']:,}",
            f"{statistics.median(row['step_us']):.0f} µs ({spread(row['step_us'])})",
            f"{statistics.median(row['claim_us']):.0f} µs ({spread(row['claim_us'])})",
            f"{statistics.median(row['sweep_ms']):.1f} ms",
        )
    out.print(table)
    backlog_table = Table(title=f"The sweeper's query with a backlog of {backlog:,} open turns")
    for column in ("backlog", "sweeper query", "turns it returns (batch 500)"):
        backlog_table.add_column(column, justify="right")
    for row in results["backlog"]:
        backlog_table.add_row(
            "all due (never enqueued)" if row["due"] else "all waiting in their queue",
            f"{statistics.median(row['sweep_ms']):.1f} ms ({spread(row['sweep_ms'], '{:.1f}')})",
            str(row["found"]),
        )
    out.print(backlog_table)
    return results
