"""Events: what an application sends to a turn that waits (or will wait) for it.

``send_event(turn_id, name, payload, event_id=...)`` records the event for the turn and, if
the turn is parked waiting for that name, wakes it in the same transaction and sends it.
An event sent before the turn waits for it is kept and read when it does; each event is
read by one wait, once (``consume_event``); the same ``event_id`` sent again changes
nothing (``duplicate``). An event for a turn that has ended is refused (TurnEnded); one of a
name the turn's agent does not declare (``Agent(events=[...])``) is refused at once
(InvalidArgument); one the turn never reads stays listed as such (``durable-agent events
TURN``): nothing is lost silently.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from ..errors import InvalidArgument, TurnEnded, TurnNotFound
from ..inputs import check_id
from ..journal import Event, Recorded, WaitStore, storable
from ..step.wait_steps import check_event_name

log = logging.getLogger(__name__)

MAX_PAYLOAD_BYTES = 256 * 1024

SendWoken = Callable[[str], object]
"""Send a woken turn now (``waker.send_woken`` with the runtime's parts)."""
EventsOf = Callable[[str], "tuple[str, ...] | None"]
"""The event names a turn's agent declares (``Agent(events=...)``), None: any name."""


class EventRecorder(Protocol):
    """Where an event is recorded: ``WaitStore`` (its own transaction), or ``LentWaits`` (the
    application's transaction, ``send_event(connection=...)``)."""

    def record_event(self, turn_id: str, event_id: str, name: str, payload: Any) -> Recorded: ...


@dataclass(frozen=True, slots=True)
class EventSent:
    """What ``send_event`` did: ``woke`` (the turn waited for it and goes on now), ``kept``
    (recorded; read when the turn waits for that name), ``duplicate`` (this event id was
    recorded before: nothing changed).

    ``on_commit`` (``send_event(connection=...)``): all of it holds in your transaction and
    takes effect when it commits: ``woke`` means the turn wakes and is sent then; a rollback
    undoes it (no event, the turn still waits). ``duplicate`` is the same before and after."""

    turn_id: str
    name: str
    event_id: str
    outcome: Literal["woke", "kept", "duplicate"]
    turn_status: str
    on_commit: bool = False

    def describe(self) -> str:
        if self.outcome == "woke" and self.on_commit:
            return (
                f"event {self.name!r} ({self.event_id}) recorded in your transaction: turn "
                f"{self.turn_id} wakes when it commits"
            )
        if self.outcome == "woke":
            return f"event {self.name!r} ({self.event_id}) woke turn {self.turn_id}"
        if self.outcome == "duplicate":
            return f"event {self.event_id} was sent to turn {self.turn_id} before; nothing changed"
        return (
            f"event {self.name!r} ({self.event_id}) kept for turn {self.turn_id} "
            f"({self.turn_status}, not waiting for {self.name!r} now): read when it waits for "
            "it; listed as never read if the turn ends first"
        )

    def as_json(self) -> dict[str, Any]:
        return {
            "turn_id": self.turn_id,
            "name": self.name,
            "event_id": self.event_id,
            "outcome": self.outcome,
            "turn_status": self.turn_status,
        }


def check_payload(payload: Any) -> Any:
    clean, problems = storable(payload)
    if problems:
        raise InvalidArgument(f"the payload must be JSON values: {'; '.join(problems)}")
    if len(json.dumps(clean).encode()) > MAX_PAYLOAD_BYTES:
        raise InvalidArgument(f"the payload is over {MAX_PAYLOAD_BYTES} bytes as JSON")
    return clean


def send_event(
    waits: EventRecorder,
    send_woken: SendWoken,
    turn_id: str,
    name: str,
    payload: Any = None,
    *,
    event_id: str | None = None,
    events_of: EventsOf = lambda turn_id: None,
    on_commit: bool = False,
) -> EventSent:
    """Record the event for the turn, waking it if it waits for ``name``; see the module
    docstring. Raises TurnNotFound, TurnEnded, InvalidArgument (also for a name the turn's
    agent does not declare, ``events_of``). ``on_commit``: recorded in the application's
    transaction, ``send_woken`` runs after its commit."""
    check_id("turn_id", turn_id)
    check_event_name(name)
    event_id = check_id("event_id", event_id) if event_id is not None else uuid.uuid4().hex
    payload = check_payload(payload)
    declared = events_of(turn_id)
    if declared is not None and name not in declared:
        raise InvalidArgument(
            f"turn {turn_id} never waits for the event {name!r}: its agent declares "
            f"{', '.join(repr(e) for e in declared) or 'no events'}; nothing recorded"
        )
    recorded = waits.record_event(turn_id, event_id, name, payload)
    if recorded.status is None:
        raise TurnNotFound(turn_id)
    if recorded.recorded_name is not None and recorded.recorded_name != name:
        raise InvalidArgument(
            f"event id {event_id!r} was sent to turn {turn_id} before as {recorded.recorded_name!r}"
        )
    if not recorded.new and recorded.recorded_name is None:
        raise TurnEnded(turn_id, recorded.status, f"event {name!r} ({event_id}) not recorded")
    if not recorded.new:
        return EventSent(turn_id, name, event_id, "duplicate", recorded.status, on_commit)
    if recorded.woke:
        when = " (on commit)" if on_commit else ""
        log.info("event %s (%s) woke turn %s%s", name, event_id, turn_id, when)
        send_woken(turn_id)
        return EventSent(turn_id, name, event_id, "woke", "queued", on_commit)
    return EventSent(turn_id, name, event_id, "kept", recorded.status, on_commit)


def list_events(waits: WaitStore, get_turn: Callable[[str], object], turn_id: str) -> list[Event]:
    """The events sent to a turn, oldest first, each with what became of it."""
    check_id("turn_id", turn_id)
    get_turn(turn_id)  # TurnNotFound
    return waits.events(turn_id)
