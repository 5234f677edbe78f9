"""The service's commands: ``migrate``, ``worker``, ``health`` and ``sweep`` (registered on
the ``durable-agent`` parser by ``cli/__init__.py``).

``worker`` and ``migrate`` import neither the evals, the test servers nor the terminal
tables: a worker's image needs none of them.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any

from ..errors import ServiceUnavailable
from ..runtime import Runtime
from .arguments import agent_names, seconds
from .exits import EXIT_FAILED, error_line

Command = Callable[[Runtime, argparse.Namespace], int]
Add = Callable[[str, Command, str], argparse.ArgumentParser]


def cmd_migrate(runtime: Runtime, args: argparse.Namespace) -> int:
    from ..journal import current_version, latest_version, migrate

    applied = migrate(runtime.database)
    for migration in applied:
        print(f"applied {migration.name}")
    print(f"schema at version {current_version(runtime.database)} (latest {latest_version()})")
    return 0


def cmd_worker(runtime: Runtime, args: argparse.Namespace) -> int:
    from celery import signals

    if args.agent:
        served = ",".join(dict.fromkeys(name for group in args.agent for name in group))
        runtime = Runtime(runtime.settings.model_copy(update={"serve_agents": served}))
    runtime.check_worker_start()
    # the queues Celery consumes (ours, or -Q among the Celery arguments) are checked against
    # the agents served, and named, as the worker starts (delivery.celery_app)
    argv = worker_argv(runtime.queues, args.loglevel, args.celery_args)
    # worker_main() drops the worker's exit code; a worker that stops on an unrecoverable
    # error must exit non-zero, so that a supervisor restarts it.
    exit_codes: list[int] = []

    def remember_exit_code(sender: Any = None, **_: Any) -> None:
        exit_codes.append(int(getattr(sender, "exitcode", None) or 0))

    signals.worker_shutdown.connect(remember_exit_code, weak=False)
    runtime.celery.worker_main(argv)
    return exit_codes[-1] if exit_codes else 0


def worker_argv(queues: list[str], loglevel: str, extra: list[str]) -> list[str]:
    """The Celery worker's command line: our queues, and a node name of its own unless one is
    given, so that several workers on one host are told apart in Flower and ``celery
    inspect`` (Celery's default is celery@<host> for all of them)."""
    argv = ["worker", "--queues", ",".join(queues), "--loglevel", loglevel, *extra]
    named = any(
        arg in ("-n", "--hostname") or arg.startswith(("-n", "--hostname=")) for arg in argv
    )
    if not named:
        argv += ["--hostname", f"{queues[0]}-{os.getpid()}@%h"]
    return argv


def cmd_health(runtime: Runtime, args: argparse.Namespace) -> int:
    """Exit 0 when this deployment can run turns: Postgres reachable and migrated, the
    broker reachable, and (``--worker``) a worker on this host answering a ping, which its
    consumer does only while it takes messages."""
    import socket

    from kombu.utils.url import maybe_sanitize_url

    runtime.require_schema()
    app = runtime.celery
    try:
        with app.connection_for_write() as connection:
            connection.ensure_connection(max_retries=1, timeout=args.timeout)
    except Exception as error:
        raise ServiceUnavailable(
            f"cannot reach the broker at {maybe_sanitize_url(runtime.settings.broker_url)}: {error}"
        ) from error
    if not args.worker:
        print("ok: Postgres and the broker answer")
        return 0
    host = socket.gethostname()
    replies = app.control.ping(timeout=args.timeout) or []
    mine = sorted(node for reply in replies for node in reply if node.endswith(f"@{host}"))
    if not mine:
        error_line(f"error: no worker on {host} answered a ping within {args.timeout:g}s")
        return EXIT_FAILED
    print(f"ok: {', '.join(mine)} takes turns")
    return 0


def cmd_sweep(runtime: Runtime, args: argparse.Namespace) -> int:
    runtime.require_schema()
    sent = runtime.sweeper().sweep_once()
    for _, turn_id, why in sent:
        print(f"enqueued {turn_id} ({why})")
    print(f"{len(sent)} turn(s) enqueued")
    return 0


def register(add: Add) -> None:
    """Add the service's commands to the ``durable-agent`` parser."""
    add("migrate", cmd_migrate, "create or upgrade the tables (safe to run concurrently)")

    worker = add("worker", cmd_worker, "run a Celery worker for turns (extra args go to Celery)")
    worker.add_argument("--loglevel", default="INFO", help="Celery's log level")
    worker.add_argument(
        "--agent",
        action="append",
        type=agent_names,
        default=[],
        metavar="NAME",
        help="serve this agent (repeatable, or comma-separated; default: every agent defined); "
        "a worker serves every agent of the queues it consumes",
    )

    add("sweep", cmd_sweep, "one sweeper pass: enqueue turns whose message was lost")

    health = add("health", cmd_health, "exit 0 if Postgres, the broker (and a worker) answer")
    health.add_argument(
        "--worker", action="store_true", help="also: a worker on this host answers a ping"
    )
    health.add_argument("--timeout", type=seconds, default=3.0, help="seconds (default 3)")
