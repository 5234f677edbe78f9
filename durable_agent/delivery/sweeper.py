"""Finds turns that have no live message and enqueues them again.

Redis only rings the doorbell; a message can be lost (a Redis restart, a duplicate ack,
a worker killed with a message in hand) and a turn can be recorded without ever being sent
(the application died in between). Postgres knows every open turn, so the sweeper looks
there for turns that

* were recorded but never enqueued (after a short grace period),
* are held by a claim that expired: the worker died or froze (sent once per expiry),
* were deferred (the model API was down) and are due again (sent once when due), or
* were last enqueued longer ago than ``requeue_after`` and are still not running.

A parked turn (``waiting``) is not sent while it waits: a pass first wakes the parked turns
whose due time passed (a sleep, an event's timeout; ``wake_due``), which are then sent as
"woken" with the others; a decision, an event or a child's end wakes its turn itself (the
waker sends it at once; a pass sends it if not). A cancelled turn has ended. A pass also
hands new uncertain effects to the configured hooks
(``uncertain.py``).

Deliveries never schedule themselves with a countdown; these passes are how a turn gets
looked at again.

A claim whose holder was a process of this machine that no longer exists is ended at once
(``DURABLE_AGENT_END_DEAD_LOCAL_CLAIMS``), so its turn is due without waiting for the lease.

A pass runs under a transaction-level advisory lock, so across the fleet one sweeper works
at a time; every ``durable-agent worker`` runs one in a thread by default.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Protocol

from ..errors import DurableAgentError, ServiceUnavailable
from ..journal import Leases
from ..settings import Settings
from .doorbell import new_message_id
from .outage import Outage

Publish = Callable[..., None]
"""``publish(session_id, turn_id, *, queue, message_id, trace)``: put the message on the broker
(``doorbell.send`` with the runtime's app); ServiceUnavailable when it cannot."""

log = logging.getLogger(__name__)


class Counters(Protocol):
    """What the sweeper counts (``telemetry/counters.py``)."""

    def resent(self, reason: str) -> None: ...


_LOCK_KEY = 0x73776565  # "swee"


class Sweeper:
    """One pass at a time across the fleet; ``sweep_once`` returns the turns it re-enqueued."""

    def __init__(
        self,
        settings: Settings,
        leases: Leases,
        outage: Outage,
        publish: Publish,
        notify_uncertain: Callable[[], object],
        *,
        batch: int = 500,
    ) -> None:
        self.settings = settings
        self.leases = leases
        self.outage = outage
        self.publish = publish
        self.notify_uncertain = notify_uncertain  # paging.notify_new, wired by the runtime
        self.batch = batch
        self.grace_seconds = min(5.0, self.settings.requeue_after_seconds)
        self.count_resend: Callable[[str], object] | None = None

    def counted_by(self, counters: Counters | None) -> Sweeper:
        """Count each re-send by its reason (a worker's metrics, when it serves them)."""
        self.count_resend = counters.resent if counters is not None else None
        return self

    def sweep_once(self) -> list[tuple[str, str, str]]:
        try:
            self.notify_uncertain()  # uncertain effects to the configured hooks (paging.py)
        except ServiceUnavailable:
            raise
        except DurableAgentError as error:  # paging must not stop the sweep
            log.warning("uncertain effects not told yet (will retry): %s", error)
        self.leases.end_dead_local_holders()  # their turns are then due as 'claim expired'
        dead_receivers = self.leases.dead_local_receivers()
        # committed before the pass: a woken turn's message must find it queued
        woken = self.leases.wake_due(self.batch)
        if woken:
            log.info("sweeper woke %d parked turn(s) whose time came", len(woken))
        with self.leases.sweep_pass(_LOCK_KEY) as tx:
            if tx is None:
                return []
            rows = tx.due_turns(
                grace=self.grace_seconds,
                lease=self.settings.lease_seconds,
                requeue_after=self.settings.requeue_after_seconds,
                dead_receivers=dead_receivers,
                batch=self.batch,
                # Right after a Postgres outage, claims that ran out during it belong to
                # workers that were waiting for Postgres too: give them a lease to return.
                claims_expire=not self.outage.ended_within(self.settings.lease_seconds),
            )
            sent: list[tuple[str, str, str]] = []
            message_ids: list[str] = []
            try:
                for row in rows:
                    message_id = new_message_id()
                    self.publish(
                        row["session_id"],
                        row["turn_id"],
                        queue=row["queue"],
                        message_id=message_id,
                        trace=row["trace_context"],  # the turn joins its trace again
                    )
                    sent.append((row["session_id"], row["turn_id"], row["why"]))
                    message_ids.append(message_id)
                    log.info("sweeper enqueued %s (%s)", row["turn_id"], row["why"])
                    if self.count_resend is not None:
                        self.count_resend(row["why"])
            finally:  # what went out is recorded, even if the broker failed half-way
                if sent:
                    tx.mark_sent(
                        turn_ids=[turn_id for _, turn_id, _ in sent],
                        message_ids=message_ids,
                    )
        return sent


class SweeperThread:
    """Runs sweep passes every ``sweep_interval_seconds`` until stopped."""

    def __init__(self, sweeper: Sweeper) -> None:
        self.sweeper = sweeper
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="durable-agent-sweeper", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        interval = self.sweeper.settings.sweep_interval_seconds
        outage = self.sweeper.outage
        while not self._stop.wait(interval):
            try:
                self.sweeper.sweep_once()
            except ServiceUnavailable as error:
                outage.report(error)  # one line per outage, not one per pass
                continue
            except DurableAgentError as error:
                log.warning("sweep skipped: %s", error)
            except Exception:
                log.exception("sweep failed")
            outage.recovered()
