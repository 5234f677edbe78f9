"""The end of a turn in Celery's result backend, under the turn id.

With ``DURABLE_AGENT_RESULT_BACKEND`` set, ``agent_turn.delay(...)`` returns an
``AsyncResult`` whose id is the turn id, and ``.get()`` gives the reply (or raises
``TurnFailed`` with the reason). No task's own return value is stored (every task ignores
its result): the delivery that ends a turn is often not the message the application sent
(a redelivery after a crash is a ``run_turn`` with another task id), so whichever process
ends the turn stores the end under the turn id, read from Postgres. A delivery that finds
the turn already ended stores it again, so a worker killed between the end and the store
leaves nothing missing once the message comes back.
"""

from __future__ import annotations

import logging
from typing import Protocol

from celery import Celery, states

from ..errors import DurableAgentError, TurnFailed
from ..journal import JournalStore, Turn, TurnStatus
from ..settings import Settings

log = logging.getLogger(__name__)


class ResultParts(Protocol):
    """What storing a result uses of the runtime: its settings, journal and Celery app."""

    @property
    def settings(self) -> Settings: ...

    @property
    def journal(self) -> JournalStore: ...

    @property
    def celery(self) -> Celery: ...


def failure_of(turn: Turn) -> TurnFailed:
    """What ``.get()`` raises for a turn that ended failed or cancelled."""
    return TurnFailed(f"turn {turn.turn_id} {turn.status}: {turn.error or 'no reason recorded'}")


def store_end(runtime: ResultParts, turn_id: str) -> None:
    """Store the end of the turn (if it ended) in the result backend, if one is set.

    Best effort: the turn's end is in Postgres whatever happens here (``wait_for_turn``
    reads it); a backend that cannot be reached costs one log line."""
    if not runtime.settings.result_backend:
        return
    try:
        # marked: a failed or cancelled turn's end is its clear status and error (a turn
        # cancelled or failed because its message does not open has its end stored too)
        turn = runtime.journal.find_turn(turn_id, marked=True)
        if turn is None or not turn.finished:
            return
        backend = runtime.celery.backend
        if turn.status == TurnStatus.DONE:
            unreadable = turn.unreadable_field("reply")
            if unreadable is not None:  # this process lacks its key: .get() would be garbage
                log.warning("the result of turn %s is not stored: %s", turn_id, unreadable.detail)
                return
            backend.store_result(turn_id, turn.reply, states.SUCCESS)
        else:
            backend.mark_as_failure(turn_id, failure_of(turn))
    except Exception as error:  # Postgres or Redis out of reach (redis-py's own errors)
        log.warning("could not store the result of turn %s: %s", turn_id, error)


def store_refusal(runtime: ResultParts, turn_id: str, error: DurableAgentError) -> None:
    """A message refused before a turn was recorded (an over-long message sent to the task
    directly): ``.get()`` raises the reason instead of waiting for nothing."""
    if not runtime.settings.result_backend:
        return
    try:
        runtime.celery.backend.mark_as_failure(turn_id, error)
    except Exception as failure:
        log.warning("could not store the result of %s: %s", turn_id, failure)
