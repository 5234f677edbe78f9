"""The Celery task ``run_turn`` and the app a worker runs (``celery -A durable_agent.tasks``).

An application may call ``run_turn.delay(session_id, turn_id)`` for a turn it recorded
itself; ``start_turn`` does both steps for you. The message carries ids only.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from celery import signals
from celery.exceptions import Reject

from .celery_app import SWEEP_TASK_NAME, TASK_NAME, app_for
from .errors import DurableAgentError, ServiceUnavailable, TurnNotFound
from .journal import database_for
from .queue import enqueue
from .settings import Settings
from .sweeper import Sweeper, SweeperThread
from .worker import Delivery, TurnWorker

log = logging.getLogger("durable_agent.tasks")

settings = Settings()
app = app_for(settings)
app.conf.beat_schedule = {
    "durable-agent-sweep": {"task": SWEEP_TASK_NAME, "schedule": settings.sweep_interval_seconds}
}

_worker: TurnWorker | None = None
_worker_lock = threading.Lock()


def turn_worker() -> TurnWorker:
    """This process's TurnWorker (tools imported, connection opened on first use)."""
    global _worker
    with _worker_lock:
        if _worker is None:
            _worker = TurnWorker(settings)
        return _worker


_sweeper: SweeperThread | None = None


@signals.worker_init.connect
def _load_tools_at_start(**_: Any) -> None:
    turn_worker()  # fail at start, not at the first turn, when DURABLE_AGENT_TOOLS is wrong


@signals.worker_ready.connect
def _start_sweeper(**_: Any) -> None:
    global _sweeper
    if settings.run_sweeper and _sweeper is None:
        _sweeper = SweeperThread(Sweeper(settings, database_for(settings.database_url)))
        _sweeper.start()


@signals.worker_shutdown.connect
def _stop_sweeper(**_: Any) -> None:
    if _sweeper is not None:
        _sweeper.stop()


@app.task(name=SWEEP_TASK_NAME, ignore_result=True)
def sweep() -> int:
    """One sweep pass, for those who schedule it with ``celery beat`` instead."""
    return len(Sweeper(settings, database_for(settings.database_url)).sweep_once())


@app.task(name=TASK_NAME, bind=True, acks_late=True, ignore_result=True)
def run_turn(self: Any, session_id: str, turn_id: str) -> str:
    """Claim the turn in Postgres and run it; step aside if someone else holds it.

    No delivery schedules a later one with a countdown: a turn that must be looked at again
    (a live claim of another worker, a deferral after a model outage) is re-sent by the
    sweeper from Postgres when it is due. Celery's countdown messages wait unacked in a
    worker's memory, and with kombu 5.7 on Redis such a worker dies when the broker
    connection drops.
    """
    worker = turn_worker()
    try:
        delivery = worker.handle(turn_id)
    except TurnNotFound:
        log.error("delivery for unknown turn %s dropped", turn_id)
        return "unknown turn"
    except ServiceUnavailable as error:
        delivery = Delivery(turn_id, "interrupted", str(error))
    if delivery.outcome == "interrupted":
        # Postgres is unreachable: give the message back after a short pause, so the turn
        # goes on as soon as the database is back (the claim, if any, is this worker's own).
        log.warning("turn %s interrupted, will retry: %s", turn_id, delivery.detail)
        time.sleep(min(2.0, settings.lease_seconds / 3))
        raise Reject(delivery.detail, requeue=True)
    if delivery.follow_up is not None:
        try:
            enqueue(settings, worker.store, *delivery.follow_up)
        except DurableAgentError as error:
            log.warning("could not enqueue %s (the sweeper will): %s", delivery.follow_up, error)
    log.info("turn %s: %s %s", turn_id, delivery.outcome, delivery.detail[:200])
    return delivery.outcome
