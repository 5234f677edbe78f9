"""A test MCP server (the ``mcp`` SDK's MCPServer, once FastMCP), over stdio or streamable
HTTP, whose tools are the email example's: for tests and the MCP crash-matrix scenario.

``python -m durable_agent.testing.mcp_server`` serves it over stdio;
``python -m durable_agent.testing.mcp_server --http --port 8765`` over streamable HTTP at
``http://127.0.0.1:8765/mcp``. Its tools:

``lookup_note``       read-only (``readOnlyHint``): a saved note's text; an unknown name is an
                      ``isError`` result
``send_email``        destructive (``destructiveHint``): SMTP to ``SMTP_URL`` (the SMTP test
                      inbox of ``durable_agent.testing``); takes an ``idempotency_key``, sent
                      as the message's ``X-Idempotency-Key``
``list_sent_emails``  read-only: the inbox's messages, from its API at ``INBOX_URL``
``archive_note``      no annotations: settles no replay label (``replay=`` must give one);
                      appends the note's name to ``ARCHIVE_FILE`` when set

The scripted model's built-in ``email`` policy drives these tools as it drives the example's.
"""

from __future__ import annotations

import argparse
import json
import os
import smtplib
import urllib.parse
import urllib.request
from email.message import EmailMessage
from typing import Any

NOTES = {
    "launch": "The launch is on Friday at 10:00 in room 4. Bring the demo laptop.",
    "standup": "Standup moves to 9:30 from Monday on.",
    "offsite": "The offsite is in Lisbon, 12-14 March. Book flights by the end of the month.",
}
SENDER = "agent@durable-agent.test"


def build_server() -> Any:
    """The server, its four tools registered."""
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError
    from mcp_types import ToolAnnotations

    server = MCPServer("durable-agent-test", log_level="WARNING")
    read_only = ToolAnnotations(read_only_hint=True)

    @server.tool(annotations=read_only)
    def lookup_note(name: str) -> str:
        """Look up a saved note by its name, e.g. "launch"."""
        note = NOTES.get(name.strip().lower())
        if note is None:
            raise ToolError(f"No note is named {name!r}. Known: {', '.join(NOTES)}.")
        return note

    @server.tool(annotations=ToolAnnotations(destructive_hint=True, idempotent_hint=False))
    def send_email(to: str, subject: str, body: str, idempotency_key: str | None = None) -> str:
        """Send an email. Never sent twice by a retry: if interrupted, check list_sent_emails."""
        message = EmailMessage()
        message["From"] = SENDER
        message["To"] = to
        message["Subject"] = subject
        if idempotency_key:
            message["X-Idempotency-Key"] = idempotency_key
        message.set_content(body)
        url = urllib.parse.urlsplit(os.environ.get("SMTP_URL", "smtp://127.0.0.1:1025"))
        with smtplib.SMTP(url.hostname or "127.0.0.1", url.port or 25, timeout=30) as smtp:
            smtp.send_message(message)
        return f"Sent {subject!r} to {to}."

    @server.tool(annotations=read_only)
    def list_sent_emails(to: str | None = None) -> str:
        """List the emails the inbox has received, newest last (optionally only to one)."""
        base = os.environ.get("INBOX_URL", "http://127.0.0.1:8025").rstrip("/")
        query = f"?{urllib.parse.urlencode({'to': to})}" if to else ""
        with urllib.request.urlopen(f"{base}/messages{query}", timeout=10) as response:
            messages = json.loads(response.read())
        return json.dumps([{"to": m.get("to"), "subject": m.get("subject")} for m in messages])

    @server.tool()
    def archive_note(name: str) -> str:
        """Archive a saved note (no annotations: the client must label it)."""
        archive = os.environ.get("ARCHIVE_FILE")
        if archive:
            with open(archive, "a", encoding="utf-8") as file:
                file.write(name + "\n")
        return f"Archived {name!r}."

    return server


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m durable_agent.testing.mcp_server",
        description="The test MCP server: over stdio, or over streamable HTTP with --http.",
    )
    parser.add_argument("--http", action="store_true", help="serve streamable HTTP at /mcp")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    options = parser.parse_args(argv)
    server = build_server()
    if options.http:
        server.run("streamable-http", host=options.host, port=options.port)
    else:
        server.run("stdio")


if __name__ == "__main__":
    main()
