"""No API key, database password or encryption key reaches a journal row, a log line, a
Celery message (what Flower shows as a task's arguments), whatever the failure: a real
worker process runs turns whose model answers 401, then 500s, with bodies that echo all
three secrets, and one that succeeds; the queue's raw messages are read before the worker
takes them."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable

import psycopg
import pytest
import redis

from durable_agent.journal import new_key
from durable_agent.runtime import Runtime
from durable_agent.settings import Settings
from durable_agent.testing import ScriptedModelServer, email_policy
from durable_agent.testing.harness import wait_until

API_KEY = "sk-proj-Zq81secretKEYvalue0042"
DB_PASSWORD = "pg-pass-7f3e91c2d4"  # the test server trusts this machine: any password works
KEY = new_key()
MESSAGE = "Please email the note launch to ada@example.com"


def _everything_in(pg: psycopg.Connection) -> str:
    tables = [
        row[0]
        for row in pg.execute("SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")
    ]
    return "\n".join(
        str(pg.execute(f"SELECT coalesce(string_agg(t::text, ' '), '') FROM {t} AS t").fetchone())
        for t in tables
    )


@pytest.mark.parametrize("sealed", [False, True], ids=["clear", "sealed"])
def test_no_secret_is_stored_logged_or_sent(
    settings: Settings,
    start_worker: Callable[..., object],
    redis_client: redis.Redis,
    pg: psycopg.Connection,
    sealed: bool,
) -> None:
    secrets = [API_KEY, DB_PASSWORD] + ([KEY] if sealed else [])
    echo = " ".join(
        [f"Incorrect API key provided: {API_KEY}.", f"postgres password {DB_PASSWORD}"]
        + ([f"key {KEY}"] if sealed else [])
    )
    with ScriptedModelServer(email_policy) as model:
        model.fail_message = echo
        url = settings.database_url.replace(
            "postgresql://root@", f"postgresql://root:{DB_PASSWORD}@"
        )
        ours = settings.model_copy(
            update={
                "database_url": url,
                "openai_base_url": model.base_url,
                "openai_api_key": API_KEY,
                "keys": f"k1:{KEY}" if sealed else "",
                "tools": "durable_agent_examples.email_tools",
                "model_max_retries": 0,
                "retry_backoff_max_seconds": 1.0,
            }
        )
        runtime = Runtime(ours)
        try:
            refused = runtime.start_turn("s1", MESSAGE)
            flaky = runtime.start_turn("s2", MESSAGE)
            fine = runtime.start_turn("s3", MESSAGE)
            # what the broker holds, and Flower would show, before any worker takes it
            raw = [m.decode() for m in redis_client.lrange(ours.queue, 0, -1)]
            assert len(raw) == 3
            for message in raw:
                body = base64.b64decode(json.loads(message)["body"]).decode()
                for text in (message, body):
                    assert MESSAGE not in text
                    for secret in secrets:
                        assert secret not in text
                args = json.loads(body)[0]
                assert len(args) == 2  # (session_id, turn_id): nothing else
            model.fail_next(1, 401)  # the first request: the key refused, echoed back
            worker = start_worker(ours, name="secrets")
            wait_until(lambda: runtime.get_turn(refused).finished, 60, "the 401 turn to end")
            model.fail_next(3, 500)  # the second turn's model keeps failing for a while
            wait_until(
                lambda: runtime.get_turn(flaky).finished and runtime.get_turn(fine).finished,
                120,
                "the other turns to end",
            )
            ended = runtime.get_turn(refused)
            assert ended.status == "failed" and "Incorrect API key provided: ***" in str(
                ended.error
            )
            assert runtime.get_turn(fine).reply and runtime.get_turn(flaky).reply
            assert not model._faults  # every injected failure was answered
            log = worker.log_text()  # type: ignore[attr-defined]
        finally:
            runtime.close()
    assert "Incorrect API key provided: ***" in log  # the failure was logged, redacted
    stored = _everything_in(pg)
    for secret in secrets:
        assert secret not in log, secret
        assert secret not in stored, secret
