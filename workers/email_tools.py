"""Example tools: look up a note (safe), email it (never), list what was sent (safe).

``send_email`` talks SMTP to ``SMTP_URL`` (default ``smtp://127.0.0.1:1025``);
``list_sent_emails`` reads the inbox's HTTP API at ``INBOX_URL`` (the SMTP test inbox of
``durable_agent.testing``, or any Mailpit-style API), so a model told that a send "may or
may not have happened" can look before it sends again.
"""

from __future__ import annotations

import os
import smtplib
import urllib.parse
from email.message import EmailMessage
from typing import Any

from durable_agent import tool

from .http import request_json

NOTES = {
    "launch": "The launch is on Friday at 10:00 in room 4. Bring the demo laptop.",
    "standup": "Standup moves to 9:30 from Monday on.",
    "offsite": "The offsite is in Lisbon, 12-14 March. Book flights by the end of the month.",
}
SENDER = "agent@durable-agent.test"


def _smtp_address() -> tuple[str, int]:
    url = urllib.parse.urlsplit(os.environ.get("SMTP_URL", "smtp://127.0.0.1:1025"))
    return url.hostname or "127.0.0.1", url.port or 25


@tool(replay="safe")
def lookup_note(name: str) -> str:
    """Look up a saved note by its name.

    Args:
        name: The note's name, e.g. "launch".
    """
    note = NOTES.get(name.strip().lower())
    return note if note is not None else f"No note is named {name!r}. Known: {', '.join(NOTES)}."


@tool(replay="never")
def send_email(to: str, subject: str, body: str, *, idempotency_key: str) -> str:
    """Send an email. Never sent twice by a retry: if interrupted, check list_sent_emails.

    Args:
        to: The recipient's address.
        subject: The subject line.
        body: The plain-text body.
    """
    message = EmailMessage()
    message["From"] = SENDER
    message["To"] = to
    message["Subject"] = subject
    message["Message-ID"] = f"<{idempotency_key}@durable-agent.test>"
    message["X-Idempotency-Key"] = idempotency_key
    message.set_content(body)
    host, port = _smtp_address()
    with smtplib.SMTP(host, port, timeout=10) as smtp:
        smtp.send_message(message)
    return f"Sent {subject!r} to {to}."


@tool(replay="safe")
def list_sent_emails(to: str | None = None) -> list[dict[str, Any]]:
    """List the emails the inbox has received, newest last.

    Args:
        to: Only emails to this address (optional).
    """
    base = os.environ.get("INBOX_URL", "http://127.0.0.1:8025").rstrip("/")
    query = f"?{urllib.parse.urlencode({'to': to})}" if to else ""
    messages = request_json("GET", f"{base}/messages{query}")
    return [{"to": m.get("to"), "subject": m.get("subject")} for m in messages]
