"""Real loopback servers for testing durable agents.

* `ScriptedModelServer`: an OpenAI-compatible Chat Completions server driven by a policy
  (`reply`, `call_tool`, `call_tools`, `tool_call` build its answers), that counts repeated
  requests and injects faults.
* `SmtpInbox`: an SMTP server that keeps what it receives, with a JSON API.
* `PaymentsSandbox`: a payments service that counts refunds and honours idempotency keys.
* `email_policy`, `refund_policy`, `careless_refund_policy`: scripted agents for the demo
  and the evals (`POLICIES` maps their command-line names to them).

Each server runs in a background thread and is a context manager; ``python -m
durable_agent.testing`` runs one as a separate process.
"""

from durable_agent.testing.inbox import InboxMessage, SmtpInbox
from durable_agent.testing.model_server import (
    ScriptedModelServer,
    call_tool,
    call_tools,
    reply,
    tool_call,
)
from durable_agent.testing.payments import PaymentsSandbox
from durable_agent.testing.policies import (
    POLICIES,
    careless_refund_policy,
    email_policy,
    refund_policy,
)

__all__ = [
    "POLICIES",
    "InboxMessage",
    "PaymentsSandbox",
    "ScriptedModelServer",
    "SmtpInbox",
    "call_tool",
    "call_tools",
    "careless_refund_policy",
    "email_policy",
    "refund_policy",
    "reply",
    "tool_call",
]
