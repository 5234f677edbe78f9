"""A scripted model for the plan-then-act example (``python -m durable_agent.testing
model-server --policy durable_agent_examples.plan_act_policy:plan_email_policy``).

A policy is a pure function of the Chat Completions request body that returns the assistant
message: here the plans and the reply that ``plan_then_act`` asks for. After a
``send_email`` result that "may or may not have happened", the next plan checks
``list_sent_emails`` and sends again only if the email is not there.
"""

from __future__ import annotations

import json
import re
from typing import Any

from .plan_act import REPORT, RESULTS

UNCERTAIN = "may or may not have happened"
_NOTE = re.compile(r"\bnote\s+['\"]?([\w.-]+)", re.I)
_ADDRESS = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+")


def plan_email_policy(body: dict[str, Any]) -> dict[str, Any]:
    """Plan lookup_note then send_email; check the outbox when a send is uncertain."""
    messages = [m for m in body.get("messages") or [] if isinstance(m, dict)]
    users = [str(m.get("content") or "") for m in messages if m.get("role") == "user"]
    request = next((u for u in reversed(users) if not u.startswith((RESULTS, REPORT))), "")
    note = _NOTE.search(request)
    address = _ADDRESS.search(request)
    name = note.group(1) if note else "launch"
    to = address.group(0) if address else "ada@example.com"
    subject = f"Note: {name}"
    last = users[-1] if users else ""
    if last == REPORT:
        return _say(f"Done: the note '{name}' was sent to {to}.")
    if not last.startswith(RESULTS):
        return _plan(
            {"tool": "lookup_note", "arguments": {"name": name}},
            {"tool": "send_email", "arguments": {"to": to, "subject": subject, "body": "$0"}},
        )
    results = json.loads(last[len(RESULTS) :])
    final = results[-1] if results else {}
    if final.get("tool") == "send_email" and UNCERTAIN in final.get("result", ""):
        return _plan({"tool": "list_sent_emails", "arguments": {"to": to}})
    if final.get("tool") == "list_sent_emails" and subject not in final.get("result", ""):
        body_text = _note_text(messages)
        return _plan(
            {"tool": "send_email", "arguments": {"to": to, "subject": subject, "body": body_text}}
        )
    return _plan()


def _note_text(messages: list[dict[str, Any]]) -> str:
    """The lookup_note result of this turn's first round of results."""
    for message in messages:
        content = str(message.get("content") or "")
        if message.get("role") == "user" and content.startswith(RESULTS):
            for item in json.loads(content[len(RESULTS) :]):
                if item.get("tool") == "lookup_note":
                    return str(item.get("result", ""))
    return ""


def _plan(*calls: dict[str, Any]) -> dict[str, Any]:
    return _say(json.dumps(list(calls), separators=(",", ":")))


def _say(content: str) -> dict[str, Any]:
    return {"role": "assistant", "content": content}
