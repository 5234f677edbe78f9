"""The waker: sends a parked turn the moment it wakes, instead of at the next sweep.

Whatever wakes a parked turn (an event's sender, the end of a child turn, a decision) does so
in its own transaction, which announces ``wake <turn_id>`` on the channel
``durable_agent_wake`` as it commits. A waker thread in each worker's main process listens
there and sends the turn (``claim_send``: the first process to ask sends it, the others
do nothing). If no waker hears it (none runs, or the connection dropped), the sweeper's
next pass sends the turn ("woken"): the announcement only makes it fast.

``deliver_event`` is ``send_event`` with a runtime's parts: it sends the turn it woke at once.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, Protocol

import psycopg

from ..errors import ConfigurationError, DurableAgentError
from ..journal import Database, JournalStore, WaitStore, listen_wakes
from ..operate.events import EventSent, send_event
from ..step.agents import AgentBook
from .doorbell import new_message_id

log = logging.getLogger(__name__)

Publish = Callable[..., None]
"""``publish(session_id, turn_id, *, queue, message_id)`` (see sweeper.Publish)."""


def send_woken(waits: WaitStore, journal: JournalStore, publish: Publish, turn_id: str) -> bool:
    """Send a woken turn unless someone else did; True if this call sent it."""
    message_id = new_message_id()
    claimed = waits.claim_send(turn_id, message_id)
    if claimed is None:
        return False
    session_id, _, queue = claimed
    try:
        publish(session_id, turn_id, queue=queue, message_id=message_id)
    except DurableAgentError as error:
        journal.unmark_sent(turn_id, message_id)  # the sweeper sends it
        log.warning("could not send woken turn %s (the sweeper will): %s", turn_id, error)
        return False
    log.info("woken turn %s sent", turn_id)
    return True


class WakerThread:
    """Listens on ``durable_agent_wake`` and sends each woken turn."""

    def __init__(self, conninfo: str, send: Callable[[str], object]) -> None:
        self.conninfo = conninfo
        self.send = send
        self._stop = threading.Event()
        self.listening = threading.Event()
        self._thread = threading.Thread(target=self._run, name="durable-agent-waker", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        backoff = 0.2
        while not self._stop.is_set():
            try:
                with psycopg.connect(
                    self.conninfo, autocommit=True, application_name="durable-agent-waker"
                ) as conn:
                    listen_wakes(conn)
                    self.listening.set()
                    backoff = 0.2
                    while not self._stop.is_set():
                        for note in conn.notifies(timeout=0.5):
                            self._send(note.payload)
            except psycopg.Error as error:
                self.listening.clear()
                log.debug("waker not listening (%s); the sweeper sends woken turns", error)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 5.0)

    def _send(self, turn_id: str) -> None:
        try:
            self.send(turn_id)
        except DurableAgentError as error:
            log.warning("could not send woken turn %s (the sweeper will): %s", turn_id, error)
        except psycopg.Error as error:
            log.warning("could not send woken turn %s (the sweeper will): %s", turn_id, error)


class EventParts(Protocol):
    """What sending an event uses of a runtime."""

    @property
    def database(self) -> Database: ...

    @property
    def journal(self) -> JournalStore: ...

    @property
    def agents(self) -> AgentBook: ...

    def publish(
        self, session_id: str, turn_id: str, *, queue: str = "", message_id: str
    ) -> None: ...


def deliver_event(
    runtime: EventParts, turn_id: str, name: str, payload: Any, event_id: str | None
) -> EventSent:
    """``send_event`` on a runtime's parts (the Celery task, ``durable_agent.send_event``, the
    ``send-event`` command): the event recorded, and the turn it woke sent at once."""
    waits = WaitStore(runtime.database)
    return send_event(
        waits,
        lambda t: send_woken(waits, runtime.journal, runtime.publish, t),
        turn_id,
        name,
        payload,
        event_id=event_id,
        events_of=events_of(runtime),
    )


def events_of(runtime: EventParts) -> Callable[[str], tuple[str, ...] | None]:
    """The event names a turn's agent declares (None: any; also for a turn not visible
    here, e.g. one started in the same transaction as the event)."""

    def declared(turn_id: str) -> tuple[str, ...] | None:
        turn = runtime.journal.find_turn(turn_id)
        try:
            agent = runtime.agents.get(turn.agent) if turn is not None else None
        except ConfigurationError:  # this process cannot load the agents: no check here
            return None
        return agent.events if agent is not None else None

    return declared
