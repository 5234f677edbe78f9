"""The Celery app a worker runs: ``celery -A durable_agent.tasks worker``.

Its runtime is built from the environment (``DURABLE_AGENT_*``), as ``durable-agent
worker``'s is. An application calls ``agent_turn.delay(session_id, message)`` to start a
turn from a message, or ``run_turn.delay(session_id, turn_id)`` for a turn it recorded
itself (``start_turn`` records and sends in one call).
"""

from __future__ import annotations

import sys
from pathlib import Path

from celery import Celery, Task

from .delivery.celery_tasks import AGENT_TURN, RUN_TURN, SWEEP
from .errors import ConfigurationError
from .runtime import Runtime, runtime_for


def _started_by_celery() -> bool:
    program = Path(sys.argv[0]) if sys.argv and sys.argv[0] else Path()
    return program.name == "celery" or program.parent.name == "celery"


try:
    runtime: Runtime = runtime_for()
except ConfigurationError as error:
    if not _started_by_celery():
        raise
    # `celery -A durable_agent.tasks ...` with a bad setting: one line, not Celery's
    # "Unable to load celery application" and a traceback
    print(f"error: {error}", file=sys.stderr, flush=True)
    raise SystemExit(2) from None
app: Celery = runtime.celery
run_turn: Task = app.tasks[RUN_TURN]
agent_turn: Task = app.tasks[AGENT_TURN]
sweep: Task = app.tasks[SWEEP]

__all__ = ["agent_turn", "app", "run_turn", "runtime", "sweep"]
