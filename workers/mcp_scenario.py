"""The crash matrix of an agent whose tools come from an MCP server (``durable-agent eval
crash-matrix --scenario durable_agent_examples.mcp_scenario:scenario``): the ``mcp-mailer``
agent of ``mcp_agent.py``, its server started over stdio by each worker."""

from __future__ import annotations

from durable_agent.testing import Scenario, SmtpInbox


def scenario() -> Scenario:
    """mcp-mailer emails a note through the MCP server; the SMTP test inbox counts them."""
    inbox = SmtpInbox()
    return Scenario(
        name="mcp-mailer",
        message="Please email the note 'launch' to ada@example.com.",
        modules=["durable_agent_examples.mcp_agent"],
        agent="mcp-mailer",
        policy="email",
        effects={"send_email": lambda: inbox.count},
        services=[inbox],
        env=lambda: {"SMTP_URL": inbox.smtp_url, "INBOX_URL": inbox.api_url},
        reset=inbox.clear,
    )
