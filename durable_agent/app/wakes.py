"""``send_event(connection=...)`` and ``approve`` / ``deny(connection=...)``: what wakes a
parked turn, recorded in the application's own transaction, and the woken turn sent only
once that transaction has committed.

The event (or the decision with its audit entry) is written on the application's
connection in a savepoint, as ``start_turn(connection=...)`` writes a turn
(``journal/lent.py``): a rollback, of the transaction or of a savepoint around the call,
leaves no event and no decision, and the turn stays parked. The wake itself is part of the
same write (the turn ``queued``, its wait gone), so it too exists only once the transaction
commits, and its announcement on ``durable_agent_wake`` is delivered by Postgres at that
commit, never before, and never after a rollback.

Who sends the woken turn after the commit (``send_woken``: the first to ask sends it, once):

* a SQLAlchemy ``Session``: its ``after_commit`` event;
* a SQLAlchemy ``Connection``: a short-lived thread, from the ``commit`` event, once the
  event (the decision) is visible on durable-agent's own connection;
* a psycopg 3 ``Connection`` (no commit hook): a worker's waker, as the commit delivers the
  announcement; if no waker hears it, the sweeper's next pass (reason ``woken``).

Each of the three also has the others behind it: a woken turn that nobody sends is sent by
the sweeper at its next pass (``DURABLE_AGENT_SWEEP_INTERVAL_SECONDS``), with no grace.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Protocol

from ..delivery.waker import EventParts, events_of, send_woken
from ..errors import ServiceUnavailable
from ..journal import Approval, LentApprovals, LentWaits, OperatorStore, WaitStore
from ..operate import approvals
from ..operate.approvals import Decision
from ..operate.cancel import GetTurn
from ..operate.events import EventSent, send_event
from .transaction import StartParts, check_same_database, lend

log = logging.getLogger(__name__)


class WakeParts(StartParts, EventParts, Protocol):
    """What waking a turn in the application's transaction uses of the runtime."""

    @property
    def operator_store(self) -> OperatorStore: ...


@dataclass(frozen=True, slots=True)
class WakeBell:
    """Send a turn woken in the application's transaction, once it has committed.
    ``event_id`` (an event woke it) or ``step`` (a decision did) says what to look for."""

    runtime: WakeParts
    turn_id: str
    event_id: str | None = None
    step: int | None = None

    @property
    def key(self) -> tuple[str, str]:
        return ("wake", self.turn_id)

    def visible(self) -> bool:
        """The event (the decision) is seen from durable-agent's own connection."""
        if self.event_id is not None:
            events = WaitStore(self.runtime.database).events(self.turn_id)
            return any(e.event_id == self.event_id for e in events)
        assert self.step is not None
        found = self.runtime.operator_store.find_approval(self.turn_id, self.step)
        return found is not None and found.decision is not None

    def grace_seconds(self) -> float:
        return self.runtime.sweeper().grace_seconds

    def ring(self) -> None:
        """Send the woken turn unless a waker did. Never raises: the transaction has
        committed, and the sweeper sends a woken turn nobody sent."""
        runtime = self.runtime
        try:
            send_woken(WaitStore(runtime.database), runtime.journal, runtime.publish, self.turn_id)
        except ServiceUnavailable as error:
            log.warning("turn %s woke; %s; the sweeper will send it", self.turn_id, error)
        except Exception:
            log.exception("turn %s woke; the sweeper will send it", self.turn_id)


def send_event_in_transaction(
    runtime: WakeParts,
    connection: object,
    turn_id: str,
    name: str,
    payload: Any,
    event_id: str | None,
) -> EventSent:
    """``send_event`` with the event recorded on ``connection`` in its transaction; the
    turn it wakes is sent after the commit (see the module docstring)."""
    lent = lend(connection)
    conn = lent.psycopg_connection()
    check_same_database(runtime, conn, "send_event")
    sent = send_event(
        LentWaits(conn, runtime.database.sealer),
        lambda t: None,  # rung after the commit, below
        turn_id,
        name,
        payload,
        event_id=event_id,
        events_of=events_of(runtime),
        on_commit=True,
    )
    if sent.outcome == "woke":
        lent.after_commit(WakeBell(runtime, turn_id, event_id=sent.event_id))
    return sent


def decide_in_transaction(
    runtime: WakeParts,
    get_turn: GetTurn,
    connection: object,
    turn_id: str,
    step: int,
    decision: Decision,
    *,
    reason: str | None,
    by: str | None,
) -> Approval:
    """``approve`` / ``deny`` with the decision and its audit entry written on
    ``connection`` in its transaction; the turn is sent after the commit."""
    lent = lend(connection)
    conn = lent.psycopg_connection()
    check_same_database(runtime, conn, "approve" if decision == "approved" else "deny")
    bells: list[WakeBell] = []

    def after_commit(session_id: str, woken_turn: str, queue: str = "") -> None:
        bells.append(WakeBell(runtime, woken_turn, step=step))

    found = approvals.decide(
        LentApprovals(conn, runtime.database.sealer),
        get_turn,
        after_commit,
        turn_id,
        step,
        decision,
        reason=reason,
        by=by,
    )
    for bell in bells:
        lent.after_commit(bell)
    return found
