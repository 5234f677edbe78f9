"""Helpers for testing durable agents, yours included.

* :class:`MemoryJournal`, :class:`ClaimHeld`, :func:`make_step`: run the real step runner
  with no database (no extra needed).
* :class:`ScriptedModelServer`: an OpenAI-compatible Chat Completions server on loopback,
  driven by a policy (``reply``, ``call_tool``, ``call_tools``, ``tool_call`` build its
  answers), that counts repeated requests and injects faults.
* :class:`SmtpInbox`: an SMTP server that keeps what it receives, with a JSON API
  (needs the ``testing`` extra: ``pip install 'durable-agent[testing]'``).
* :class:`PaymentsSandbox`: a payments service that counts refunds and honours idempotency
  keys.
* :class:`Scenario`, :func:`load_scenario`: a crash matrix of your own agent and tools
  (``durable-agent eval crash-matrix --scenario``, the pytest plugin's ``crash_matrix``).
* ``durable_agent.testing.mcp_server``: a test MCP server, the email tools over MCP with
  their annotations and one unannotated tool, over stdio or streamable HTTP (``python -m
  durable_agent.testing.mcp_server [--http --port N]``; needs the ``mcp`` extra).
* ``email_policy``, ``refund_policy``, ``careless_refund_policy``: scripted agents for the
  demo and the evals (``POLICIES`` maps their command-line names to them).

Names load on first use, so importing this package needs nothing beyond durable-agent
itself. Each server runs in a background thread and is a context manager; ``python -m
durable_agent.testing`` runs one as a separate process.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .inbox import InboxMessage, SmtpInbox
    from .memory import ClaimHeld, MemoryJournal, Write, make_step
    from .model_server import ScriptedModelServer, call_tool, call_tools, reply, tool_call
    from .payments import PaymentsSandbox
    from .policies import POLICIES, careless_refund_policy, email_policy, refund_policy
    from .scenario import Scenario, load_scenario

_WHERE = {
    "ClaimHeld": "memory",
    "MemoryJournal": "memory",
    "Write": "memory",
    "make_step": "memory",
    "InboxMessage": "inbox",
    "SmtpInbox": "inbox",
    "ScriptedModelServer": "model_server",
    "call_tool": "model_server",
    "call_tools": "model_server",
    "reply": "model_server",
    "tool_call": "model_server",
    "PaymentsSandbox": "payments",
    "POLICIES": "policies",
    "careless_refund_policy": "policies",
    "email_policy": "policies",
    "refund_policy": "policies",
    "Scenario": "scenario",
    "load_scenario": "scenario",
}

__all__ = [
    "POLICIES",
    "ClaimHeld",
    "InboxMessage",
    "MemoryJournal",
    "PaymentsSandbox",
    "Scenario",
    "ScriptedModelServer",
    "SmtpInbox",
    "Write",
    "call_tool",
    "call_tools",
    "careless_refund_policy",
    "email_policy",
    "load_scenario",
    "make_step",
    "refund_policy",
    "reply",
    "tool_call",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'durable_agent.testing' has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
