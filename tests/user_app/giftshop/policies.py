"""A scripted model for the vouchers agent (a policy: request body in, assistant message out).

python -m durable_agent.testing model-server --policy giftshop.policies:vouchers
"""

from __future__ import annotations

import json
import re
from typing import Any

from durable_agent.testing import call_tool, email_policy, reply

_CUSTOMER = re.compile(r"\bcustomer\s+([\w-]+)", re.I)
_AMOUNT = re.compile(r"(\d+)\s*cents", re.I)


def vouchers(body: dict[str, Any]) -> dict[str, Any]:
    """voucher_balance -> issue_voucher -> reply; after an uncertain issue, check the balance
    and issue only if the customer has no voucher yet."""
    messages = body["messages"]
    last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
    text = messages[last_user]["content"]
    named, priced = _CUSTOMER.search(text), _AMOUNT.search(text)
    customer = named.group(1) if named else "c-1"
    amount = int(priced.group(1)) if priced else 500
    results = [m for m in messages[last_user + 1 :] if m["role"] == "tool"]
    calls = {
        c["id"]: c["function"]["name"]
        for m in messages[last_user + 1 :]
        if m["role"] == "assistant"
        for c in m.get("tool_calls") or []
    }
    done = f"Issued a voucher of {amount} cents to {customer}."
    if not results:
        return call_tool("voucher_balance", {"customer": customer})
    last = results[-1]
    name = calls.get(last["tool_call_id"])
    if name == "issue_voucher":
        if "may or may not have happened" in last["content"]:
            return call_tool("voucher_balance", {"customer": customer})
        return reply(done)
    held = json.loads(last["content"])["vouchers"]
    issued_before = any(calls.get(r["tool_call_id"]) == "issue_voucher" for r in results)
    if held and issued_before:
        return reply(done)
    return call_tool("issue_voucher", {"customer": customer, "amount_cents": amount})


def by_model(body: dict[str, Any]) -> dict[str, Any]:
    """Two agents on one model server: each model name gets its own script."""
    if body.get("model") == "voucher-model":
        return vouchers(body)
    return email_policy(body)
