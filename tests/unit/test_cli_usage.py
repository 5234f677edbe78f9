"""The durable-agent command line where no database is needed: usage errors and bad config.

The cases run ``durable_agent.cli.main`` in this process, with the environment cleared of
our settings and stdout/stderr captured; one case runs ``python -m durable_agent`` as a
process, for the entry point itself.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable

import pytest

from durable_agent.cli import main

COMMANDS = [
    "migrate",
    "worker",
    "sweep",
    "submit",
    "wait",
    "journal",
    "turns",
    "replay",
    "cancel",
    "prune",
    "uncertain",
    "resolve",
    "approvals",
    "approve",
    "deny",
]
UNREACHABLE = "postgresql://root:s3cret-pw@127.0.0.1:1/nowhere"

Cli = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def cli(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Cli:
    """Run `durable-agent ARGS` in this process with our settings cleared from the
    environment, then ENV; the exit code and what it printed."""

    def run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
        for key in list(os.environ):
            if key.upper().startswith(("DURABLE_AGENT_", "OPENAI_", "CRASH_AT")):
                monkeypatch.delenv(key)
        monkeypatch.setenv("COLUMNS", "80")  # a narrow terminal must not break one-line errors
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        capsys.readouterr()
        try:
            code = main(list(args))
        except SystemExit as exit:  # argparse: usage errors and --help
            code = exit.code if isinstance(exit.code, int) else 1
        captured = capsys.readouterr()
        return subprocess.CompletedProcess(list(args), code, captured.out, captured.err)

    return run


def test_the_module_runs_as_a_command() -> None:
    """`python -m durable_agent --help` is the same program, exit 0."""
    result = subprocess.run(
        [sys.executable, "-m", "durable_agent", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: durable-agent")


def assert_one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    """stderr is exactly one line, starting with 'error:', and no traceback anywhere."""
    assert "Traceback" not in result.stderr + result.stdout
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error:"), lines[0]
    return lines[0]


def test_help_lists_every_command(cli: Cli) -> None:
    """--help exits 0 and names every command."""
    result = cli("--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: durable-agent")
    for command in COMMANDS:
        assert command in result.stdout


@pytest.mark.parametrize("command", ["submit", "wait", "journal", "turns"])
def test_command_help(cli: Cli, command: str) -> None:
    """Each command has its own --help that exits 0."""
    result = cli(command, "--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"usage: durable-agent {command}")


def test_unknown_command_exits_2(cli: Cli) -> None:
    """An unknown command is a usage error (exit 2) listing the valid choices."""
    result = cli("frobnicate")
    assert result.returncode == 2
    assert "usage: durable-agent" in result.stderr
    assert "invalid choice: 'frobnicate'" in result.stderr
    assert "Traceback" not in result.stderr


def test_no_command_exits_2(cli: Cli) -> None:
    """Running with no command is a usage error."""
    result = cli()
    assert result.returncode == 2
    assert "usage: durable-agent" in result.stderr


def test_submit_without_session_exits_2_with_usage(cli: Cli) -> None:
    """submit needs --session: exit 2 and the submit usage line."""
    result = cli("submit", "hello")
    assert result.returncode == 2
    assert "usage: durable-agent submit" in result.stderr
    assert "--session" in result.stderr
    assert result.stdout == ""


def test_unknown_option_exits_2(cli: Cli) -> None:
    """Extra options are only passed through for `worker`; elsewhere they are an error."""
    result = cli("turns", "--frobnicate")
    assert result.returncode == 2
    assert "unrecognized arguments: --frobnicate" in result.stderr


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("DURABLE_AGENT_LEASE_SECONDS", "abc"),
        ("DURABLE_AGENT_MAX_STEPS", "0"),
    ],
)
def test_bad_setting_prints_one_error_line(cli: Cli, name: str, value: str) -> None:
    """A malformed setting: one 'error:' line naming the variable, no traceback, exit 2."""
    result = cli("turns", **{name: value})
    assert result.returncode == 2
    line = assert_one_error_line(result)
    assert name in line
    assert result.stdout == ""


@pytest.mark.parametrize(
    "args",
    [
        ["turns"],
        ["journal", "turn_x"],
        ["submit", "--session", "s1", "hello"],
        ["wait", "turn_x", "--timeout", "1"],
        ["sweep"],
        ["migrate"],
    ],
    ids=lambda a: a[0],
)
def test_unreachable_database_prints_one_error_line(cli: Cli, args: list[str]) -> None:
    """No Postgres: one 'error:' line that says so and hides the password; exit non-zero."""
    result = cli(*args, DURABLE_AGENT_DATABASE_URL=UNREACHABLE)
    assert result.returncode != 0
    line = assert_one_error_line(result)
    assert "Postgres" in line
    assert "127.0.0.1:1/nowhere" in line
    assert "s3cret-pw" not in result.stderr + result.stdout


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("nonsense", "needs PostgreSQL"),
        ("mysql://u:s3cret-pw@127.0.0.1/db", "needs PostgreSQL"),
        ("sqlite:///tmp/durable-agent-unit.db", "needs PostgreSQL"),
        ("postgresql://u:s3cret-pw@127.0.0.1:99999/db", "is not a port"),
        ("postgresql://u:s3cret-pw@127.0.0.1/db?frobnicate=1", "invalid URI query parameter"),
    ],
)
def test_bad_database_url_prints_one_error_line(cli: Cli, url: str, expected: str) -> None:
    """A URL that is not a usable PostgreSQL URL: one 'error:' line, no traceback, no password,
    exit 2 (a configuration error)."""
    result = cli("turns", DURABLE_AGENT_DATABASE_URL=url)
    assert result.returncode == 2
    line = assert_one_error_line(result)
    assert "bad database URL" in line and expected in line
    assert "s3cret-pw" not in result.stderr + result.stdout


@pytest.mark.parametrize(
    "args",
    [
        ["turns", "--limit", "-1"],
        ["turns", "--limit", "0"],
        ["turns", "--limit", "99999999999"],
        ["turns", "--limit", "ten"],
        ["wait", "turn_x", "--timeout", "nan"],
        ["wait", "turn_x", "--timeout", "-1"],
        ["wait", "turn_x", "--timeout", "inf"],
        ["eval", "crash-matrix", "--relabel", "send_email=maybe"],
        ["eval", "crash-matrix", "--relabel", "send_email"],
        ["eval", "crash-matrix", "--point", "3:somewhere"],
        ["resolve", "turn_x", "3"],
        ["resolve", "turn_x", "three", "--happened"],
        ["resolve", "turn_x", "3", "--happened", "--ignore"],
        ["approve", "turn_x", "-1"],
        ["deny", "turn_x", "3"],
        ["prune"],
        ["prune", "--older-than", "30d", "--batch", "0"],
    ],
    ids=" ".join,
)
def test_bad_argument_values_are_usage_errors(cli: Cli, args: list[str]) -> None:
    """Out-of-range or malformed values: exit 2 with the usage line, no traceback, no wait."""
    result = cli(*args)
    assert result.returncode == 2, result
    assert "Traceback" not in result.stderr + result.stdout
    assert "usage: durable-agent" in result.stderr


BAD_UTF8 = os.fsdecode(b"turn-\xff\xfe")  # what Python makes of invalid UTF-8 in argv


@pytest.mark.parametrize(
    "args",
    [
        ["journal", BAD_UTF8],
        ["wait", BAD_UTF8, "--timeout", "0"],
        ["replay", BAD_UTF8],
        ["eval", "replay", BAD_UTF8],  # the same command under its older name
        ["turns", "--session", BAD_UTF8],
        ["submit", "--session", BAD_UTF8, "hello"],
        ["submit", "--session", "s", BAD_UTF8],
        ["submit", "--session", "s", "--turn-id", BAD_UTF8, "hello"],
        ["submit", "--session", "x" * 201, "hello"],
        ["submit", "--session", "s", ""],
        ["cancel", BAD_UTF8],
        ["cancel", "turn_x", "--reason", "x" * 5000],
        ["cancel", "turn_x", "--by", BAD_UTF8],
        ["resolve", "turn_x", "3", "--happened", "--note", BAD_UTF8],
        ["approve", BAD_UTF8, "3"],
        ["deny", "turn_x", "3", "--reason", " "],
        ["uncertain", "--since", "yesterday"],
        ["uncertain", "--turn", "x" * 201],
        ["approvals", "--turn", BAD_UTF8],
        ["prune", "--older-than", "soon"],
        ["prune", "--older-than", "0d"],
    ],
    ids=lambda a: " ".join(a)[:40],
)
def test_bad_text_in_arguments_is_one_error_line(cli: Cli, args: list[str]) -> None:
    """Invalid UTF-8, an over-long id or an empty message: one 'error:' line, exit 2, before
    anything touches the database (the URL here reaches nothing)."""
    result = cli(*args, DURABLE_AGENT_DATABASE_URL=UNREACHABLE)
    assert result.returncode == 2, result
    line = assert_one_error_line(result)
    assert "Postgres" not in line, line


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        ("DURABLE_AGENT_BROKER_URL", "redis://h:99999/0", "bad broker URL"),
        ("DURABLE_AGENT_BROKER_URL", "nats://h:4222", "scheme must be one of"),
        ("DURABLE_AGENT_BROKER_URL", "redis://h/0?bogus=1", "unknown query parameter"),
        ("DURABLE_AGENT_LEASE_SECONDS", "nan", "finite"),
        ("DURABLE_AGENT_QUEUE", "", "1-200 characters"),
    ],
)
def test_bad_settings_are_one_error_line(cli: Cli, name: str, value: str, says: str) -> None:
    result = cli("turns", **{name: value})
    assert result.returncode == 2
    line = assert_one_error_line(result)
    assert name in line and says in line, line


def test_every_worker_gets_a_node_name_of_its_own() -> None:
    """Three `durable-agent worker` on one host were celery@vm three times (one in Flower)."""
    from durable_agent.cli.service import worker_argv

    argv = worker_argv(["turns"], "INFO", ["--concurrency", "4"])
    name = argv[argv.index("--hostname") + 1]
    assert name == f"turns-{os.getpid()}@%h"
    assert worker_argv(["turns"], "INFO", ["-n", "mine@%h"]).count("--hostname") == 0
    assert worker_argv(["turns"], "INFO", ["--hostname=mine@%h"]).count("--hostname") == 0
