"""Announcements on the channel ``durable_agent``: the writing side (``announce``) and the
statement a listening connection runs (``listen``).

A durable write of a turn (a ``never`` step, the end of a turn, a cancel) is announced after
it commits; the steps written without a WAL wait are announced by a trigger (see
``sql/schema.sql``). Who listens, and whom it wakes, is :mod:`durable_agent.operate.live`.
"""

from __future__ import annotations

import logging
from typing import Any

import psycopg

from ..errors import ServiceUnavailable
from .db import Database
from .queries import query

log = logging.getLogger(__name__)


def announce(db: Database, *payloads: str) -> None:
    """Tell the watchers of a turn that a durable write of it committed (see ``announce`` in
    ``sql/queries.sql``): one statement for all ``payloads``. Best effort: a watcher that
    misses it reads anyway within its fallback poll."""
    try:
        db.run("announce", payloads=list(payloads))
    except ServiceUnavailable as error:
        log.info("could not announce %r: %s", payloads, error)


def listen(conn: psycopg.Connection[Any]) -> None:
    """Start listening for announcements on ``conn`` (an autocommit connection of its own,
    kept open: ``conn.notifies()`` then yields them)."""
    conn.execute(query("listen_turns").sql.encode(), prepare=False)


def listen_wakes(conn: psycopg.Connection[Any]) -> None:
    """Start listening on ``conn`` for parked turns that woke (``durable_agent_wake``,
    payload: the turn id): a worker's waker sends them at once."""
    conn.execute(query("listen_wakes").sql.encode(), prepare=False)
