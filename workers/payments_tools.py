"""Example tools against the sandbox payments service: read an order (safe), refund (never).

The service lives at ``PAYMENTS_URL`` (default ``http://127.0.0.1:8090``) and honours
idempotency keys, so a refund retried with the key of an uncertain call collapses into one.
"""

from __future__ import annotations

import os
import urllib.parse
from typing import Any

from durable_agent import tool

from .http import request_json


def _base() -> str:
    return os.environ.get("PAYMENTS_URL", "http://127.0.0.1:8090").rstrip("/")


@tool(replay="safe")
def get_order(order_id: str) -> dict[str, Any]:
    """Read an order: its amount and what has been refunded so far.

    Args:
        order_id: The order's id, e.g. "A-1001".
    """
    result: dict[str, Any] = request_json(
        "GET", f"{_base()}/orders/{urllib.parse.quote(order_id, safe='')}"
    )
    return result


@tool(replay="never")
def refund_order(order_id: str, amount_cents: int, *, idempotency_key: str) -> dict[str, Any]:
    """Refund part or all of an order. Never retried blindly: check get_order first.

    Args:
        order_id: The order's id.
        amount_cents: How much to refund, in cents.
    """
    result: dict[str, Any] = request_json(
        "POST",
        f"{_base()}/refunds",
        {"order_id": order_id, "amount_cents": amount_cents, "idempotency_key": idempotency_key},
    )
    return result
