"""Probes for the timeline benchmark: wall-clock intervals of what a process does, by kind.

``install()`` wraps, in this process only, the calls a delivery spends its time in: each
named statement to Postgres (``Database._send``, ``Database.transaction``), each HTTP
request (the model, through ``httpx``), each tool, each Redis command and pipeline (the
broker, the doorbell, the bare task's counter), each Celery message handled by the
consumer, each task body (``task_prerun`` to ``task_postrun``), the start and stop of
``Heartbeat`` (its thread) and each ack. Times are
``time.monotonic_ns()``, one clock for every process of the machine, so the benchmark lays
the application's and the worker's intervals on one line.

A worker is started through this module so that its probes are in place before Celery
loads anything::

    python -m bench.timeline_probe OUT.jsonl ours -- <durable-agent worker arguments>
    python -m bench.timeline_probe OUT.jsonl bare -- <celery worker arguments>

It writes its intervals to ``OUT.jsonl`` when it exits (kept in memory until then, so the
probes cost the same few microseconds on both sides). Nothing here is imported by
durable-agent itself.
"""

from __future__ import annotations

import atexit
import functools
import json
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

Interval = tuple[str, str, str, int, int]  # thread, kind, name, start ns, end ns

intervals: list[Interval] = []
_installed = False


def _record(kind: str, name: str, start: int) -> None:
    intervals.append((threading.current_thread().name, kind, name, start, time.monotonic_ns()))


def _timed(kind: str, name_of: Callable[..., str], fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.monotonic_ns()
        try:
            return fn(*args, **kwargs)
        finally:
            _record(kind, name_of(*args, **kwargs), start)

    return timed


@contextmanager
def interval(kind: str, name: str) -> Iterator[None]:
    """Record the block as one interval (the benchmark's submits)."""
    start = time.monotonic_ns()
    try:
        yield
    finally:
        _record(kind, name, start)


def install() -> None:
    """Put the probes in place (once per process)."""
    global _installed
    if _installed:
        return
    _installed = True
    import httpx
    import kombu.message
    import redis.client
    from celery import signals
    from celery.worker.consumer.consumer import Consumer

    from durable_agent.journal.db import Database
    from durable_agent.step.tools import Tool

    Database._send = _timed("sql", lambda self, q, *a, **k: q.name, Database._send)  # type: ignore[method-assign]
    transaction = Database.transaction

    @contextmanager
    def timed_transaction(self: Database) -> Iterator[Any]:
        start = time.monotonic_ns()
        try:
            with transaction(self) as conn:
                yield conn
        finally:
            _record("sql", "transaction", start)

    Database.transaction = timed_transaction  # type: ignore[method-assign,assignment]
    clients = [httpx.Client]
    try:  # the openai SDK's own fork of httpx, in its recent releases
        import httpx2  # type: ignore[import-not-found,unused-ignore]

        clients.append(httpx2.Client)
    except ImportError:
        pass
    for client in clients:
        client.send = _timed(  # type: ignore[method-assign]
            "http", lambda self, request, *a, **k: request.url.path, client.send
        )
    Tool.invoke = _timed("tool", lambda self, *a, **k: self.name, Tool.invoke)  # type: ignore[method-assign]
    from durable_agent.delivery.heartbeat import Heartbeat

    Heartbeat.__enter__ = _timed("heartbeat", lambda *a: "start", Heartbeat.__enter__)  # type: ignore[method-assign]
    Heartbeat.__exit__ = _timed("heartbeat", lambda *a: "stop", Heartbeat.__exit__)  # type: ignore[method-assign]
    redis.client.Redis.execute_command = _timed(  # type: ignore[method-assign]
        "redis", lambda self, *args, **k: str(args[0]), redis.client.Redis.execute_command
    )
    redis.client.Pipeline.execute = _timed(  # type: ignore[method-assign]
        "redis", lambda self, *a, **k: "pipeline", redis.client.Pipeline.execute
    )
    kombu.message.Message.ack = _timed("ack", lambda *a, **k: "ack", kombu.message.Message.ack)  # type: ignore[method-assign]

    create_handler = Consumer.create_task_handler

    def create_task_handler(self: Consumer, *args: Any, **kwargs: Any) -> Any:
        handler = create_handler(self, *args, **kwargs)
        return _timed("message", lambda message: "message", handler)

    Consumer.create_task_handler = create_task_handler  # type: ignore[method-assign]

    started: dict[str, int] = {}

    @signals.task_prerun.connect(weak=False)
    def prerun(task_id: str, **_: Any) -> None:
        started[task_id] = time.monotonic_ns()

    @signals.task_postrun.connect(weak=False)
    def postrun(task_id: str, task: Any, **_: Any) -> None:
        _record("task", task.name, started.pop(task_id, time.monotonic_ns()))


def dump(path: Path) -> None:
    with path.open("w") as out:
        for thread, kind, name, start, end in intervals:
            out.write(json.dumps([thread, kind, name, start, end]) + "\n")


def main(argv: list[str]) -> None:
    path, side, dashes, *rest = argv
    if dashes != "--" or side not in ("ours", "bare"):
        raise SystemExit("usage: python -m bench.timeline_probe OUT.jsonl ours|bare -- ARGS")
    install()
    from celery import signals

    # written as the shutdown starts (a worker that is then killed for being slow to stop
    # has written them) and again at exit
    signals.worker_shutting_down.connect(lambda **_: dump(Path(path)), weak=False)
    atexit.register(dump, Path(path))
    if side == "ours":
        from durable_agent.cli import main as durable_agent

        raise SystemExit(durable_agent(rest))
    from celery.__main__ import main as celery

    sys.argv = ["celery", *rest]
    celery()


if __name__ == "__main__":
    main(sys.argv[1:])
