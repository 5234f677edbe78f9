"""An in-memory payments service on loopback that counts refunds and honours idempotency keys.

Endpoints (JSON):

* ``GET /orders`` and ``GET /orders/<id>``: ``{"order_id", "amount_cents", "refunded_cents",
  "refunds": [{"refund_id", "amount_cents", "idempotency_key"}]}``; 404 if unknown.
* ``POST /refunds`` ``{"order_id", "amount_cents", "idempotency_key"?}`` (the key may also
  come as an ``Idempotency-Key`` header): a key seen before returns the same refund with
  ``"replayed": true`` (200) and refunds nothing; a refund beyond the order amount is a 409;
  otherwise the refund is recorded (201). Refund ids are ``re_1``, ``re_2``, ...
* ``GET /_stats``: ``{"refunds_executed", "requests", "refund_requests"}``; ``POST /_reset``
  restores the seeded state.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from durable_agent.testing.http import LOOPBACK, HttpRequest, HttpResponse, LoopbackHttpService

__all__ = ["DEFAULT_ORDERS", "PaymentsSandbox", "Refund"]

DEFAULT_ORDERS: Mapping[str, int] = {"A-1001": 4200, "A-1002": 1999, "A-1003": 500}
"""Seeded orders: order id -> amount in cents."""


@dataclass(frozen=True)
class Refund:
    """One executed refund."""

    refund_id: str
    order_id: str
    amount_cents: int
    idempotency_key: str | None


class _RefundRejected(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class PaymentsSandbox(LoopbackHttpService):
    """The payments service; use as a context manager or call `start()`/`stop()`.

    `delay_seconds` makes ``POST /refunds`` wait before applying the refund, and
    `hold()`/`release()` block it there until released, so a test can kill the caller while
    a refund is in flight.
    """

    def __init__(
        self,
        orders: Mapping[str, int] | None = None,
        *,
        host: str = LOOPBACK,
        port: int = 0,
    ) -> None:
        super().__init__(host=host, port=port)
        self._seed = dict(DEFAULT_ORDERS if orders is None else orders)
        self.delay_seconds: float = 0.0
        self._lock = threading.Lock()
        self._refunds: list[Refund] = []
        self._by_key: dict[str, Refund] = {}
        self._requests = 0
        self._refund_requests = 0

    # -- Python API --------------------------------------------------------------------

    @property
    def refunds_executed(self) -> int:
        """How many refunds were actually applied (idempotent replays not included)."""
        with self._lock:
            return len(self._refunds)

    @property
    def request_count(self) -> int:
        """How many API requests were received (``/_stats`` and ``/_reset`` not included)."""
        with self._lock:
            return self._requests

    @property
    def refund_requests(self) -> int:
        """How many ``POST /refunds`` requests were received, replays and rejections included."""
        with self._lock:
            return self._refund_requests

    @property
    def refunds(self) -> list[Refund]:
        """Every executed refund, in order."""
        with self._lock:
            return list(self._refunds)

    @property
    def orders(self) -> dict[str, dict[str, Any]]:
        """A snapshot of every order in its ``GET /orders/<id>`` form."""
        with self._lock:
            return {order_id: self._order_json(order_id) for order_id in self._seed}

    def order(self, order_id: str) -> dict[str, Any]:
        """One order in its ``GET /orders/<id>`` form; raises `KeyError` if unknown."""
        with self._lock:
            if order_id not in self._seed:
                raise KeyError(order_id)
            return self._order_json(order_id)

    def reset(self) -> None:
        """Restore the seeded state: no refunds, no seen keys, counters at zero."""
        with self._lock:
            self._refunds.clear()
            self._by_key.clear()
            self._requests = self._refund_requests = 0

    def stats(self) -> dict[str, int]:
        """The counts served at ``GET /_stats``."""
        with self._lock:
            return {
                "refunds_executed": len(self._refunds),
                "requests": self._requests,
                "refund_requests": self._refund_requests,
            }

    def hold(self, count: int | None = None) -> None:
        """Block ``POST /refunds`` before the refund is applied, until `release()`; only
        the next ``count`` requests when given."""
        self.gate.hold(count)

    def release(self) -> None:
        """Let held refund requests proceed and stop holding new ones."""
        self.gate.release()

    def wait_for_waiting(self, n: int = 1, timeout: float = 5.0) -> None:
        """Return once `n` refund requests are held; raise `TimeoutError` otherwise."""
        self.gate.wait_for_waiting(n, timeout)

    # -- HTTP --------------------------------------------------------------------------

    def handle(self, request: HttpRequest) -> HttpResponse:
        path = request.path.rstrip("/")
        if path == "/_stats" and request.method == "GET":
            return HttpResponse(200, self.stats())
        if path == "/_reset" and request.method == "POST":
            self.reset()
            return HttpResponse(200, self.stats())
        with self._lock:
            self._requests += 1
        if path == "/orders" and request.method == "GET":
            return HttpResponse(200, list(self.orders.values()))
        if path.startswith("/orders/") and request.method == "GET":
            order_id = path.removeprefix("/orders/")
            try:
                return HttpResponse(200, self.order(order_id))
            except KeyError:
                return HttpResponse(404, {"error": f"unknown order {order_id!r}"})
        if path == "/refunds" and request.method == "POST":
            with self._lock:
                self._refund_requests += 1
            return self._post_refund(request)
        return HttpResponse(404, {"error": f"unknown route {request.method} {request.path}"})

    def _post_refund(self, request: HttpRequest) -> HttpResponse:
        try:
            body = request.json()
        except (ValueError, UnicodeDecodeError):
            return HttpResponse(400, {"error": "body must be JSON"})
        if not isinstance(body, dict):
            return HttpResponse(400, {"error": "body must be a JSON object"})
        order_id, amount = body.get("order_id"), body.get("amount_cents")
        key = body.get("idempotency_key") or request.header("idempotency-key")
        if not isinstance(order_id, str):
            return HttpResponse(400, {"error": "order_id must be a string"})
        if not isinstance(amount, int) or isinstance(amount, bool) or amount <= 0:
            return HttpResponse(400, {"error": "amount_cents must be a positive integer"})
        if key is not None and not isinstance(key, str):
            return HttpResponse(400, {"error": "idempotency_key must be a string"})

        self.gate.pass_through()
        self.gate.pause(self.delay_seconds)

        try:
            refund, replayed = self._apply(order_id, amount, key)
        except _RefundRejected as rejected:
            return HttpResponse(rejected.status, {"error": str(rejected)})
        return HttpResponse(200 if replayed else 201, {**asdict(refund), "replayed": replayed})

    def _apply(self, order_id: str, amount: int, key: str | None) -> tuple[Refund, bool]:
        """Apply a refund atomically; returns the refund and whether it was a replay."""
        with self._lock:
            if key is not None and key in self._by_key:
                return self._by_key[key], True
            if order_id not in self._seed:
                raise _RefundRejected(404, f"unknown order {order_id!r}")
            if self._refunded(order_id) + amount > self._seed[order_id]:
                raise _RefundRejected(409, "refund exceeds order amount")
            refund = Refund(f"re_{len(self._refunds) + 1}", order_id, amount, key)
            self._refunds.append(refund)
            if key is not None:
                self._by_key[key] = refund
            return refund, False

    def _refunded(self, order_id: str) -> int:
        return sum(r.amount_cents for r in self._refunds if r.order_id == order_id)

    def _order_json(self, order_id: str) -> dict[str, Any]:
        refunds = [r for r in self._refunds if r.order_id == order_id]
        return {
            "order_id": order_id,
            "amount_cents": self._seed[order_id],
            "refunded_cents": sum(r.amount_cents for r in refunds),
            "refunds": [
                {
                    "refund_id": r.refund_id,
                    "amount_cents": r.amount_cents,
                    "idempotency_key": r.idempotency_key,
                }
                for r in refunds
            ],
        }
