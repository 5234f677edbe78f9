"""Finds turns that have no live message and enqueues them again.

Redis only rings the doorbell; a message can be lost (a Redis restart, a duplicate ack,
a worker killed with a message in hand) and a turn can be recorded without ever being sent
(the application died in between). Postgres knows every open turn, so the sweeper looks
there for turns that

* were recorded but never enqueued (after a short grace period),
* are held by a claim that expired: the worker died or froze (sent once per expiry),
* were deferred (the model API was down) and are due again (sent once when due), or
* were last enqueued longer ago than ``requeue_after`` and are still not running.

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

from sqlalchemy import bindparam, text

from .errors import DurableAgentError
from .journal import Database, JournalStore, Leases
from .queue import send
from .settings import Settings

log = logging.getLogger(__name__)

_LOCK_KEY = 0x73776565  # "swee"

_DUE = text(
    """
SELECT t.session_id, t.turn_id,
       CASE WHEN t.enqueued_at IS NULL THEN 'never enqueued'
            WHEN t.lease_owner IS NOT NULL AND t.lease_expires_at <= now() THEN 'claim expired'
            WHEN t.not_before IS NOT NULL AND t.enqueued_at < t.not_before THEN 'deferral due'
            ELSE 'message may be lost' END AS why
FROM turns AS t
WHERE t.status IN ('queued', 'running')
  AND (t.lease_owner IS NULL OR t.lease_expires_at <= now())
  AND (t.not_before IS NULL OR t.not_before <= now())
  AND (
        (t.enqueued_at IS NULL AND t.created_at <= now() - make_interval(secs => :grace))
     OR (t.lease_owner IS NOT NULL AND t.lease_expires_at <= now()
         AND (t.enqueued_at IS NULL OR t.enqueued_at <= t.lease_expires_at))
     OR (t.not_before IS NOT NULL AND t.enqueued_at < t.not_before)
     OR (t.enqueued_at <= now() - make_interval(secs => :requeue_after))
  )
  AND NOT EXISTS (
      SELECT 1 FROM turns AS earlier
      WHERE earlier.session_id = t.session_id AND earlier.seq < t.seq
        AND earlier.status IN ('queued', 'running'))
ORDER BY t.created_at
LIMIT :batch
"""
)

_MARK = text("UPDATE turns SET enqueued_at = now() WHERE turn_id IN :ids").bindparams(
    bindparam("ids", expanding=True)
)


class Sweeper:
    """One pass at a time across the fleet; ``sweep_once`` returns the turns it re-enqueued."""

    def __init__(self, settings: Settings, db: Database, *, batch: int = 500) -> None:
        self.settings = settings
        self.db = db
        self.batch = batch
        self.grace_seconds = min(5.0, settings.requeue_after_seconds)
        self.leases = Leases(
            db, JournalStore(db), end_dead_local_claims=settings.end_dead_local_claims
        )

    def sweep_once(self) -> list[tuple[str, str, str]]:
        self.leases.end_dead_local_holders()  # their turns are then due as 'claim expired'
        with self.db.transaction() as conn:
            if not conn.execute(
                text("SELECT pg_try_advisory_xact_lock(:k)"), {"k": _LOCK_KEY}
            ).scalar():
                return []
            rows = conn.execute(
                _DUE,
                {
                    "grace": self.grace_seconds,
                    "requeue_after": self.settings.requeue_after_seconds,
                    "batch": self.batch,
                },
            ).all()
            sent = []
            for session_id, turn_id, why in rows:
                send(self.settings, session_id, turn_id)
                sent.append((session_id, turn_id, why))
                log.info("sweeper enqueued %s (%s)", turn_id, why)
            if sent:
                conn.execute(_MARK, {"ids": [turn_id for _, turn_id, _ in sent]})
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
        while not self._stop.wait(interval):
            try:
                self.sweeper.sweep_once()
            except DurableAgentError as error:
                log.warning("sweep skipped: %s", error)
            except Exception:
                log.exception("sweep failed")
