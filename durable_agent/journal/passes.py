"""Fleet-wide passes: one transaction that holds an advisory lock, so that across every
process one pass of a kind runs at a time (a sweeper pass).

``locked_pass(db, key)`` yields a :class:`LockedPass` when this transaction took the lock,
None when another pass holds it; the lock goes with the transaction.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from .db import Database, Row, _Connected


class LockedPass:
    """The queries a pass runs inside its transaction, one method each."""

    def __init__(self, tx: _Connected) -> None:
        self.tx = tx

    def due_turns(
        self,
        *,
        grace: float,
        lease: float,
        requeue_after: float,
        dead_receivers: list[str],
        batch: int,
        claims_expire: bool,
    ) -> list[Row]:
        """Open turns with no live message (see ``due_turns`` in ``sql/queries.sql``)."""
        return self.tx.run(
            "due_turns",
            grace=grace,
            lease=lease,
            requeue_after=requeue_after,
            dead_receivers=dead_receivers,
            batch=batch,
            claims_expire=claims_expire,
        )

    def mark_sent(self, turn_ids: list[str], message_ids: list[str]) -> None:
        """Record which message is each turn's latest, in this pass's transaction."""
        self.tx.run("mark_sent", turn_ids=turn_ids, message_ids=message_ids)


@contextmanager
def locked_pass(db: Database, key: int) -> Iterator[LockedPass | None]:
    """A transaction holding the advisory lock ``key``, or None if another pass has it."""
    with db.transaction() as tx:
        yield LockedPass(tx) if tx.value("try_sweep_lock", key=key) else None
