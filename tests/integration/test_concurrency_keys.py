"""Concurrency keys on the real Postgres: a new turn of a full key is recorded but not sent,
the end of a turn of its key sends the oldest waiting one, a claim over the limit is refused,
and an agent derives the key from the session."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
import redis

from durable_agent.journal import Leases, worker_identity
from durable_agent.runtime import Runtime
from durable_agent.settings import Settings
from durable_agent.testing.harness import queued_turns

WAITING = "waits for a slot of its concurrency key"


@pytest.fixture
def keyed(settings: Settings) -> Iterator[Runtime]:
    runtime = Runtime(
        settings.model_copy(
            update={
                "concurrency_per_key": 2,
                "tools": "durable_agent_examples.email_tools",
                "agents": "durable_agent_examples.responses_agent",
            }
        )
    )
    yield runtime
    runtime.close()


def key_and_error(runtime: Runtime, turn_id: str) -> tuple[str | None, str | None]:
    with psycopg.connect(runtime.settings.database_url) as conn:
        row = conn.execute(
            "SELECT concurrency_key, error FROM turns WHERE turn_id = %s", (turn_id,)
        ).fetchone()
    assert row is not None
    return row[0], row[1]


def test_a_full_key_records_its_turns_and_sends_them_as_slots_free(
    keyed: Runtime, redis_client: redis.Redis
) -> None:
    ids = [keyed.start_turn(f"s-{i}", "hi", concurrency_key="acme") for i in range(4)]
    other = keyed.start_turn("s-other", "hi", concurrency_key="bolt")
    sent = [t for _, t in queued_turns(redis_client, keyed.settings.queue)]
    assert sorted(sent) == sorted([ids[0], ids[1], other])  # two of acme's, and bolt's
    assert [key_and_error(keyed, t) for t in ids[2:]] == [("acme", WAITING)] * 2

    leases: Leases = keyed.leases
    owner = worker_identity()
    first = leases.claim(ids[0], owner, 30.0)
    second = leases.claim(ids[1], owner, 30.0)
    assert not hasattr(first, "reason") and not hasattr(second, "reason")
    refused = leases.claim(ids[2], owner, 30.0)  # not due yet
    assert getattr(refused, "reason", None) == "deferred"
    # the end of a turn of acme sends the oldest waiting one, and only it
    assert leases.wake_next_of_key(ids[0]) == ("s-2", ids[2], keyed.settings.queue)
    assert key_and_error(keyed, ids[2]) == ("acme", None)
    over = leases.claim(ids[2], owner, 30.0)  # two of acme still hold their claims
    assert getattr(over, "reason", None) == "key_busy", over
    leases.release(ids[0], 1, 0.0, None)  # one of them gives its slot back
    taken = leases.claim(ids[2], owner, 30.0)
    assert not hasattr(taken, "reason"), taken


def test_an_agent_derives_the_key_from_the_session(keyed: Runtime) -> None:
    turn_id = keyed.start_turn("acme:7", "hi", agent="mailer")
    assert key_and_error(keyed, turn_id) == ("acme", None)
    given = keyed.start_turn("acme:8", "hi", agent="mailer", concurrency_key="special")
    assert key_and_error(keyed, given)[0] == "special"
    plain = keyed.start_turn("acme:9", "hi")  # the default agent derives nothing
    assert key_and_error(keyed, plain) == (None, None)
