"""Used the way a Celery team uses it: ``celery -A durable_agent.tasks worker``, ``.delay()``
from the application, and Flower reading the workers' task events."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest
import redis

from durable_agent import InvalidArgument, start_turn
from durable_agent.delivery.celery_tasks import AGENT_TURN, RUN_TURN
from durable_agent.runtime import Runtime, runtime_for
from durable_agent.settings import Settings
from durable_agent.testing.harness import settings_env, wait_until

if TYPE_CHECKING:
    from conftest import Spawn, Stack


def _celery_worker(
    env: dict[str, str], timeout: float = 60, *extra: str
) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("DURABLE_AGENT_", "OPENAI"))}
    return subprocess.run(
        [
            *(sys.executable, "-m", "celery", "-A", "durable_agent.tasks", "worker"),
            *("--pool", "solo", *extra),
        ],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


@pytest.mark.parametrize(
    ("case", "code", "says"),
    [
        ("tools module missing", 2, "cannot import tools module"),
        ("tools module without tools", 2, "define no @tool"),
        ("database not migrated", 2, "run `durable-agent migrate`"),
        ("Postgres unreachable", 1, "cannot reach Postgres"),
        ("Redis unreachable", 1, "cannot reach the broker at redis://127.0.0.1:1/0"),
        ("a queue of no agent it serves", 2, "consumes queue(s) nobody-serves-this"),
        ("a bad setting", 2, "bad setting DURABLE_AGENT_LEASE_SECONDS"),
    ],
)
def test_celery_worker_does_every_start_check(
    settings: Settings, empty_database_url: str, case: str, code: int, says: str
) -> None:
    """`celery -A durable_agent.tasks worker` refuses to start as `durable-agent worker`
    does: exit non-zero with one error line, no traceback, before it consumes anything."""
    env = {**settings_env(settings), "DURABLE_AGENT_TOOLS": "durable_agent_examples.email_tools"}
    env.update(
        {
            "tools module missing": {"DURABLE_AGENT_TOOLS": "no_such_module_here"},
            "tools module without tools": {"DURABLE_AGENT_TOOLS": "json"},
            "database not migrated": {"DURABLE_AGENT_DATABASE_URL": empty_database_url},
            "Postgres unreachable": {
                "DURABLE_AGENT_DATABASE_URL": "postgresql://root@127.0.0.1:1/nowhere"
            },
            "Redis unreachable": {"DURABLE_AGENT_BROKER_URL": "redis://127.0.0.1:1/0"},
            "a queue of no agent it serves": {},
            "a bad setting": {"DURABLE_AGENT_LEASE_SECONDS": "-3"},
        }[case]
    )
    queues = ["-Q", "nobody-serves-this"] if case == "a queue of no agent it serves" else []
    result = _celery_worker(env, 30, *queues)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == code, result.stderr
    assert "Traceback" not in result.stderr + result.stdout, result.stderr
    assert lines and lines[-1].startswith("error:") and says in lines[-1], result.stderr
    assert "ready." not in result.stdout + result.stderr


def test_run_turn_delay_with_a_message_fails_in_the_caller(
    settings: Settings, redis_client: redis.Redis
) -> None:
    """`run_turn.delay("session-1", "Book a table")` (a message where the turn id belongs)
    raises in the application, saying what to call instead; nothing is sent."""
    run_turn = runtime_for(settings).celery.tasks[RUN_TURN]
    with pytest.raises(InvalidArgument, match=r"agent_turn\.delay\(session_id, message\)"):
        run_turn.delay("session-1", "Book a table")
    assert redis_client.llen(settings.queue) == 0


def test_agent_turn_delay_records_the_turn_once_and_runs_it(stack: Stack, spawn: Spawn) -> None:
    """The application's natural call: agent_turn.delay(session_id, message). The turn is
    recorded before the message is sent (its id is the task id), a duplicate of the message
    changes nothing, and the turn runs once."""
    agent_turn = runtime_for(stack.settings).celery.tasks[AGENT_TURN]
    message_id = str(uuid.uuid4())
    spawn()
    result = agent_turn.apply_async(("s-delay", stack.message), task_id=message_id)
    turn_id = result.id
    assert turn_id == message_id and stack.store.find_turn(turn_id) is not None
    agent_turn.apply_async(("s-delay", stack.message), task_id=message_id)  # a duplicate

    turn = stack.wait_turn(turn_id, 30)

    report = stack.report(turn_id)
    assert turn.status == "done" and turn.reply == stack.clean_reply, report
    assert [t.turn_id for t in stack.store.list_turns("s-delay")] == [turn_id], report
    assert stack.subjects() == [stack.subject], report


@pytest.fixture
def task_events(stack: Stack) -> Iterator[list[dict[str, Any]]]:
    """Every task event the workers send (what Flower shows), collected in a thread."""
    app = Runtime(stack.settings).celery
    seen: list[dict[str, Any]] = []
    stop = threading.Event()

    def collect() -> None:
        with app.connection_for_read() as connection:
            receiver = app.events.Receiver(
                connection, handlers={"*": seen.append}, node_id=f"test-{uuid.uuid4().hex[:6]}"
            )
            for _ in receiver.consume(limit=None, timeout=0.5, wakeup=False):
                if stop.is_set():
                    return

    thread = threading.Thread(target=lambda: _quietly(collect, stop), daemon=True)
    thread.start()
    yield seen
    stop.set()
    thread.join(timeout=5)


def _quietly(run: Any, stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            run()
        except TimeoutError:
            continue
        except OSError:
            continue


def test_task_states_mean_something_in_flower(
    stack: Stack, spawn: Spawn, task_events: list[dict[str, Any]]
) -> None:
    """A failed turn is a FAILURE with the reason; a refused duplicate delivery is a SUCCESS
    whose result says so; a finished turn is a SUCCESS 'done'."""
    settings = stack.settings.model_copy(update={"max_steps": 1})
    spawn(settings=settings)
    failing = start_turn("s-fails", stack.message, settings=settings)
    assert stack.wait_turn(failing, 30).status == "failed"
    runtime_for(settings).celery.tasks[RUN_TURN].delay("s-fails", failing)  # a duplicate

    def outcome(kind: str) -> list[dict[str, Any]]:
        # events are broadcast to every receiver on the broker: keep those of this test's
        # turn (tasks received with its id), not those of tests run alongside
        ours = {
            e.get("uuid")
            for e in task_events
            if e.get("type") == "task-received" and failing in str(e.get("args", ""))
        }
        return [e for e in task_events if e.get("type") == kind and e.get("uuid") in ours]

    wait_until(lambda: outcome("task-failed") and outcome("task-succeeded"), 20, "the events")
    failed = outcome("task-failed")[0]
    assert "TurnFailed" in failed["exception"] and "limit of 1 steps" in failed["exception"]
    succeeded = outcome("task-succeeded")[0]
    assert "refused" in succeeded["result"] and "already failed" in succeeded["result"]


def test_durable_agent_worker_refuses_queues_of_agents_it_does_not_serve(
    settings: Settings,
) -> None:
    """`durable-agent worker --agent default -Q <another queue>` would take turns it must
    hand back to the queue it takes them from: it does not start (one line, exit 2)."""
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("DURABLE_AGENT_")},
        **settings_env(settings),
        "DURABLE_AGENT_TOOLS": "durable_agent_examples.email_tools",
    }
    result = subprocess.run(
        [
            *(sys.executable, "-m", "durable_agent", "worker", "--agent", "default"),
            *("--pool", "solo", "-Q", f"{settings.queue}-billing"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        stdin=subprocess.DEVNULL,
    )
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr + result.stdout, result.stderr
    assert lines[-1].startswith("error: this worker consumes queue(s) " + settings.queue)
    assert f"consume {settings.queue} (-Q)" in lines[-1], lines[-1]


def test_the_start_line_names_the_queue_celery_consumes(stack: Stack, spawn: Spawn) -> None:
    """The line a worker prints as it starts names the queue Celery really consumes, and the
    agent it serves there."""
    worker = spawn()
    expected = f"durable-agent worker: consuming queue {stack.settings.queue!r} for agent 'default'"
    assert expected in worker.log_text(), worker.log_tail()
