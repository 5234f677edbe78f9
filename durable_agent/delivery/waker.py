"""The waker: sends a parked turn the moment it wakes, instead of at the next sweep.

Whatever wakes a parked turn (an event's sender, the end of a child turn, a decision) does so
in its own transaction, which announces ``wake <turn_id>`` on the channel
``durable_agent_wake`` as it commits. A waker thread in each worker's main process listens
there and sends the turn (``claim_send``: the first process to ask sends it, the others
do nothing). If no waker hears it (none runs, or the connection dropped), the sweeper's
next pass sends the turn ("woken"): the announcement only makes it fast.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import psycopg

from ..errors import DurableAgentError
from ..journal import JournalStore, WaitStore, listen_wakes
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
