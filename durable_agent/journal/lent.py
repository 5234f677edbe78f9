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

from typing import Any

import psycopg
from psycopg.pq import TransactionStatus

from ..errors import ConfigurationError, InvalidArgument
from .db import on_connection
from .records import Turn
from .sealing import NO_SEALING, Sealer, Where
from .turn_ids import new_turn_id, submitted_again

SAVEPOINT = "durable_agent_start_turn"
_PLACES = 20


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
