"""What an application calls: record a turn and enqueue it, read it, wait for it."""

from __future__ import annotations

import logging
import time

from .errors import ServiceUnavailable
from .journal import JournalStore, Turn, database_for
from .queue import enqueue
from .settings import Settings

log = logging.getLogger(__name__)


def _store(settings: Settings | None) -> tuple[Settings, JournalStore]:
    settings = settings or Settings()
    db = database_for(settings.database_url)
    return settings, JournalStore(db, blob_threshold=settings.blob_threshold_bytes)


def start_turn(
    session_id: str,
    message: str,
    *,
    turn_id: str | None = None,
    settings: Settings | None = None,
) -> str:
    """Record a turn in Postgres, then enqueue it; returns the turn id.

    The turn is durable once this returns, even if the broker is down: the sweeper
    enqueues turns that were recorded but never sent. Passing your own ``turn_id`` makes a
    retried call return the same turn instead of creating a second one.
    """
    settings, store = _store(settings)
    turn = store.create_turn(session_id, message, turn_id=turn_id)
    if turn.status in ("queued", "running"):
        try:
            enqueue(settings, store, session_id, turn.turn_id)
        except ServiceUnavailable as error:
            log.warning("turn %s is recorded; %s; the sweeper will enqueue it", turn.turn_id, error)
    return turn.turn_id


def get_turn(turn_id: str, *, settings: Settings | None = None) -> Turn:
    """The turn as recorded now; raises TurnNotFound for an unknown id."""
    _, store = _store(settings)
    return store.get_turn(turn_id)


def wait_for_turn(
    turn_id: str,
    timeout: float = 60.0,
    *,
    poll_seconds: float = 0.1,
    settings: Settings | None = None,
) -> Turn:
    """Poll until the turn is done or failed; raises TimeoutError after ``timeout`` seconds."""
    _, store = _store(settings)
    deadline = time.monotonic() + timeout
    while True:
        turn = store.get_turn(turn_id)
        if turn.finished:
            return turn
        if time.monotonic() >= deadline:
            raise TimeoutError(
                f"turn {turn_id} is still {turn.status} after {timeout:g}s "
                f"(attempts {turn.attempts}{', last error: ' + turn.error if turn.error else ''})"
            )
        time.sleep(min(poll_seconds, max(0.0, deadline - time.monotonic())))
