"""The ``durable-agent`` command line: :func:`main` and :func:`build_parser`, and the
commands by group: ``service`` (migrate, worker, health, sweep), ``turns`` (submit, wait,
watch, journal, turns, spend, replay), ``operator`` (cancel, prune, uncertain, resolve,
approvals, approve, deny), ``events`` (send-event, events). ``arguments`` holds the
argument types, ``exits`` the exit codes, ``console`` and ``tables`` the terminal output
(rich, imported only by the commands that print tables).

Errors a user can cause (an unreachable database, an unknown turn id, a bad tools module)
print one line and exit non-zero; a traceback means a bug in durable-agent.

The commands import only what they need: ``worker`` and ``migrate`` never load the evals,
the test servers or the terminal tables. ``eval ...`` and ``demo`` are handed to
:mod:`durable_agent.evals.commands`, which comes with the ``evals`` extra; ``eval replay``
is the ``replay`` command under its older name.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence

from ..errors import ConfigurationError, DurableAgentError, InvalidArgument, TurnNotFound
from ..journal import set_interface
from ..redact import escape_log_lines
from ..runtime import Runtime
from ..settings import load_settings
from ..usage import OneLineParser
from . import events, metrics, operator, protect, service, turns
from .arguments import whole_number
from .exits import EXIT_FAILED, EXIT_NOT_FOUND, EXIT_USAGE, error_line

__all__ = ["build_parser", "main"]


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

    service.register(add)  # migrate, worker, sweep, health
    turns.register(add)  # submit, wait, watch, journal, turns, spend, replay

    from ..web.serve import add_arguments as console_arguments
    from ..web.serve import cmd_console

    console = add(
        "console", cmd_console, "serve the web console (extra 'console'; a login is required)"
    )
    console_arguments(console, whole_number(1, 65_535, "a port"))
    metrics.register(add, whole_number(1, 65_535, "a port"))  # metrics

    operator.register(add)  # cancel, prune, uncertain, resolve, approvals, approve, deny
    protect.register(add)  # rekey, audit, roles, keygen
    events.register(add)  # send-event, events
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
    if argv[command_at : command_at + 2] == ["eval", "replay"]:
        del argv[command_at]  # `eval replay` is the replay command: one command, one check
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
    set_interface("cli")  # what an operator does from here is audited as through the CLI
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
