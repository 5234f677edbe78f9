"""The Celery app a worker runs: ``celery -A durable_agent.tasks worker``.

Its runtime is built from the environment (``DURABLE_AGENT_*``), as ``durable-agent
worker``'s is. An application may call ``run_turn.delay(session_id, turn_id)`` for a turn it
recorded itself; ``start_turn`` does both steps for you. The message carries ids only.
"""

from __future__ import annotations

from celery import Celery, Task

from .celery_app import SWEEP_TASK_NAME, TASK_NAME
from .runtime import Runtime, runtime_for

runtime: Runtime = runtime_for()
app: Celery = runtime.celery
run_turn: Task = app.tasks[TASK_NAME]
sweep: Task = app.tasks[SWEEP_TASK_NAME]

__all__ = ["app", "run_turn", "runtime", "sweep"]
