"""The ``durable-agent`` command line.

Errors a user can cause (an unreachable database, an unknown turn id, a bad tools module)
print one line and exit non-zero; a traceback means a bug in durable-agent.

Exit codes: 0 success; 1 the command failed (e.g. a failed turn, an unreachable service);
2 a usage or configuration error; 3 ``wait`` or ``watch`` timed out; 4 no turn has that id; 130
interrupted. ``worker`` exits with the Celery worker's own code.

The commands import only what they need: ``worker`` and ``migrate`` never load the evals,
the test servers or the terminal tables. ``eval ...`` and ``demo`` are handed to
:mod:`durable_agent.evals.commands`, which comes with the ``evals`` extra.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from ..errors import (
    ConfigurationError,
    DurableAgentError,
    InvalidArgument,
    ServiceUnavailable,
    TurnNotFound,
)
from ..inputs import check_id, check_message
from ..operate.spend import GROUPINGS
from ..redact import escape_log_lines, printable
from ..runtime import Runtime
from ..settings import load_settings
from ..usage import OneLineParser
from .arguments import since_on_clock, since_time, whole_number

EXIT_FAILED, EXIT_USAGE, EXIT_TIMEOUT, EXIT_NOT_FOUND = 1, 2, 3, 4


def error_line(text: str) -> None:
    """One line on stderr, however long, with control characters escaped."""
    print(printable(" ".join(text.split())), file=sys.stderr, flush=True)


def cmd_migrate(runtime: Runtime, args: argparse.Namespace) -> int:
    from ..journal.migrations import current_version, latest_version, migrate

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


def cmd_submit(runtime: Runtime, args: argparse.Namespace) -> int:
    check_id("session_id", args.session)
    check_message(args.message, runtime.settings.max_message_bytes)
    if args.turn_id is not None:
        check_id("turn_id", args.turn_id)
    runtime.require_schema()
    print(runtime.start_turn(args.session, args.message, turn_id=args.turn_id, agent=args.agent))
    return 0


def cmd_wait(runtime: Runtime, args: argparse.Namespace) -> int:
    check_id("turn_id", args.turn_id)
    runtime.require_schema()
    try:
        turn = runtime.wait_for_turn(args.turn_id, args.timeout)
    except TimeoutError as error:
        error_line(f"error: {error}")
        return EXIT_TIMEOUT
    if turn.status == "done":
        print(printable(turn.reply or ""))
        return 0
    if turn.status == "cancelled":
        error_line(f"error: turn {turn.turn_id} was {turn.error}")
        return EXIT_FAILED
    error_line(f"error: turn {turn.turn_id} failed: {turn.error}")
    return EXIT_FAILED


def cmd_watch(runtime: Runtime, args: argparse.Namespace) -> int:
    """Print each finished step of the turn as it is recorded, then its end."""
    check_id("turn_id", args.turn_id)
    runtime.require_schema()
    events = runtime.stream_turn(args.turn_id, after_step=args.after_step, timeout=args.timeout)
    try:
        for event in events:
            if args.json:
                print(json.dumps(event.as_json(), ensure_ascii=False), flush=True)
            elif event.step is not None:
                s = event.step
                call = f"{s.kind} {s.name}" + (f" ({s.replay})" if s.kind == "tool" else "")
                print(printable(f"step {s.step}  {call}: {s.summary(100)}"), flush=True)
            if event.turn is not None:
                turn = event.turn
                if not args.json:
                    text = turn.reply if turn.status == "done" else turn.error
                    print(printable(f"{turn.status}: {text or ''}"), flush=True)
                return 0 if turn.status == "done" else EXIT_FAILED
    except TimeoutError as error:
        error_line(f"error: {error}")
        return EXIT_TIMEOUT
    return EXIT_FAILED  # the stream ends only with the turn's end


def cmd_journal(runtime: Runtime, args: argparse.Namespace) -> int:
    check_id("turn_id", args.turn_id)
    runtime.require_schema()
    turn = runtime.get_turn(args.turn_id)  # an unknown id is an error, not an empty journal
    steps = runtime.journal.load_journal(args.turn_id)
    if args.json:
        print(json.dumps([s.as_json() for s in steps], indent=2, ensure_ascii=False))
    else:
        from .console import out
        from .tables import agent_line, journal_table

        out.print(journal_table(steps, title=f"journal of {args.turn_id}"))
        out.print(agent_line(turn), markup=False, highlight=False)
    return 0


def cmd_turns(runtime: Runtime, args: argparse.Namespace) -> int:
    if args.session is not None:
        check_id("session_id", args.session)
    runtime.require_schema()
    turns = runtime.list_turns(args.session, limit=args.limit)
    if args.json:
        print(json.dumps([t.as_json() for t in turns], indent=2, ensure_ascii=False))
    else:
        from .console import out
        from .tables import turns_table

        out.print(turns_table(turns))
    return 0


def cmd_spend(runtime: Runtime, args: argparse.Namespace) -> int:
    since = since_time(args.since) if args.since is not None else None
    runtime.require_schema()
    spends = runtime.spend(args.by, limit=args.limit, since=since_on_clock(since, runtime))
    if args.json:
        key = "turn_id" if args.by == "turn" else args.by
        rows = [{key: s.key, **s.as_json()} for s in spends]
        print(json.dumps(rows, indent=2, ensure_ascii=False))
    else:
        from .console import out
        from .tables import spend_table

        out.print(spend_table(spends, args.by, priced=bool(runtime.settings.prices)))
    return 0


def cmd_replay(runtime: Runtime, args: argparse.Namespace) -> int:
    from ..operate.replay import replay_turn

    check_id("turn_id", args.turn_id)
    runtime.require_schema()
    report = replay_turn(runtime, args.turn_id)
    print(
        json.dumps(report.to_json(), indent=2, ensure_ascii=False)
        if args.json
        else report.describe()
    )
    return 0 if report.ok else EXIT_FAILED


def cmd_evals(runtime: Runtime, args: argparse.Namespace) -> int:
    try:
        from ..evals.commands import main as evals_main
    except ImportError as error:
        raise ConfigurationError(
            f"the evals need the 'evals' extra: pip install 'durable-agent[evals]' ({error})"
        ) from error
    return evals_main(runtime.settings, args.eval_argv)


_HANDED_ON = ("eval", "demo")  # their arguments are parsed by durable_agent.evals.commands
_TEST_KIT = "model-server"  # handed to python -m durable_agent.testing (no settings needed)

EPILOG = """\
exit codes: 0 success; 1 the command failed (a failed turn, an unreachable service, a
refused cancel); 2 a usage or configuration error; 3 wait or watch timed out; 4 no turn
has that id (wait, watch, journal, cancel, ...); 130 interrupted. worker exits with the
Celery worker's own code.

the test kit (extra 'testing'): durable-agent model-server --policy email [--port P] runs
the scripted OpenAI-compatible model server (GET /_stats, POST /_reset, /_fail, /_delay,
/_hold, /_release); python -m durable_agent.testing inbox | payments run the SMTP test
inbox and the payments sandbox. The docs' "Testing your agents" page documents them and
the pytest fixtures."""


def cmd_model_server(runtime: Runtime | None, args: argparse.Namespace) -> int:
    """The test kit's model server; it needs no settings, so main() calls it before any
    are read (its own arguments are in ``args.test_kit_argv``)."""
    return run_model_server(getattr(args, "test_kit_argv", [_TEST_KIT]))


Command = Callable[[Runtime, argparse.Namespace], int]


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 <= value <= 86_400:  # NaN fails too
        raise argparse.ArgumentTypeError(f"must be 0 to 86400 seconds, got {text!r}")
    return value


_count = whole_number(1, 10_000)


def _names(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"wants agent names, got {text!r}")
    return names


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="durable-agent",
        description="Crash-safe AI agent turns: a durable step journal in Postgres, run by Celery.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, func: Command, help: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help, description=help)
        sub.set_defaults(func=func)
        return sub

    add("migrate", cmd_migrate, "create or upgrade the tables (safe to run concurrently)")

    worker = add("worker", cmd_worker, "run a Celery worker for turns (extra args go to Celery)")
    worker.add_argument("--loglevel", default="INFO", help="Celery's log level")
    worker.add_argument(
        "--agent",
        action="append",
        type=_names,
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
    health.add_argument("--timeout", type=_seconds, default=3.0, help="seconds (default 3)")

    submit = add("submit", cmd_submit, "record a turn and enqueue it; prints the turn id")
    submit.add_argument("--session", required=True, help="the conversation this turn belongs to")
    submit.add_argument("--turn-id", default=None, help="your own id, to make retries idempotent")
    submit.add_argument("--agent", default=None, help="the agent to run it (default: 'default')")
    submit.add_argument("message", help="the user's message")

    wait = add(
        "wait",
        cmd_wait,
        "wait for a turn; print its reply (exit 0 done, 1 failed or cancelled, 3 timed out, "
        "4 no turn has that id)",
    )
    wait.add_argument("turn_id", help="the turn's id (submit prints it)")
    wait.add_argument("--timeout", type=_seconds, default=60.0, help="seconds (default 60)")

    watch = add(
        "watch",
        cmd_watch,
        "print a turn's steps live as they are recorded, then its end (exit 0 done, 1 failed "
        "or cancelled, 3 timed out, 4 no turn has that id)",
    )
    watch.add_argument("turn_id", help="the turn's id (submit prints it)")
    watch.add_argument(
        "--after-step",
        type=int,
        default=-1,
        metavar="N",
        help="start after step N (the last one you saw); default: from the start",
    )
    watch.add_argument(
        "--timeout", type=_seconds, default=None, help="give up after S seconds (default: never)"
    )
    watch.add_argument("--json", action="store_true", help="one JSON object per line")

    journal = add("journal", cmd_journal, "show a turn's journal")
    journal.add_argument("turn_id", help="the turn's id (submit prints it)")
    journal.add_argument("--json", action="store_true", help="a JSON array of steps")

    turns = add("turns", cmd_turns, "list turns, newest first (or one session in order)")
    turns.add_argument("--session", default=None, help="one session's turns, in order")
    turns.add_argument("--limit", type=_count, default=50, help="at most this many (1-10000)")
    turns.add_argument("--json", action="store_true", help="a JSON array of turns")

    spend = add(
        "spend", cmd_spend, "model calls and tokens, what crashes wasted, what the journal saved"
    )
    spend.add_argument("--by", choices=GROUPINGS, default="turn", help="group per (default turn)")
    spend.add_argument("--limit", type=_count, default=50, help="at most this many rows")
    spend.add_argument("--since", default=None, help="turns created since an age (7d) or time")
    spend.add_argument("--json", action="store_true", help="a JSON array of rows")

    replay = add("replay", cmd_replay, "replay a done turn with the model switched off")
    replay.add_argument("turn_id", help="the turn's id (submit prints it)")
    replay.add_argument("--json", action="store_true", help="print the report as JSON")

    from ..web.serve import add_arguments as console_arguments
    from ..web.serve import cmd_console

    console = add(
        "console", cmd_console, "serve the web console (extra 'console'; a login is required)"
    )
    console_arguments(console, whole_number(1, 65_535, "a port"))

    from .operator import register as add_operator_commands

    add_operator_commands(add)  # cancel, prune, uncertain, resolve, approvals, approve, deny
    add("eval", cmd_evals, "the evals of the pattern: crash-matrix, heed-note, two-workers, replay")
    add("demo", cmd_evals, "run a turn, kill its worker mid-way, watch another worker finish it")
    add(
        _TEST_KIT,
        cmd_model_server,
        "the test kit's scripted OpenAI-compatible model server (--policy NAME or "
        "module:function; --help for its options)",
    )
    return parser


def run_model_server(argv: list[str]) -> int:
    """``durable-agent model-server ...`` is ``python -m durable_agent.testing model-server``."""
    try:
        from ..testing.__main__ import main as test_kit_main
    except ImportError as error:
        error_line(
            f"error: the model server needs the 'testing' extra: "
            f"pip install 'durable-agent[testing]' ({error})"
        )
        return EXIT_USAGE
    return test_kit_main(argv)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    command_at = next((i for i, arg in enumerate(argv) if not arg.startswith("-")), len(argv))
    if command_at < len(argv) and argv[command_at] == _TEST_KIT:
        args = parser.parse_args(argv[: command_at + 1])  # -v and the like, checked
        args.test_kit_argv = argv[command_at:]
        return cmd_model_server(None, args)
    if command_at < len(argv) and argv[command_at] in _HANDED_ON:
        args = parser.parse_args(argv[: command_at + 1])
        args.eval_argv = argv[command_at:]
        extra: list[str] = []
    else:
        args, extra = parser.parse_known_args(argv)
    if extra and args.command != "worker":
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.celery_args = extra
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    escape_log_lines(logging.getLogger().handlers)
    runtime: Runtime | None = None
    try:
        runtime = Runtime(load_settings())
        code: int = args.func(runtime, args)
        return code
    except TurnNotFound as error:
        error_line(f"error: {error}")
        return EXIT_NOT_FOUND
    except (ConfigurationError, InvalidArgument) as error:
        error_line(f"error: {error}")
        return EXIT_USAGE
    except DurableAgentError as error:
        error_line(f"error: {error}")
        return EXIT_FAILED
    except KeyboardInterrupt:
        return 130
    finally:
        if runtime is not None:
            runtime.close()


if __name__ == "__main__":
    sys.exit(main())
