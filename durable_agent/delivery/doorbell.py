"""Ringing the doorbell: put a turn's ids on the broker."""

from __future__ import annotations

import json
import uuid

from celery import Celery
from kombu.exceptions import OperationalError as KombuOperationalError
from kombu.utils.url import maybe_sanitize_url

from ..errors import ServiceUnavailable
from .task_names import RUN_TURN

_PUBLISH_RETRY = {"max_retries": 2, "interval_start": 0.2, "interval_step": 0.5, "interval_max": 1}


def new_message_id() -> str:
    """The id of one message (Celery's task id): Postgres records which one is a turn's
    latest and which one a worker received."""
    return str(uuid.uuid4())


def send(
    app: Celery,
    session_id: str,
    turn_id: str,
    *,
    queue: str = "",
    message_id: str,
    trace: str | None = None,
) -> None:
    """Publish ``run_turn(session_id, turn_id)`` with ``app`` to ``queue`` (``""``: the
    app's default queue, ``DURABLE_AGENT_QUEUE``), with the turn's trace context (``trace``,
    as stored with it) in the message's headers; ServiceUnavailable when the broker cannot
    take it."""
    try:
        app.send_task(
            RUN_TURN,
            args=(session_id, turn_id),
            queue=queue or app.conf.task_default_queue,
            task_id=message_id,
            headers=trace_headers(trace),
            retry=True,
            retry_policy=_PUBLISH_RETRY,
        )
    except (KombuOperationalError, OSError) as error:
        raise ServiceUnavailable(
            f"cannot reach the broker at {maybe_sanitize_url(app.conf.broker_url)}: {error}"
        ) from error


TRACE_HEADERS = ("traceparent", "tracestate")


def trace_headers(trace: str | None) -> dict[str, str] | None:
    """The W3C headers of a stored trace context (JSON), for a message; None without one."""
    if not trace:
        return None
    try:
        value = json.loads(trace)
    except ValueError:
        return None
    if not isinstance(value, dict):
        return None
    headers = {k: str(v) for k, v in value.items() if k in TRACE_HEADERS and v}
    return headers or None
