"""What a running tool can ask about its own call."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass


@dataclass(frozen=True)
class CallContext:
    """The journaled call a tool is running in."""

    turn_id: str
    step: int
    tool: str
    idempotency_key: str | None
    _still_claimed: Callable[[], bool]

    def still_claimed(self) -> bool:
        """Does this worker still own the turn? Ask right before an irreversible effect."""
        return self._still_claimed()


_current: ContextVar[CallContext | None] = ContextVar("durable_agent_call", default=None)


def current_call() -> CallContext | None:
    """The call being run, inside a tool; None outside one."""
    return _current.get()


def still_claimed() -> bool:
    """Inside a tool: True while this worker's claim on the turn holds. Outside: True."""
    context = _current.get()
    return True if context is None else context.still_claimed()


@contextmanager
def bind_call(context: CallContext) -> Iterator[None]:
    token = _current.set(context)
    try:
        yield
    finally:
        _current.reset(token)
