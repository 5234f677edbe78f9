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

from durable_agent.journal import TurnStatus
from durable_agent.testing.harness import queued_turns, settings_env

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
