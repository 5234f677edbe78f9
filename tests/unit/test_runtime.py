"""The Runtime: one per settings, its own Celery app and tasks, nothing shared across a fork."""

from __future__ import annotations

import os
import threading

from durable_agent.runtime import Runtime, runtime_for
from durable_agent.settings import Settings

RUN_TURN = "durable_agent.run_turn"


def test_each_runtime_registers_its_tasks_on_its_own_app() -> None:
    """Two runtimes in one process: each run_turn belongs to its own app (a Celery shared
    task would hand the first runtime's task to every later app)."""
    first, second = Runtime(Settings(queue="first")), Runtime(Settings(queue="second"))

    first_task, second_task = first.celery.tasks[RUN_TURN], second.celery.tasks[RUN_TURN]

    assert first_task is not second_task
    assert first_task.app is first.celery and second_task.app is second.celery
    assert first.celery.conf.task_default_queue == "first"
    assert second.celery.conf.task_default_queue == "second"


def test_equal_settings_share_one_runtime() -> None:
    """start_turn(settings=...) and the app of `celery -A durable_agent.tasks` meet here."""
    import durable_agent.tasks

    assert runtime_for(Settings(queue="q1")) is runtime_for(Settings(queue="q1"))
    assert runtime_for(Settings(queue="q1")) is not runtime_for(Settings(queue="q2"))
    assert durable_agent.tasks.runtime is runtime_for(None)
    assert durable_agent.tasks.run_turn.app is runtime_for(None).celery


def test_a_forked_child_never_waits_on_a_lock_another_thread_held() -> None:
    """A prefork pool forks its children while the sweeper thread may hold the database's
    lock; the child must start with its own lock and no connection."""
    runtime = Runtime(Settings(database_url="postgresql://nobody@127.0.0.1:1/none"))
    database = runtime.database
    held, release = threading.Event(), threading.Event()

    def hold_the_lock() -> None:
        with database._lock:
            held.set()
            release.wait(10)

    holder = threading.Thread(target=hold_the_lock)
    holder.start()
    assert held.wait(10)
    try:
        pid = os.fork()
        if pid == 0:  # the child: exit 0 only if the lock is free and nothing is inherited
            got = runtime.database._lock.acquire(timeout=2)
            os._exit(0 if got and database._conn is None and "model" not in runtime._parts else 1)
        _, status = os.waitpid(pid, 0)
    finally:
        release.set()
        holder.join()
    assert os.waitstatus_to_exitcode(status) == 0
