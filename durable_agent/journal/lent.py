"""A turn recorded in the application's own transaction, on the psycopg 3 connection it
lends us (``start_turn(connection=...)``).

The insert is the same ``create_turn`` query every start sends, run on the application's
connection inside a savepoint: a retried start (the same turn id) or a race for a session's
position rolls back to the savepoint and leaves the application's transaction usable. Three
statements (SAVEPOINT, the insert, RELEASE), all in the application's transaction: nothing of
the turn is visible to a worker or the sweeper until that transaction commits, and nothing of
it is left when it rolls back.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import psycopg
from psycopg.pq import TransactionStatus

from ..errors import ConfigurationError, InvalidArgument
from .db import Row, on_connection
from .operator_store import Approval, decide_with_audit
from .records import Turn
from .sealing import NO_SEALING, Sealer, Where
from .turn_ids import new_turn_id, submitted_again
from .wait_store import Recorded

SAVEPOINT = "durable_agent_start_turn"
_PLACES = 20
T = TypeVar("T")


def check_lendable(conn: psycopg.Connection[Any]) -> None:
    """InvalidArgument unless ``conn`` can take a turn into a transaction of its caller."""
    if conn.closed:
        raise InvalidArgument("the connection given to start_turn is closed")
    status = conn.info.transaction_status
    if status == TransactionStatus.INERROR:
        raise InvalidArgument(
            "the connection's transaction has already failed: roll it back, then start the "
            "turn in a new one"
        )
    if status == TransactionStatus.ACTIVE:
        raise InvalidArgument("the connection given to start_turn is running another command")
    if status == TransactionStatus.IDLE and conn.autocommit:
        raise InvalidArgument(
            "the connection given to start_turn is in autocommit mode outside a transaction: "
            "the turn would commit on its own; open a transaction first "
            "(`with conn.transaction(): ...`) or call start_turn without connection="
        )


def record_turn(
    conn: psycopg.Connection[Any],
    session_id: str,
    message: str,
    turn_id: str | None = None,
    *,
    queue: str = "",
    agent: str = "default",
    concurrency_key: str | None = None,
    trace_context: str | None = None,
    sealer: Sealer = NO_SEALING,
) -> Turn:
    """Record a new turn of ``agent`` at the end of its session in the transaction open on
    ``conn`` (one is begun when the connection is idle and not in autocommit mode, as
    psycopg would for any statement); the existing turn when ``turn_id`` names the same turn.
    """
    check_lendable(conn)
    tx = on_connection(conn, sealer)
    turn_id = turn_id or new_turn_id()
    for _ in range(_PLACES):
        conn.execute(f"SAVEPOINT {SAVEPOINT}", prepare=False)
        try:
            row = tx.one(
                "create_turn",
                turn_id=turn_id,
                session_id=session_id,
                message=sealer.text(message, Where(turn_id, "message")),
                queue=queue,
                agent=agent,
                concurrency_key=concurrency_key,
                trace_context=trace_context,
            )
        except psycopg.errors.UniqueViolation as error:
            conn.execute(f"ROLLBACK TO SAVEPOINT {SAVEPOINT}", prepare=False)
            existing = tx.one("find_turn", turn_id=turn_id)
            conn.execute(f"RELEASE SAVEPOINT {SAVEPOINT}", prepare=False)
            if existing is not None:  # the same turn id submitted again: idempotent
                return submitted_again(Turn.from_row(existing), session_id, message, agent, error)
            continue  # another turn of this session took the same position: the next one
        except (psycopg.errors.UndefinedTable, psycopg.errors.UndefinedFunction) as error:
            conn.execute(f"ROLLBACK TO SAVEPOINT {SAVEPOINT}", prepare=False)
            raise ConfigurationError(
                f"the database of this connection ({conn.info.dbname}) has no durable-agent "
                "tables: run `durable-agent migrate` against it (the application's connection "
                "must reach the database of DURABLE_AGENT_DATABASE_URL)"
            ) from error
        except Exception:
            # a value Postgres refused: the application's transaction stays usable
            if not conn.broken and conn.info.transaction_status == TransactionStatus.INERROR:
                conn.execute(f"ROLLBACK TO SAVEPOINT {SAVEPOINT}", prepare=False)
            raise
        conn.execute(f"RELEASE SAVEPOINT {SAVEPOINT}", prepare=False)
        assert row is not None
        return Turn.from_row(row)
    raise RuntimeError(f"could not place a new turn in session {session_id!r}")


def _in_savepoint(conn: psycopg.Connection[Any], savepoint: str, run: Callable[[], T]) -> T:
    """``run()`` inside a savepoint of the application's transaction: released when it
    returns; rolled back to when Postgres refused a statement (the transaction stays usable)."""
    check_lendable(conn)
    conn.execute(f"SAVEPOINT {savepoint}", prepare=False)
    try:
        result = run()
    except Exception:
        if not conn.broken and conn.info.transaction_status == TransactionStatus.INERROR:
            conn.execute(f"ROLLBACK TO SAVEPOINT {savepoint}", prepare=False)
            conn.execute(f"RELEASE SAVEPOINT {savepoint}", prepare=False)
        raise
    conn.execute(f"RELEASE SAVEPOINT {savepoint}", prepare=False)
    return result


class LentWaits:
    """``record_event`` on the application's connection, in its transaction (a savepoint):
    the event is kept, and the turn it satisfies woken, only if that transaction commits.
    The wake's announcement (``durable_agent_wake``) is delivered at that commit too."""

    def __init__(self, conn: psycopg.Connection[Any], sealer: Sealer = NO_SEALING) -> None:
        self.conn = conn
        self.sealer = sealer

    def record_event(self, turn_id: str, event_id: str, name: str, payload: Any) -> Recorded:
        tx = on_connection(self.conn, self.sealer)
        sealed = self.sealer.json(payload, Where(turn_id, "payload", key=event_id))
        row = _in_savepoint(
            self.conn,
            "durable_agent_send_event",
            lambda: tx.one(
                "record_event", turn_id=turn_id, event_id=event_id, name=name, payload=sealed
            ),
        )
        return Recorded.from_row(row)


class LentApprovals:
    """A decision on an approval on the application's connection, in its transaction (a
    savepoint): the decision, its audit entry and the turn's wake are one with that
    transaction; its announcement (``durable_agent_wake``) is delivered at the commit."""

    def __init__(self, conn: psycopg.Connection[Any], sealer: Sealer = NO_SEALING) -> None:
        self.conn = conn
        self.tx = on_connection(conn, sealer)

    def decide_approval(
        self, turn_id: str, step: int, decision: str, reason: str | None, decided_by: str
    ) -> tuple[str, str, str] | None:
        """As ``OperatorStore.decide_approval``; the turn announced as woken at the commit."""

        def decide() -> Row | None:
            row = decide_with_audit(self.tx, turn_id, step, decision, reason, decided_by)
            if row is not None:
                self.tx.run("announce_wake", turn_id=turn_id)
            return row

        row = _in_savepoint(self.conn, "durable_agent_decide", decide)
        return (row["session_id"], row["turn_id"], row["queue"]) if row else None

    def find_approval(self, turn_id: str, step: int) -> Approval | None:
        """The call as this transaction sees it (its decision included)."""
        row = self.tx.one("find_approval", turn_id=turn_id, step=step)
        return Approval.from_row(row) if row else None
