"""The scripted model of the waiting agents (``waiting_agents.py``):
``python -m durable_agent.testing model-server --policy
durable_agent_examples.waiting_agents_policy:waits_policy``.

Research looks the note up and answers with its text; support asks research and passes the
answer on; reminder waits the seconds the user names (``in N seconds``), then emails.
"""

from __future__ import annotations

import re
from typing import Any

from durable_agent.testing import call_tool, reply

_SECONDS = re.compile(r"\bin\s+(\d+)\s+seconds?\b", re.I)
_ADDRESS = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+")


def waits_policy(body: dict[str, Any]) -> dict[str, Any]:
    messages = [m for m in body.get("messages") or [] if isinstance(m, dict)]
    system = str(messages[0].get("content") or "") if messages else ""
    last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)
    request = str(messages[last_user].get("content") or "") if last_user >= 0 else ""
    done = {
        str(m.get("name") or _tool_name(messages, m)): str(m.get("content") or "")
        for m in messages[last_user + 1 :]
        if m.get("role") == "tool"
    }
    if system.startswith("You research"):
        if "lookup_note" not in done:
            return call_tool("lookup_note", {"name": "launch"})
        return reply(f"The note says: {done['lookup_note']}")
    if system.startswith("You answer customers"):
        if "research" not in done:
            return call_tool("research", {"message": request})
        return reply(f"Here is what I found. {done['research']}")
    if system.startswith("You send reminders"):
        if "wait_seconds" not in done:
            found = _SECONDS.search(request)
            return call_tool("wait_seconds", {"seconds": int(found.group(1)) if found else 1})
        if "send_email" not in done:
            address = _ADDRESS.search(request)
            to = address.group(0) if address else "ada@example.com"
            return call_tool("send_email", {"to": to, "subject": "Reminder", "body": request})
        return reply("Reminder sent.")
    return reply("ok")


def _tool_name(messages: list[dict[str, Any]], result: dict[str, Any]) -> str:
    """The name of the tool whose call produced this result (by tool_call_id)."""
    for message in messages:
        for call in message.get("tool_calls") or []:
            if call.get("id") == result.get("tool_call_id"):
                return str((call.get("function") or {}).get("name") or "")
    return ""
