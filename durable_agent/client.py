"""What an application calls: record a turn and enqueue it, read it, wait for it.

Each function works on the runtime of the settings it is given (the environment's when
none), so it reaches the same database, broker and queue as that runtime's workers and its
``run_turn`` task. Code that already holds a :class:`~durable_agent.runtime.Runtime` can call
the same methods on it.
"""

from __future__ import annotations

from .journal import Turn
from .runtime import runtime_for
from .settings import Settings


def start_turn(
    session_id: str,
    message: str,
    *,
    turn_id: str | None = None,
    agent: str | None = None,
    settings: Settings | None = None,
) -> str:
    """Record a turn of ``agent`` (the environment's ``default`` agent when None) in
    Postgres, then enqueue it on the agent's queue; returns the turn id.

    The turn is durable once this returns, even if the broker is down: the sweeper
    enqueues turns that were recorded but never sent. Passing your own ``turn_id`` makes a
    retried call return the same turn instead of creating a second one.
    """
    return runtime_for(settings).start_turn(session_id, message, turn_id=turn_id, agent=agent)


def get_turn(turn_id: str, *, settings: Settings | None = None) -> Turn:
    """The turn as recorded now; raises TurnNotFound for an unknown id."""
    return runtime_for(settings).get_turn(turn_id)


def wait_for_turn(
    turn_id: str,
    timeout: float = 60.0,
    *,
    poll_seconds: float = 0.1,
    settings: Settings | None = None,
) -> Turn:
    """Wait until the turn is done or failed; raises TimeoutError after ``timeout`` seconds."""
    return runtime_for(settings).wait_for_turn(turn_id, timeout, poll_seconds)
