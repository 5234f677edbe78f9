"""Deterministic scripted agents for `ScriptedModelServer`, used by the demo and the evals.

A policy is a pure function of the Chat Completions request body. It looks only at the
current turn (the messages after the last user message), works out where the conversation
is, and returns the next assistant message. Having no state, a replayed request always gets
the same answer.

Tool results are matched to the tool that produced them through ``tool_call_id``. A result
that contains "may or may not have happened" is the journal's note that an unsafe call was
interrupted; a result that starts with "Error" is a failure.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from durable_agent.testing.model_server import JsonDict, Policy, call_tool, reply

__all__ = [
    "AMBIGUOUS_MARKER",
    "POLICIES",
    "careless_refund_policy",
    "email_policy",
    "refund_policy",
]

AMBIGUOUS_MARKER = "may or may not have happened"
"""Text in a tool result meaning the call was interrupted and may have taken effect."""

DEFAULT_NOTE = "launch"
DEFAULT_ADDRESS = "ada@example.com"
DEFAULT_ORDER = "A-1001"

_QUOTE = "'\"\u2018\u2019\u201c\u201d"  # straight and curly quotes
_QUOTED_NOTE = re.compile(
    rf"\bnote\s+(?:named\s+|called\s+)?[{_QUOTE}]([^{_QUOTE}]+)[{_QUOTE}]", re.I
)
_BARE_NOTE = re.compile(r"\bnote\s+(?:named\s+|called\s+)?([\w.-]+)", re.I)
_ADDRESS = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+")
_ORDER = re.compile(r"\border\s+#?([A-Za-z0-9][\w-]*)", re.I)


@dataclass(frozen=True)
class ToolResult:
    """A tool result of the current turn, joined with the call that produced it."""

    name: str
    args: JsonDict
    content: str

    @property
    def ambiguous(self) -> bool:
        """Whether the journal says the call may or may not have happened."""
        return AMBIGUOUS_MARKER in self.content.lower()

    @property
    def is_error(self) -> bool:
        """Whether the tool reported an error."""
        return self.content.lstrip().startswith("Error")


def _text(content: Any) -> str:
    """Text of a message content: a string, a list of content parts, or None."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(part.get("text", "")) if isinstance(part, dict) else str(part) for part in content
        )
    return str(content)


def _current_turn(body: JsonDict) -> tuple[str, list[ToolResult]]:
    """The last user message's text and the tool results that followed it, in order."""
    messages = [m for m in body.get("messages") or [] if isinstance(m, dict)]
    last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)
    user_text = _text(messages[last_user].get("content")) if last_user >= 0 else ""
    calls: dict[str, tuple[str, JsonDict]] = {}
    results: list[ToolResult] = []
    for message in messages[last_user + 1 :]:
        if message.get("role") == "assistant":
            for call in message.get("tool_calls") or []:
                function = call.get("function") or {}
                calls[str(call.get("id"))] = (
                    str(function.get("name", "")),
                    _parse_args(function.get("arguments")),
                )
        elif message.get("role") == "tool":
            name, args = calls.get(str(message.get("tool_call_id")), ("", {}))
            results.append(ToolResult(name, args, _text(message.get("content"))))
    return user_text, results


def _parse_args(arguments: Any) -> JsonDict:
    if isinstance(arguments, dict):
        return arguments
    try:
        parsed = json.loads(arguments or "{}")
    except (TypeError, ValueError):
        return {}
    return parsed if isinstance(parsed, dict) else {}


def _json_object(text: str) -> JsonDict | None:
    try:
        parsed = json.loads(text)
    except ValueError:
        return None
    return parsed if isinstance(parsed, dict) else None


def _last(results: list[ToolResult], name: str) -> ToolResult | None:
    return next((result for result in reversed(results) if result.name == name), None)


def _failure(result: ToolResult) -> JsonDict:
    return reply(f"Sorry, I could not finish: {result.name or 'a tool'} failed ({result.content}).")


# --------------------------------------------------------------------------------------
# "Look up a note, email it"
# --------------------------------------------------------------------------------------


def _note_name(text: str) -> str:
    for pattern in (_QUOTED_NOTE, _BARE_NOTE):
        match = pattern.search(text)
        if match and match.group(1).lower() != "to":
            return match.group(1).strip()
    return DEFAULT_NOTE


def _address(text: str) -> str:
    match = _ADDRESS.search(text)
    return match.group(0) if match else DEFAULT_ADDRESS


def email_policy(body: JsonDict) -> JsonDict:
    """Email a note: lookup_note -> send_email -> reply, checking the outbox when unsure.

    After a send_email result saying it may or may not have happened, the agent calls
    list_sent_emails and only sends again if the outbox has no email with the subject.
    The final reply is the same on every path, so a recovered turn can be compared with a
    clean one.
    """
    user_text, results = _current_turn(body)
    name, to = _note_name(user_text), _address(user_text)
    subject = f"Note: {name}"
    if not results:
        return call_tool("lookup_note", {"name": name})
    last = results[-1]
    if last.name == "send_email" and last.ambiguous:
        return call_tool("list_sent_emails", {"to": to})
    if last.is_error:
        return _failure(last)
    if last.name == "lookup_note":
        return call_tool("send_email", {"to": to, "subject": subject, "body": last.content})
    if last.name == "list_sent_emails":
        if subject in last.content:
            return reply(f"Done: the note '{name}' was sent to {to}.")
        previous = _last(results, "send_email")
        if previous is not None and previous.args:
            return call_tool("send_email", previous.args)
        note = _last(results, "lookup_note")
        return call_tool(
            "send_email", {"to": to, "subject": subject, "body": note.content if note else ""}
        )
    if last.name == "send_email":
        return reply(f"Done: the note '{name}' was sent to {to}.")
    return reply(f"I do not know how to continue after a result from {last.name or 'a tool'}.")


# --------------------------------------------------------------------------------------
# "Refund order X"
# --------------------------------------------------------------------------------------


def _order_id(text: str) -> str:
    match = _ORDER.search(text)
    return match.group(1) if match else DEFAULT_ORDER


def _refund(body: JsonDict, *, check_before_retry: bool) -> JsonDict:
    user_text, results = _current_turn(body)
    order_id = _order_id(user_text)
    if not results:
        return call_tool("get_order", {"order_id": order_id})
    last = results[-1]
    if last.name == "refund_order" and last.ambiguous:
        if check_before_retry:
            return call_tool("get_order", {"order_id": order_id})
        return call_tool("refund_order", last.args)
    if last.is_error:
        return _failure(last)
    if last.name == "get_order":
        order = _json_object(last.content)
        if order is None or "amount_cents" not in order:
            return reply(f"Sorry, I could not read order {order_id}: {last.content}")
        amount, refunded = int(order["amount_cents"]), int(order.get("refunded_cents", 0))
        if refunded >= amount:
            return reply(f"Order {order_id} is already refunded.")
        previous = _last(results, "refund_order")
        if previous is not None and previous.args:
            return call_tool("refund_order", previous.args)
        return call_tool("refund_order", {"order_id": order_id, "amount_cents": amount - refunded})
    if last.name == "refund_order":
        outcome = _json_object(last.content) or {}
        if "error" in outcome:
            return _failure(last)
        refunded_now = last.args.get("amount_cents", outcome.get("amount_cents"))
        return reply(f"Refunded {refunded_now} on order {order_id}.")
    return reply(f"I do not know how to continue after a result from {last.name or 'a tool'}.")


def refund_policy(body: JsonDict) -> JsonDict:
    """Refund an order: get_order -> refund_order -> reply, re-checking the order when unsure.

    The refund is for the outstanding amount (``amount_cents - refunded_cents``, the full
    amount for a fresh order). After a refund_order result saying it may or may not have
    happened, the agent calls get_order again and only refunds if the order is not refunded.
    """
    return _refund(body, check_before_retry=True)


def careless_refund_policy(body: JsonDict) -> JsonDict:
    """Like `refund_policy`, but retries an interrupted refund without checking first.

    It ignores the "may or may not have happened" note, so it can refund twice when the
    refund tool is not idempotent; the heed-note eval uses it to show a failing agent.
    """
    return _refund(body, check_before_retry=False)


POLICIES: dict[str, Policy] = {
    "email": email_policy,
    "refund": refund_policy,
    "careless-refund": careless_refund_policy,
}
