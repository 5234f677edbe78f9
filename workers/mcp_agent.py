"""An agent whose tools come from an MCP server: the test server of
``durable_agent.testing.mcp_server`` (the email example's tools, served over MCP).

Started over stdio by each worker process (``python -m durable_agent.testing.mcp_server``),
or reached over streamable HTTP when ``MCP_URL`` is set. ``lookup_note`` and
``list_sent_emails`` are read-only on the server (``safe``), ``send_email`` destructive
(``never``); ``archive_note`` has no annotations and is labelled here. Point a worker at it
with ``DURABLE_AGENT_AGENTS=durable_agent_examples.mcp_agent`` (and ``SMTP_URL``,
``INBOX_URL`` for the server's email) and start turns with ``agent="mcp-mailer"``.
"""

from __future__ import annotations

import os
import sys

from durable_agent import Agent
from durable_agent.mcp import tools_from_server

_URL = os.environ.get("MCP_URL") or None

notes_server = tools_from_server(
    "notes",
    url=_URL,
    command=None if _URL else [sys.executable, "-m", "durable_agent.testing.mcp_server"],
    env=None
    if _URL
    else {
        "SMTP_URL": os.environ.get("SMTP_URL", "smtp://127.0.0.1:1025"),
        "INBOX_URL": os.environ.get("INBOX_URL", "http://127.0.0.1:8025"),
    },
    replay={"archive_note": "safe"},
)

mcp_mailer = Agent(
    "mcp-mailer",
    instructions="You look up notes and email them. Check list_sent_emails before you resend.",
    tools=[
        notes_server.named("lookup_note"),
        notes_server.named("send_email"),
        notes_server.named("list_sent_emails"),
    ],
    parameters={"temperature": 0},
)
