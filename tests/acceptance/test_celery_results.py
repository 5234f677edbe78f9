"""Following a turn started with ``agent_turn.delay()``, as a Celery user does: the
``AsyncResult`` id is the turn id, the waiters work before any worker has the message, and
with a result backend ``.get()`` returns the reply (or raises ``TurnFailed``), whichever
delivery ended the turn."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest
import redis

from durable_agent import (
    ConfigurationError,
    TurnFailed,
    TurnNotFound,
    get_turn,
    stream_turn,
    wait_for_turn,
)
from durable_agent.delivery.celery_tasks import AGENT_TURN
from durable_agent.runtime import runtime_for
from durable_agent.settings import Settings
from durable_agent.testing.harness import settings_env, wait_until

if TYPE_CHECKING:
    from conftest import Spawn, Stack


@pytest.fixture
def with_results(stack: Stack, redis_client: redis.Redis) -> Iterator[Settings]:
    """The stack's settings with the broker's Redis as the result backend; the results this
    test stored are removed after it."""
    yield stack.settings.model_copy(update={"result_backend": stack.settings.broker_url})
    for key in redis_client.scan_iter("celery-task-meta-*"):
        turn_id = key.decode().removeprefix("celery-task-meta-")
        if stack.store.find_turn(turn_id) is not None:  # a turn of this test's database
            redis_client.delete(key)


def test_the_async_result_leads_to_the_turn_before_any_worker_has_it(
    stack: Stack, spawn: Spawn
) -> None:
    """r.id is the turn id: get_turn, wait_for_turn, stream_turn and `durable-agent wait`
    work on it at once, before a worker exists, and each gets the end once a worker runs
    the turn. An unknown id is still TurnNotFound at once."""
    settings = stack.settings
    r = runtime_for(settings).celery.tasks[AGENT_TURN].delay("s-follow", stack.message)
    assert get_turn(r.id, settings=settings).status == "queued"
    with pytest.raises(ConfigurationError, match=r"wait_for_turn"):  # no result backend
        r.get(timeout=1)

    seen: dict[str, Any] = {}
    waiters = [
        threading.Thread(
            target=lambda: seen.update(waited=wait_for_turn(r.id, 60, settings=settings))
        ),
        threading.Thread(
            target=lambda: seen.update(
                streamed=list(stream_turn(r.id, timeout=60, settings=settings))
            )
        ),
    ]
    for thread in waiters:
        thread.start()
    cli = subprocess.Popen(
        [sys.executable, "-m", "durable_agent", "wait", r.id, "--timeout", "60"],
        env={**os.environ, **settings_env(settings)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        spawn()
        out, err = cli.communicate(timeout=90)
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait()
    for thread in waiters:
        thread.join(timeout=60)

    report = stack.report(r.id)
    assert cli.returncode == 0 and stack.clean_reply in out, (out, err, report)
    assert seen["waited"].status == "done" and seen["waited"].reply == stack.clean_reply, report
    end = seen["streamed"][-1]
    assert end.kind == "end" and end.turn.reply == stack.clean_reply, report
    assert [e.step.step for e in seen["streamed"][:-1]] == [0, 1, 2, 3, 4], report
    with pytest.raises(TurnNotFound):
        get_turn(f"turn_{uuid.uuid4().hex}", settings=settings)


def test_get_returns_the_reply_when_another_worker_finished_the_turn(
    stack: Stack, spawn: Spawn, with_results: Settings
) -> None:
    """The worker that received the agent_turn message is SIGKILLed mid-turn; another
    worker finishes the turn from a message the sweeper sent (another task id). r.get()
    in the application still returns the reply: the end is stored under the turn id."""
    stack.on_first_request(stack.model.hold)  # answer step 0, hold step 2
    first = spawn(settings=with_results)
    r = runtime_for(with_results).celery.tasks[AGENT_TURN].delay("s-get", stack.message)
    stack.model.wait_for_waiting(1, timeout=20)

    first.kill(signal.SIGKILL)
    assert stack.wait_exit(first, 10) == -signal.SIGKILL
    stack.model.release()
    spawn(settings=with_results)

    assert r.get(timeout=60) == stack.clean_reply, stack.report(r.id)
    turn = get_turn(r.id, settings=with_results)
    report = stack.report(r.id)
    assert (turn.status, turn.crashes) == ("done", 1), report
    assert turn.received_message_id != r.id, report  # ended by the sweeper's message
    assert stack.subjects() == [stack.subject], report


def test_get_raises_turn_failed_with_the_reason(
    stack: Stack, spawn: Spawn, with_results: Settings
) -> None:
    """A turn that fails: r.get() raises our TurnFailed, with the reason recorded."""
    settings = with_results.model_copy(update={"max_steps": 1})
    spawn(settings=settings)
    r = runtime_for(settings).celery.tasks[AGENT_TURN].delay("s-get-fails", stack.message)

    with pytest.raises(TurnFailed, match=r"limit of 1 steps"):
        r.get(timeout=60)
    assert get_turn(r.id, settings=settings).status == "failed"


def test_the_worker_checks_the_message_size_as_the_caller_does(stack: Stack, spawn: Spawn) -> None:
    """A message over DURABLE_AGENT_MAX_MESSAGE_BYTES published to agent_turn directly
    (not through .delay(), which refuses it) is refused by the worker too: nothing is
    recorded or run, one line says why, and the worker goes on."""
    worker = spawn()
    too_big = "x" * (stack.settings.max_message_bytes + 1)
    message_id = str(uuid.uuid4())
    runtime_for(stack.settings).celery.send_task(
        AGENT_TURN, args=("s-big", too_big), queue=stack.settings.queue, task_id=message_id
    )

    wait_until(lambda: f"agent_turn {message_id} refused" in worker.log_text(), 20, "the refusal")
    assert stack.store.list_turns("s-big") == [], stack.report()
    assert "Traceback" not in worker.log_text(), stack.logs()
    assert worker.alive()
