"""The order desk example (FastAPI + SQLAlchemy): an order and its agent turn in one
transaction. A rolled-back order leaves no turn and no message; a committed one runs once on
a real worker; an application killed between the commit and the message has its turn
recovered by the sweeper."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest
import redis
from durable_agent_examples.orders_app import create_app
from fastapi.testclient import TestClient

from durable_agent import cancel_turn
from durable_agent.journal import TurnStatus, WaitStore
from durable_agent.testing.harness import queued_turns, settings_env, wait_until

if TYPE_CHECKING:
    from conftest import Spawn, Stack

ORDER = {"reference": "A-1", "customer_email": "ada@example.com", "note": "launch"}


@pytest.fixture
def desk(stack: Stack) -> Iterator[TestClient]:
    with TestClient(create_app(stack.settings)) as client:
        yield client


def test_a_rolled_back_order_leaves_no_turn_and_no_message(
    stack: Stack, desk: TestClient, redis_client: redis.Redis
) -> None:
    placed = desk.post("/orders", json=ORDER)
    assert placed.status_code == 201, placed.text
    refused = desk.post("/orders", json={**ORDER, "note": "other"})  # reference taken
    assert refused.status_code == 409, refused.text

    turns = stack.store.list_turns()
    assert [t.turn_id for t in turns] == [placed.json()["turn_id"]]
    assert queued_turns(redis_client, stack.settings.queue) == [
        ("order-A-1", placed.json()["turn_id"])
    ]


def test_a_committed_order_runs_once(stack: Stack, spawn: Spawn, desk: TestClient) -> None:
    spawn()
    placed = desk.post("/orders", json=ORDER)
    assert placed.status_code == 201, placed.text
    turn_id = placed.json()["turn_id"]

    turn = stack.wait_turn(turn_id)
    assert turn.status == TurnStatus.DONE, stack.report(turn_id)
    assert turn.message == stack.message  # what the scripted model answers
    assert turn.reply == stack.clean_reply
    assert turn.attempts == 1
    assert stack.shape(turn_id) == stack.clean_steps
    assert stack.subjects() == [stack.subject]  # one email: the turn ran once
    shown = desk.get("/orders/A-1").json()
    assert (shown["turn_status"], shown["reply"]) == ("done", stack.clean_reply)


APP_KILLED_AFTER_COMMIT = """
from fastapi.testclient import TestClient
from durable_agent_examples.orders_app import create_app

with TestClient(create_app()) as client:
    client.post("/orders", json={order!r})
"""


def test_a_crash_between_commit_and_doorbell_is_recovered_by_the_sweeper(
    stack: Stack, spawn: Spawn, redis_client: redis.Redis
) -> None:
    env = {
        **os.environ,
        **settings_env(stack.settings),
        **stack.env,
        "CRASH_AT": "doorbell:after_commit",
    }
    app = subprocess.run(
        [sys.executable, "-c", APP_KILLED_AFTER_COMMIT.format(order=ORDER)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert app.returncode == 1, app.stderr
    assert "CRASH_AT=doorbell:after_commit reached" in app.stderr

    (turn,) = stack.store.list_turns()  # committed with its order...
    assert turn.message_id is None  # ...and never sent
    assert queued_turns(redis_client, stack.settings.queue) == []

    spawn()  # its sweeper finds the turn never enqueued, after the grace period
    done = stack.wait_turn(turn.turn_id, timeout=45)
    assert done.status == TurnStatus.DONE, stack.report(turn.turn_id)
    assert done.reply == stack.clean_reply
    assert stack.subjects() == [stack.subject]
    assert "never enqueued" in "".join(w.log_text() for w in stack.workers)


def test_the_streaming_chat_endpoint_served_by_uvicorn_to_a_real_http_client(
    stack: Stack, spawn: Spawn
) -> None:
    """``uvicorn`` serves the app; ``httpx`` posts a message to ``/chat`` and reads the
    server-sent events: the answer's text as it is written, hangs up after three pieces
    (the stream held after four), comes back with ``Last-Event-ID`` and gets the rest, nothing
    twice, then the steps and the end with the reply."""
    import socket

    import httpx

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    stack.model.hold_stream(after=4)
    spawn(pool="prefork", concurrency=1)
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "--factory",
            "--port",
            str(port),
            "durable_agent_examples.orders_app:create_app",
        ],
        env={**os.environ, **settings_env(stack.settings)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_for_http(url, server)
        first: list[tuple[str, str, dict[str, object]]] = []
        with httpx.Client(timeout=60) as client:
            body = {"session_id": "s-chat", "message": stack.message}
            with client.stream("POST", f"{url}/chat", json=body) as response:
                assert response.status_code == 200
                assert response.headers["content-type"].startswith("text/event-stream")
                for event in _events(response):
                    first.append(event)
                    if sum(e[1] == "token" for e in first) == 3:
                        break  # the connection drops
            stack.model.wait_for_held_stream(1, timeout=30)
            turn_id = str(first[0][2]["turn_id"])
            headers = {"Last-Event-ID": first[-1][0]}
            with client.stream("GET", f"{url}/chat/{turn_id}/events", headers=headers) as again:
                assert again.status_code == 200
                events = _events(again)
                rest = [next(events), next(events)]  # the turn's id, then the fourth piece
                assert rest[1][1] == "token", rest  # written before the hold
                stack.model.release()
                rest.extend(events)
            gone = client.get(f"{url}/chat/{turn_id}/events", headers={"Last-Event-ID": "end"})
            assert gone.status_code == 204
            unknown = client.get(f"{url}/chat/turn_nope/events")
            assert unknown.status_code == 404
            bad = client.get(f"{url}/chat/{turn_id}/events", headers={"Last-Event-ID": "x/y"})
            assert bad.status_code == 400
    finally:
        stack.model.release()
        server.terminate()
        server.wait(10)
        if server.stderr is not None:
            server.stderr.close()
    events = first[1:] + rest[1:]  # each connection starts with the turn's id
    report = stack.report(turn_id)
    kinds = [e[1] for e in events]
    assert kinds[:4] == ["step"] * 4 and kinds[-2:] == ["step", "end"], (kinds, report)
    assert set(kinds[4:-2]) == {"token"}, (kinds, report)
    text = "".join(str(e[2]["text"]) for e in events if e[1] == "token")
    assert text == stack.clean_reply, report
    assert events[-1][2]["reply"] == stack.clean_reply
    ids = [e[0] for e in events]
    assert len(ids) == len(set(ids))


def _wait_for_http(url: str, server: subprocess.Popen[str]) -> None:
    import httpx

    from durable_agent.testing.harness import wait_until

    def up() -> bool:
        if server.poll() is not None:
            raise AssertionError(f"uvicorn exited: {server.stderr.read() if server.stderr else ''}")
        try:
            return httpx.get(f"{url}/docs", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(up, 30, "uvicorn to serve the app")


def _events(response: object) -> Iterator[tuple[str, str, dict[str, object]]]:
    """(id, event, data) of each server-sent event of an httpx streamed response."""
    import json

    fields: dict[str, str] = {}
    for line in response.iter_lines():  # type: ignore[attr-defined]
        if line:
            name, _, value = line.partition(": ")
            fields[name] = value
            continue
        if fields:
            yield fields.get("id", ""), fields["event"], json.loads(fields["data"])
            fields = {}


def test_a_payment_marks_the_order_paid_and_wakes_its_checkout_in_one_transaction(
    stack: Stack, spawn: Spawn
) -> None:
    """A checkout order's turn waits for payment_settled. The payment webhook marks the
    order paid and sends the event in one transaction: the turn wakes after the commit and
    emails one receipt; the provider's retry changes nothing, another payment is refused; a
    payment for a checkout that was cancelled is refused and rolls back (the order stays
    unpaid)."""
    from durable_agent_examples.waiting_agents_policy import waits_policy

    stack.model.policy = waits_policy
    agents = "durable_agent_examples.waiting_agents"
    settings = stack.settings.model_copy(update={"agents": agents})
    spawn(settings=settings, pool="prefork", concurrency=1, DURABLE_AGENT_AGENTS=agents)
    with TestClient(create_app(settings)) as desk:
        placed = desk.post("/orders", json={**ORDER, "reference": "C-1", "agent": "checkout"})
        assert placed.status_code == 201, placed.text
        turn_id = placed.json()["turn_id"]
        wait_until(
            lambda: stack.store.get_turn(turn_id).status == "waiting", 20, "the checkout to park"
        )
        assert desk.post("/orders/nope/payments", json={"payment_id": "p7"}).status_code == 404

        paid = desk.post("/orders/C-1/payments", json={"payment_id": "p7"})
        assert (paid.status_code, paid.json()["outcome"]) == (200, "woke"), paid.text
        retried = desk.post("/orders/C-1/payments", json={"payment_id": "p7"})
        assert retried.json()["outcome"] == "duplicate", retried.text

        turn = stack.wait_turn(turn_id, 30)
        report = stack.report(turn_id)
        assert turn.reply == "Payment p7 settled; the receipt went to ada@example.com.", report
        assert stack.subjects() == ["Receipt"], report

        other = desk.post("/orders/C-1/payments", json={"payment_id": "p8"})
        assert other.status_code == 409 and "paid by p7" in other.text
        shown = desk.get("/orders/C-1").json()
        assert (shown["payment_id"], shown["turn_status"]) == ("p7", "done")

        # a checkout cancelled before its payment: the event is refused, the order not paid
        late = desk.post("/orders", json={**ORDER, "reference": "C-2", "agent": "checkout"})
        late_turn = late.json()["turn_id"]
        cancel_turn(late_turn, "customer left", settings=settings)
        wait_until(lambda: stack.store.get_turn(late_turn).status == "cancelled", 20, "the cancel")
        refused = desk.post("/orders/C-2/payments", json={"payment_id": "p9"})
        assert refused.status_code == 409 and "has ended" in refused.text, refused.text
        assert desk.get("/orders/C-2").json()["payment_id"] is None
        assert WaitStore(stack.store.db).events(late_turn) == []
    events = WaitStore(stack.store.db).events(turn_id)
    assert [(e.event_id, e.consumed_step) for e in events] == [("p7", 0)]
