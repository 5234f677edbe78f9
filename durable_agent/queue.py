"""Ringing the doorbell: put a turn's ids on the broker."""

from __future__ import annotations

import logging

from kombu.exceptions import OperationalError as KombuOperationalError
from kombu.utils.url import maybe_sanitize_url

from .celery_app import TASK_NAME, app_for
from .errors import ServiceUnavailable
from .journal import JournalStore
from .settings import Settings

log = logging.getLogger(__name__)

_PUBLISH_RETRY = {"max_retries": 2, "interval_start": 0.2, "interval_step": 0.5, "interval_max": 1}


def enqueue(
    settings: Settings,
    store: JournalStore,
    session_id: str,
    turn_id: str,
    *,
    countdown: float | None = None,
) -> None:
    """Send ``run_turn(session_id, turn_id)`` and note when it was sent."""
    send(settings, session_id, turn_id, countdown=countdown)
    store.mark_enqueued([turn_id])


def send(
    settings: Settings, session_id: str, turn_id: str, *, countdown: float | None = None
) -> None:
    """Publish the message; raises ServiceUnavailable when the broker cannot take it."""
    app = app_for(settings)
    try:
        app.send_task(
            TASK_NAME,
            args=(session_id, turn_id),
            queue=settings.queue,
            countdown=countdown,
            retry=True,
            retry_policy=_PUBLISH_RETRY,
        )
    except (KombuOperationalError, OSError) as error:
        raise ServiceUnavailable(
            f"cannot reach the broker at {maybe_sanitize_url(settings.broker_url)}: {error}"
        ) from error
