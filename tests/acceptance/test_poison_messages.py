"""The broker is a doorbell: no message on it can take a worker down.

Every shape below made Celery 5.7 log "Unrecoverable error" and exit (the message then
killed the next worker too), reconnect forever, or run a task with arguments it never
declared. A real worker (solo and prefork pools) receives all of them, then a good turn:
each malformed message is logged once, kept on ``<queue>.dead``, the worker stays up and
the good turn runs.
"""

from __future__ import annotations

import base64
import json
import pickle
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest
import redis
from kombu import Connection, Queue

from durable_agent import start_turn
from durable_agent.testing.harness import wait_until

if TYPE_CHECKING:
    from conftest import Spawn, Stack

TASK = "durable_agent.run_turn"
EMBED = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}
DROP = object()


def headers(**changes: Any) -> dict[str, Any]:
    """The headers Celery's protocol 2 sends, with changes (DROP removes one)."""
    task_id = str(uuid.uuid4())
    base: dict[str, Any] = {
        "lang": "py",
        "task": TASK,
        "id": task_id,
        "shadow": None,
        "eta": None,
        "expires": None,
        "group": None,
        "group_index": None,
        "retries": 0,
        "timelimit": [None, None],
        "root_id": task_id,
        "parent_id": None,
        "argsrepr": "(...)",
        "kwargsrepr": "{}",
        "origin": "test@poison",
        "ignore_result": True,
        "stamped_headers": None,
        "stamps": {},
    }
    for name, value in changes.items():
        if value is DROP:
            base.pop(name, None)
        else:
            base[name] = value
    return base


def j(value: Any) -> bytes:
    return json.dumps(value).encode()


GOOD_ARGS = ["session", "turn_nope"]

# name: (body, content type, headers)
MESSAGES: dict[str, tuple[bytes, str, dict[str, Any]]] = {
    "body a mapping": (j({"x": 1}), "application/json", headers()),
    "body a string": (j("a string"), "application/json", headers()),
    "body one list": (j([["one"]]), "application/json", headers()),
    "body empty list": (j([]), "application/json", headers()),
    "body null": (j(None), "application/json", headers()),
    "body a number": (j(42), "application/json", headers()),
    "body four parts": (j([GOOD_ARGS, {}, {}, {}]), "application/json", headers()),
    "body empty": (b"", "application/json", headers()),
    "args wrong types": (j([[1, 2], {}, EMBED]), "application/json", headers()),
    "args three": (j([["a", "b", "c"], {}, EMBED]), "application/json", headers()),
    "args a string": (j(["ab", {}, EMBED]), "application/json", headers()),
    "args a mapping": (j([{"p": 1, "q": 2}, {}, EMBED]), "application/json", headers()),
    "args too long": (j([["s", "t" * 5000], {}, EMBED]), "application/json", headers()),
    "kwargs unknown": (j([GOOD_ARGS, {"bogus": 1}, EMBED]), "application/json", headers()),
    "kwargs a list": (j([GOOD_ARGS, [], EMBED]), "application/json", headers()),
    "embed a list": (j([GOOD_ARGS, {}, [1]]), "application/json", headers()),
    "embed a string": (j([GOOD_ARGS, {}, "x"]), "application/json", headers()),
    "embed overrides id": (j([GOOD_ARGS, {}, {"id": [1]}]), "application/json", headers()),
    "embed chain garbage": (
        j([GOOD_ARGS, {}, {**EMBED, "chain": "garbage"}]),
        "application/json",
        headers(),
    ),
    "not JSON": (b"{not json", "application/json", headers()),
    "not UTF-8": (b'\xff\xfe[["a","b"],{},{}]', "application/json", headers()),
    "pickle": (
        pickle.dumps(((GOOD_ARGS), {}, EMBED)),
        "application/x-python-serialize",
        headers(),
    ),
    "text/plain": (j([GOOD_ARGS, {}, EMBED]), "text/plain", headers()),
    "no id header": (j([GOOD_ARGS, {}, EMBED]), "application/json", headers(id=DROP)),
    "task header a list": (j([GOOD_ARGS, {}, EMBED]), "application/json", headers(task=[TASK])),
    "timelimit a word": (
        j([GOOD_ARGS, {}, EMBED]),
        "application/json",
        headers(timelimit="abc"),
    ),
    "timelimit words": (
        j([GOOD_ARGS, {}, EMBED]),
        "application/json",
        headers(timelimit=["a", "b"]),
    ),
    "stamped_headers garbage": (
        j([GOOD_ARGS, {}, EMBED]),
        "application/json",
        headers(stamped_headers=5),
    ),
    "eta garbage": (j([GOOD_ARGS, {}, EMBED]), "application/json", headers(eta="soon")),
    "eta in 9999": (
        j([GOOD_ARGS, {}, EMBED]),
        "application/json",
        headers(eta="9999-01-01T00:00:00+00:00"),
    ),
    "retries a word": (j([GOOD_ARGS, {}, EMBED]), "application/json", headers(retries="x")),
    "unknown task": (j([GOOD_ARGS, {}, EMBED]), "application/json", headers(task="nope.task")),
    "protocol 1": (
        j({"task": TASK, "id": "x", "args": GOOD_ARGS, "kwargs": {}}),
        "application/json",
        headers(task=DROP, id=DROP),
    ),
}

# raw Redis list items that are no kombu envelope at all
ENVELOPES = {
    "envelope not JSON": "this is not json",
    "envelope a list": json.dumps([1, 2, 3]),
    "envelope without properties": json.dumps({"body": "e30=", "headers": {}}),
}


def publish(broker_url: str, queue: str) -> None:
    with Connection(broker_url) as connection:
        producer = connection.Producer()
        target = Queue(queue, routing_key=queue)
        for body, content_type, message_headers in MESSAGES.values():
            producer.publish(
                body,
                exchange="",
                routing_key=queue,
                declare=[target],
                content_type=content_type,
                content_encoding="binary" if content_type.endswith("serialize") else "utf-8",
                headers=message_headers,
            )
    client = redis.Redis.from_url(broker_url)
    try:
        for raw in ENVELOPES.values():
            client.lpush(queue, raw)
    finally:
        client.close()


@pytest.mark.parametrize("pool", ["solo", "prefork"])
def test_no_malformed_message_stops_the_worker(
    stack: Stack, spawn: Spawn, redis_client: redis.Redis, pool: str
) -> None:
    queue = stack.settings.queue
    worker = spawn(pool=pool, concurrency=2)
    publish(stack.settings.broker_url, queue)
    turn_id = start_turn(f"s-{uuid.uuid4().hex[:8]}", stack.message, settings=stack.settings)

    turn = stack.wait_turn(turn_id, timeout=60)

    assert turn.status == "done", stack.report(turn_id)
    expected = len(MESSAGES) + len(ENVELOPES)
    dead = redis_client.lrange(queue + ".dead", 0, -1)
    count: Callable[[], int] = lambda: worker.log_text().count(" dropped")  # noqa: E731
    wait_until(lambda: count() >= expected, 20, f"{expected} dropped messages")
    log = worker.log_text()
    assert worker.alive(), stack.logs()
    assert count() == expected, log
    assert len(dead) == expected
    assert "Unrecoverable error" not in log and "Traceback" not in log, log
    # a dead letter is the message as it came, with the reason
    letters = [json.loads(raw) for raw in dead]
    reasons = [
        letter.get("headers", {}).get("x-death-reason") or letter.get("x-death-reason")
        for letter in letters
    ]
    assert all(reasons), letters
    unknown = next(
        letter for letter in letters if letter.get("headers", {}).get("task") == "nope.task"
    )
    body = base64.b64decode(unknown["body"])
    assert json.loads(body) == [GOOD_ARGS, {}, EMBED]
