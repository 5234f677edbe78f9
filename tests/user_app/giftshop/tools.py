"""Gift vouchers: a balance lookup (safe) and issuing a voucher (never).

The ledger is a file named by ``GIFTSHOP_LEDGER``: one line per voucher issued, so a test
counts the side effects by counting lines.
"""

from __future__ import annotations

import os
from pathlib import Path

from durable_agent import tool


def ledger() -> Path:
    return Path(os.environ["GIFTSHOP_LEDGER"])


def issued(customer: str | None = None) -> list[str]:
    """The vouchers issued so far (to one customer, or all)."""
    if not ledger().exists():
        return []
    lines = [line for line in ledger().read_text().splitlines() if line]
    return [line for line in lines if customer is None or line.split(" ")[0] == customer]


@tool(replay="safe")
def voucher_balance(customer: str) -> dict[str, object]:
    """The vouchers a customer holds.

    Args:
        customer: The customer's id, e.g. "c-7".
    """
    return {"customer": customer, "vouchers": len(issued(customer))}


@tool(replay="never")
def issue_voucher(customer: str, amount_cents: int, *, idempotency_key: str) -> str:
    """Issue a gift voucher. Never issued twice by a retry: if unsure, check the balance.

    Args:
        customer: The customer's id.
        amount_cents: The voucher's value in cents.
    """
    with ledger().open("a") as file:
        file.write(f"{customer} {amount_cents} {idempotency_key}\n")
    return f"Issued a voucher of {amount_cents} cents to {customer}."
