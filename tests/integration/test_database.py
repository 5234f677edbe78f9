"""The process's one connection survives a Postgres restart between two statements."""

from __future__ import annotations

import psycopg

from durable_agent.journal import Database, JournalStore


def test_a_dead_connection_is_replaced_and_the_statement_sent_again(
    db: Database, store: JournalStore, database_url: str
) -> None:
    """Kill this process's own backend (as a Postgres restart would): the next statement
    reconnects instead of failing, and the write happens exactly once."""
    pid = db.value("ping")
    admin = psycopg.connect(database_url, autocommit=True)
    try:
        assert admin.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone() == (True,)
    finally:
        admin.close()

    turn = store.create_turn("s-reconnect", "hello")

    assert db.value("ping") != pid
    assert [t.turn_id for t in store.list_turns("s-reconnect")] == [turn.turn_id]
