"""The ``durable-agent`` command line.

Errors a user can cause (an unreachable database, an unknown turn id, a bad tools module)
print one line and exit non-zero; a traceback means a bug in durable-agent.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable, Sequence
from typing import Any

import pydantic
from rich.table import Table
from rich.text import Text

from .console import err, out
from .errors import DurableAgentError, TurnNotFound
from .journal import Database, JournalStore, Step, Turn, database_for, migrate, require_current
from .journal.migrations import current_version, latest_version
from .settings import Settings


def _error_line(text: str) -> None:
    """One line on stderr: never wrapped at the console width, never read as rich markup."""
    err.print(text, markup=False, soft_wrap=True)


def _db(settings: Settings, *, migrated: bool = True) -> Database:
    db = database_for(settings.database_url)
    if migrated:
        require_current(db)
    return db


def cmd_migrate(settings: Settings, args: argparse.Namespace) -> int:
    db = _db(settings, migrated=False)
    applied = migrate(db)
    for migration in applied:
        out.print(f"applied {migration.name}")
    out.print(f"schema at version {current_version(db)} (latest {latest_version()})")
    return 0


def cmd_worker(settings: Settings, args: argparse.Namespace) -> int:
    from celery import signals

    _db(settings)
    from .tasks import app, turn_worker

    tools = turn_worker().tools  # the tools module and the model settings, checked up front
    if not settings.tool_modules:
        err.print("warning: DURABLE_AGENT_TOOLS is empty; the model gets no tools")

    labels = ", ".join(f"{t.name} ({t.replay})" for t in tools) or "none"
    err.print(f"durable-agent worker: queue {settings.queue!r}, tools: {labels}")
    argv = ["worker", "--queues", settings.queue, "--loglevel", args.loglevel, *args.celery_args]
    # worker_main() drops the worker's exit code; a worker that stops on an unrecoverable
    # error must exit non-zero, so that a supervisor restarts it.
    exit_codes: list[int] = []

    def remember_exit_code(sender: Any = None, **_: Any) -> None:
        exit_codes.append(int(getattr(sender, "exitcode", None) or 0))

    signals.worker_shutdown.connect(remember_exit_code, weak=False)
    app.worker_main(argv)
    return exit_codes[-1] if exit_codes else 0


def cmd_sweep(settings: Settings, args: argparse.Namespace) -> int:
    from .sweeper import Sweeper

    sent = Sweeper(settings, _db(settings)).sweep_once()
    for _, turn_id, why in sent:
        out.print(f"enqueued {turn_id} ({why})")
    out.print(f"{len(sent)} turn(s) enqueued")
    return 0


def cmd_submit(settings: Settings, args: argparse.Namespace) -> int:
    from .client import start_turn

    _db(settings)
    turn_id = start_turn(args.session, args.message, turn_id=args.turn_id, settings=settings)
    out.print(turn_id)
    return 0


def cmd_wait(settings: Settings, args: argparse.Namespace) -> int:
    from .client import wait_for_turn

    _db(settings)
    try:
        turn = wait_for_turn(args.turn_id, args.timeout, settings=settings)
    except TimeoutError as error:
        _error_line(f"error: {error}")
        return 3
    if turn.status == "done":
        out.print(turn.reply or "", markup=False)
        return 0
    _error_line(f"error: turn {turn.turn_id} failed: {turn.error}")
    return 1


def cmd_journal(settings: Settings, args: argparse.Namespace) -> int:
    store = JournalStore(_db(settings))
    store.get_turn(args.turn_id)  # an unknown id is an error, not an empty journal
    steps = store.load_journal(args.turn_id)
    if args.json:
        print(json.dumps([s.as_json() for s in steps], indent=2, ensure_ascii=False))
    else:
        out.print(journal_table(steps, title=f"journal of {args.turn_id}"))
    return 0


def cmd_turns(settings: Settings, args: argparse.Namespace) -> int:
    store = JournalStore(_db(settings))
    turns = store.list_turns(args.session, limit=args.limit)
    if args.json:
        print(json.dumps([turn_json(t) for t in turns], indent=2, ensure_ascii=False))
    else:
        out.print(turns_table(turns))
    return 0


def turn_json(t: Turn) -> dict[str, Any]:
    return {
        "turn_id": t.turn_id,
        "session_id": t.session_id,
        "seq": t.seq,
        "status": t.status,
        "message": t.message,
        "reply": t.reply,
        "error": t.error,
        "attempts": t.attempts,
        "crashes": t.crashes,
        "lease_epoch": t.lease_epoch,
        "created_at": t.created_at.isoformat(),
        "finished_at": t.finished_at.isoformat() if t.finished_at else None,
    }


def journal_table(steps: Sequence[Step], title: str = "journal") -> Table:
    table = Table(title=title, title_justify="left")
    for column in ("step", "kind", "name", "replay", "status", "epoch", "outcome"):
        table.add_column(column, overflow="fold")
    for s in steps:
        cells = (str(s.step), s.kind, s.name, s.replay or "-", s.status, str(s.epoch), s.summary())
        table.add_row(*(Text(cell) for cell in cells))  # recorded text is never rich markup
    return table


def turns_table(turns: Sequence[Turn]) -> Table:
    table = Table(title="turns", title_justify="left")
    for column in ("turn", "session", "#", "status", "attempts", "crashes", "reply / error"):
        table.add_column(column, overflow="fold")
    for t in turns:
        text = t.reply if t.status == "done" else (t.error or "")
        text = " ".join((text or "").split())
        cells = (
            t.turn_id,
            t.session_id,
            str(t.seq),
            t.status,
            str(t.attempts),
            str(t.crashes),
            text[:80],
        )
        table.add_row(*(Text(cell) for cell in cells))
    return table


Command = Callable[[Settings, argparse.Namespace], int]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="durable-agent",
        description="Crash-safe AI agent turns: a durable step journal in Postgres, run by Celery.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, func: Command, help: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help, description=help)
        sub.set_defaults(func=func)
        return sub

    add("migrate", cmd_migrate, "create or upgrade the tables (safe to run concurrently)")

    worker = add("worker", cmd_worker, "run a Celery worker for turns (extra args go to Celery)")
    worker.add_argument("--loglevel", default="INFO")

    add("sweep", cmd_sweep, "one sweeper pass: enqueue turns whose message was lost")

    submit = add("submit", cmd_submit, "record a turn and enqueue it; prints the turn id")
    submit.add_argument("--session", required=True, help="the conversation this turn belongs to")
    submit.add_argument("--turn-id", default=None, help="your own id, to make retries idempotent")
    submit.add_argument("message", help="the user's message")

    wait = add("wait", cmd_wait, "wait for a turn; print its reply (exit 0 only when done)")
    wait.add_argument("turn_id")
    wait.add_argument("--timeout", type=float, default=60.0, help="seconds (default 60)")

    journal = add("journal", cmd_journal, "show a turn's journal")
    journal.add_argument("turn_id")
    journal.add_argument("--json", action="store_true", help="a JSON array of steps")

    turns = add("turns", cmd_turns, "list turns, newest first (or one session in order)")
    turns.add_argument("--session", default=None)
    turns.add_argument("--limit", type=int, default=50)
    turns.add_argument("--json", action="store_true")

    from .evals.commands import register

    register(commands, add)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and args.command != "worker":
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.celery_args = extra
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        settings = Settings()
        code: int = args.func(settings, args)
        return code
    except pydantic.ValidationError as error:
        first = error.errors()[0]
        field = ".".join(str(p) for p in first["loc"])
        _error_line(f"error: bad setting DURABLE_AGENT_{field.upper()}: {first['msg']}")
        return 2
    except TurnNotFound as error:
        _error_line(f"error: {error}")
        return 4
    except DurableAgentError as error:
        _error_line(f"error: {error}")
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
