"""durable-agent: crash-safe AI agent turns on Celery, with a durable step journal in Postgres.

Before each model or tool call the intent is committed; after it, the outcome. A redelivered
turn reads finished calls back instead of running them again, and every tool carries a
required replay label: ``safe`` (may run again) or ``never`` (never runs twice).
"""

from .app.client import get_turn, list_events, send_event, start_turn, stream_turn, wait_for_turn
from .app.operator import (
    approve,
    audit_trail,
    cancel_turn,
    deny,
    list_approvals,
    list_uncertain,
    prune,
    rekey,
    resolve_uncertain,
)
from .errors import (
    ConfigurationError,
    DurableAgentError,
    InvalidArgument,
    KeyUnavailable,
    LeaseLost,
    ModelUnavailable,
    PayloadTampered,
    ReplayDiverged,
    ServiceUnavailable,
    StepLimitReached,
    ToolDefinitionError,
    TurnEnded,
    TurnFailed,
    TurnNotFound,
)
from .journal import KeyProvider, Step, Turn, TurnStatus
from .operate.events import EventSent
from .operate.live import TurnEvent
from .runtime import Runtime, runtime_for
from .settings import Settings
from .step.agents import Agent
from .step.call_context import CallContext, current_call, still_claimed
from .step.loop import Loop, TurnContext
from .step.tools import Tool, tool
from .step.wait_steps import (
    ChildTurnFailed,
    EventResult,
    agent_tool,
    event_tool,
    wait_for_event,
    wait_seconds,
)

__all__ = [
    "Agent",
    "CallContext",
    "ChildTurnFailed",
    "ConfigurationError",
    "DurableAgentError",
    "EventResult",
    "EventSent",
    "InvalidArgument",
    "KeyProvider",
    "KeyUnavailable",
    "LeaseLost",
    "Loop",
    "ModelUnavailable",
    "PayloadTampered",
    "ReplayDiverged",
    "Runtime",
    "ServiceUnavailable",
    "Settings",
    "Step",
    "StepLimitReached",
    "Tool",
    "ToolDefinitionError",
    "Turn",
    "TurnContext",
    "TurnEnded",
    "TurnEvent",
    "TurnFailed",
    "TurnNotFound",
    "TurnStatus",
    "agent_tool",
    "agent_turn",
    "approve",
    "audit_trail",
    "cancel_turn",
    "current_call",
    "deny",
    "event_tool",
    "get_turn",
    "list_approvals",
    "list_events",
    "list_uncertain",
    "prune",
    "rekey",
    "resolve_uncertain",
    "run_turn",
    "runtime_for",
    "send_event",
    "start_turn",
    "still_claimed",
    "stream_turn",
    "tool",
    "wait_for_event",
    "wait_for_turn",
    "wait_seconds",
]


def __getattr__(name: str) -> object:
    # The Celery tasks live with their app (built from the environment); import it only
    # when asked for.
    if name in ("run_turn", "agent_turn"):
        from . import tasks

        return getattr(tasks, name)
    raise AttributeError(f"module 'durable_agent' has no attribute {name!r}")
