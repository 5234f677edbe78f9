"""The Celery app, configured from Settings.

Redis is only the doorbell: messages carry ids, Postgres holds the truth. Delivery is
at-least-once and duplicates are routine, so every delivery claims the turn first.
"""

from __future__ import annotations

import threading
from typing import Any

from celery import Celery

from .settings import Settings

TASK_NAME = "durable_agent.run_turn"
SWEEP_TASK_NAME = "durable_agent.sweep"


def celery_config(settings: Settings) -> dict[str, Any]:
    return {
        "broker_url": settings.broker_url,
        "broker_connection_retry_on_startup": True,
        "broker_transport_options": {
            "visibility_timeout": settings.visibility_timeout_seconds,
        },
        "task_default_queue": settings.queue,
        "task_serializer": "json",
        "accept_content": ["json"],
        "result_serializer": "json",
        "task_ignore_result": True,
        "result_backend": None,
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,
        "worker_cancel_long_running_tasks_on_connection_loss": True,
        "worker_send_task_events": True,
        "task_send_sent_event": True,
        "worker_hijack_root_logger": False,
        "broker_channel_error_retry": True,
    }


def create_app(settings: Settings) -> Celery:
    app = Celery("durable_agent", set_as_current=False)
    app.conf.update(celery_config(settings))
    return app


_apps: dict[tuple[str, str], Celery] = {}
_apps_lock = threading.Lock()


def app_for(settings: Settings) -> Celery:
    """A producer app for this broker and queue (cached per process)."""
    key = (settings.broker_url, settings.queue)
    with _apps_lock:
        app = _apps.get(key)
        if app is None:
            app = _apps[key] = create_app(settings)
        return app
