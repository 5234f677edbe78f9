"""The shop's agents: one for vouchers, one for support emails, each with its own model,
tools and queue."""

from __future__ import annotations

import os

from durable_agent_examples.email_tools import list_sent_emails, lookup_note, send_email

from durable_agent import Agent

from .tools import issue_voucher, voucher_balance

vouchers = Agent(
    "vouchers",
    model="voucher-model",
    instructions=os.environ.get(
        "GIFTSHOP_VOUCHER_INSTRUCTIONS",
        "You issue gift vouchers. If an issue may or may not have happened, check the balance.",
    ),
    tools=[voucher_balance, issue_voucher],
    queue=os.environ.get("GIFTSHOP_VOUCHER_QUEUE") or None,
    max_steps=12,
    parameters={"temperature": 0},
)

support = Agent(
    "support",
    model="support-model",
    tools=[lookup_note, send_email, list_sent_emails],
    queue=os.environ.get("GIFTSHOP_SUPPORT_QUEUE") or None,
)
