"""The audit trail: every operator action, appended to ``audit_log`` and never changed.

Who (the ``by`` of the action), when (Postgres's clock), what (``approve``, ``deny``,
``resolve``, ``cancel``, ``prune``, ``rekey``; ``agent_changed`` when a worker resumes a
turn under another agent), through which interface and the state before and after. The
interface is that of the process (:func:`acting_through`): ``python`` unless the command
line (``cli``) or the console (``console``) said otherwise; ``worker`` for what a worker
notices.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from .codec import dumps
from .records import _Row

Interface = Literal["cli", "python", "console", "worker"]
Action = Literal["approve", "deny", "resolve", "cancel", "prune", "rekey", "agent_changed"]

INTERFACES: tuple[str, ...] = ("cli", "python", "console", "worker")
_interface: ContextVar[str] = ContextVar("durable_agent_interface", default="python")


def current_interface() -> str:
    return _interface.get()


def set_interface(interface: Interface) -> None:
    """The interface this process (this context) acts through from now on."""
    if interface not in INTERFACES:
        raise ValueError(f"unknown interface {interface!r}")
    _interface.set(interface)


@contextmanager
def acting_through(interface: Interface) -> Iterator[None]:
    """Actions inside the block are recorded as taken through ``interface``."""
    if interface not in INTERFACES:
        raise ValueError(f"unknown interface {interface!r}")
    token = _interface.set(interface)
    try:
        yield
    finally:
        _interface.reset(token)


@dataclass(frozen=True, slots=True)
class AuditEntry(_Row):
    """One row of the audit trail."""

    audit_id: int
    at: datetime
    actor: str
    action: str
    interface: str
    turn_id: str | None
    step: int | None
    before: Any
    after: Any

    def as_json(self) -> dict[str, Any]:
        return {
            "audit_id": self.audit_id,
            "at": self.at.isoformat(),
            "actor": self.actor,
            "action": self.action,
            "interface": self.interface,
            "turn_id": self.turn_id,
            "step": self.step,
            "before": self.before,
            "after": self.after,
        }


def audit_params(
    action: Action,
    actor: str,
    *,
    turn_id: str | None = None,
    step: int | None = None,
    before: Any = None,
    after: Any = None,
    interface: Interface | None = None,
) -> dict[str, Any]:
    """The parameters of ``record_audit`` (sent by the store that takes the action, in its
    transaction)."""
    return {
        "actor": actor,
        "action": action,
        "interface": interface or current_interface(),
        "turn_id": turn_id,
        "step": step,
        "before": None if before is None else dumps(before),
        "after": None if after is None else dumps(after),
    }
