"""Tests for the loopback payments sandbox."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from durable_agent.testing import PaymentsSandbox, ScriptedModelServer, refund_policy
from durable_agent.testing.__main__ import ServerProcess


def http(
    method: str, url: str, body: Any = None, headers: dict[str, str] | None = None
) -> tuple[int, Any]:
    """Send one JSON request and return (status, decoded JSON) without raising on errors."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        with error:
            return error.code, json.loads(error.read())


@pytest.fixture
def payments() -> Iterator[PaymentsSandbox]:
    with PaymentsSandbox() as running:
        yield running


def refund(payments: PaymentsSandbox, amount: int, key: str | None = None) -> tuple[int, Any]:
    body: dict[str, Any] = {"order_id": "A-1001", "amount_cents": amount}
    if key is not None:
        body["idempotency_key"] = key
    return http("POST", f"{payments.url}/refunds", body)


def test_get_order(payments: PaymentsSandbox) -> None:
    status, order = http("GET", f"{payments.url}/orders/A-1001")
    assert status == 200
    assert order == {"order_id": "A-1001", "amount_cents": 4200, "refunded_cents": 0, "refunds": []}
    status, error = http("GET", f"{payments.url}/orders/NOPE")
    assert status == 404
    assert "unknown order" in error["error"]


def test_same_idempotency_key_refunds_once(payments: PaymentsSandbox) -> None:
    first = refund(payments, 4200, key="turn-1:step-3")
    again = refund(payments, 4200, key="turn-1:step-3")

    assert first == (
        201,
        {
            "refund_id": "re_1",
            "order_id": "A-1001",
            "amount_cents": 4200,
            "idempotency_key": "turn-1:step-3",
            "replayed": False,
        },
    )
    assert again == (200, {**first[1], "replayed": True})
    assert payments.refunds_executed == 1
    assert payments.order("A-1001")["refunded_cents"] == 4200
    assert payments.orders["A-1001"]["refunds"] == [
        {"refund_id": "re_1", "amount_cents": 4200, "idempotency_key": "turn-1:step-3"}
    ]


def test_idempotency_key_header_is_honoured(payments: PaymentsSandbox) -> None:
    url = f"{payments.url}/refunds"
    body = {"order_id": "A-1002", "amount_cents": 100}
    headers = {"Idempotency-Key": "k1"}
    assert http("POST", url, body, headers)[0] == 201
    assert http("POST", url, body, headers)[0] == 200
    assert payments.refunds_executed == 1


def test_over_refund_is_rejected(payments: PaymentsSandbox) -> None:
    assert refund(payments, 4000)[0] == 201
    status, error = refund(payments, 201)
    assert (status, error) == (409, {"error": "refund exceeds order amount"})
    assert refund(payments, 200)[0] == 201
    assert payments.refunds_executed == 2
    assert [r.refund_id for r in payments.refunds] == ["re_1", "re_2"]


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ({"order_id": "A-1001"}, 400),
        ({"order_id": "A-1001", "amount_cents": 0}, 400),
        ({"order_id": "A-1001", "amount_cents": "10"}, 400),
        ({"amount_cents": 10}, 400),
        ({"order_id": "NOPE", "amount_cents": 10}, 404),
        ([1, 2], 400),
    ],
)
def test_invalid_refunds(payments: PaymentsSandbox, body: Any, status: int) -> None:
    assert http("POST", f"{payments.url}/refunds", body)[0] == status
    assert payments.refunds_executed == 0


def test_stats_and_reset(payments: PaymentsSandbox) -> None:
    refund(payments, 100, key="a")
    refund(payments, 100, key="a")
    http("GET", f"{payments.url}/orders/A-1001")

    assert http("GET", f"{payments.url}/_stats") == (
        200,
        {"refunds_executed": 1, "requests": 3, "refund_requests": 2},
    )
    assert http("POST", f"{payments.url}/_reset")[0] == 200
    assert payments.refunds_executed == 0
    assert payments.order("A-1001")["refunded_cents"] == 0
    assert refund(payments, 100, key="a")[0] == 201  # seen keys are forgotten too


def test_hold_keeps_refunds_in_flight_until_release(payments: PaymentsSandbox) -> None:
    results: list[tuple[int, Any]] = []
    workers = [
        threading.Thread(target=lambda: results.append(refund(payments, 4200, key="same")))
        for _ in range(2)
    ]
    payments.hold()
    for worker in workers:
        worker.start()
    try:
        payments.wait_for_waiting(2, timeout=10)
        assert payments.refunds_executed == 0
    finally:
        payments.release()
        for worker in workers:
            worker.join(timeout=10)
    assert sorted(status for status, _ in results) == [200, 201]
    assert payments.refunds_executed == 1


def test_delay_seconds_delays_the_refund(payments: PaymentsSandbox) -> None:
    payments.delay_seconds = 0.2
    started = time.monotonic()
    assert refund(payments, 10)[0] == 201
    assert time.monotonic() - started >= 0.2


def test_custom_orders_and_restart() -> None:
    sandbox = PaymentsSandbox({"Z-1": 50})
    with sandbox:
        port = sandbox.port
        assert list(sandbox.orders) == ["Z-1"]
        assert (
            http("POST", f"{sandbox.url}/refunds", {"order_id": "Z-1", "amount_cents": 51})[0]
            == 409
        )
    with sandbox:
        assert sandbox.port == port


def test_refund_agent_end_to_end(payments: PaymentsSandbox) -> None:
    """refund_policy over the real SDK, with tools calling the sandbox over HTTP."""

    def run_tool(name: str, args: dict[str, Any]) -> str:
        if name == "get_order":
            return json.dumps(http("GET", f"{payments.url}/orders/{args['order_id']}")[1])
        status, body = http("POST", f"{payments.url}/refunds", args)
        return json.dumps(body) if status < 300 else f"Error: {body['error']}"

    messages: list[Any] = [{"role": "user", "content": "Refund order A-1002"}]
    with (
        ScriptedModelServer(refund_policy) as model,
        openai.OpenAI(base_url=model.base_url, api_key="test", max_retries=0) as sdk,
    ):
        for _ in range(5):
            message = sdk.chat.completions.create(model="m", messages=messages).choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            if not message.tool_calls:
                break
            for call in message.tool_calls:
                name, args = call.function.name, json.loads(call.function.arguments)  # type: ignore[union-attr]
                content = run_tool(name, args)
                messages.append({"role": "tool", "tool_call_id": call.id, "content": content})
    assert messages[-1]["content"] == "Refunded 1999 on order A-1002."
    assert payments.refunds_executed == 1


def test_command_line_payments() -> None:
    proc = ServerProcess("payments", "--order", "B-1=700")
    try:
        proc.start()
        url = proc.info["url"]
        body = {"order_id": "B-1", "amount_cents": 700, "idempotency_key": "k"}
        assert http("POST", f"{url}/refunds", body)[0] == 201
        assert http("POST", f"{url}/refunds", body)[0] == 200
        assert http("GET", f"{url}/_stats")[1]["refunds_executed"] == 1
        assert proc.stop() == 0
    finally:
        proc.kill()
