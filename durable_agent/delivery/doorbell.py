"""Ringing the doorbell: put a turn's ids on the broker."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

from kombu.exceptions import OperationalError as KombuOperationalError
from kombu.utils.url import maybe_sanitize_url

from ..errors import ServiceUnavailable
from .celery_tasks import RUN_TURN

if TYPE_CHECKING:
    from ..runtime import Runtime

_PUBLISH_RETRY = {"max_retries": 2, "interval_start": 0.2, "interval_step": 0.5, "interval_max": 1}


def new_message_id() -> str:
    """The id of one message (Celery's task id): Postgres records which one is a turn's
    latest and which one a worker received."""
    return str(uuid.uuid4())


def send(
    runtime: Runtime, session_id: str, turn_id: str, *, queue: str = "", message_id: str
) -> None:
    """Publish ``run_turn(session_id, turn_id)`` to ``queue`` (``""``: the runtime's own);
    ServiceUnavailable when the broker cannot take it."""
    settings = runtime.settings
    try:
        runtime.celery.send_task(
            RUN_TURN,
            args=(session_id, turn_id),
            queue=queue or settings.queue,
            task_id=message_id,
            retry=True,
            retry_policy=_PUBLISH_RETRY,
        )
    except (KombuOperationalError, OSError) as error:
        raise ServiceUnavailable(
            f"cannot reach the broker at {maybe_sanitize_url(settings.broker_url)}: {error}"
        ) from error
