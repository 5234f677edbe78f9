"""The durable-agent command line where no database is needed: usage errors and bad config.

Every case runs the real CLI as a subprocess (``python -m durable_agent``).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

COMMANDS = ["migrate", "worker", "sweep", "submit", "wait", "journal", "turns"]
UNREACHABLE = "postgresql://root:s3cret-pw@127.0.0.1:1/nowhere"


def cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run `durable-agent ARGS` with our settings cleared from the environment, then ENV."""
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.upper().startswith(("DURABLE_AGENT_", "OPENAI_", "CRASH_AT"))
    }
    base["COLUMNS"] = "80"  # a narrow terminal must not break one-line errors
    return subprocess.run(
        [sys.executable, "-m", "durable_agent", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**base, **env},
        stdin=subprocess.DEVNULL,
    )


def assert_one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    """stderr is exactly one line, starting with 'error:', and no traceback anywhere."""
    assert "Traceback" not in result.stderr + result.stdout
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error:"), lines[0]
    return lines[0]


def test_help_lists_every_command() -> None:
    """--help exits 0 and names every command."""
    result = cli("--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: durable-agent")
    for command in COMMANDS:
        assert command in result.stdout


@pytest.mark.parametrize("command", ["submit", "wait", "journal", "turns"])
def test_command_help(command: str) -> None:
    """Each command has its own --help that exits 0."""
    result = cli(command, "--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"usage: durable-agent {command}")


def test_unknown_command_exits_2() -> None:
    """An unknown command is a usage error (exit 2) listing the valid choices."""
    result = cli("frobnicate")
    assert result.returncode == 2
    assert "usage: durable-agent" in result.stderr
    assert "invalid choice: 'frobnicate'" in result.stderr
    assert "Traceback" not in result.stderr


def test_no_command_exits_2() -> None:
    """Running with no command is a usage error."""
    result = cli()
    assert result.returncode == 2
    assert "usage: durable-agent" in result.stderr


def test_submit_without_session_exits_2_with_usage() -> None:
    """submit needs --session: exit 2 and the submit usage line."""
    result = cli("submit", "hello")
    assert result.returncode == 2
    assert "usage: durable-agent submit" in result.stderr
    assert "--session" in result.stderr
    assert result.stdout == ""


def test_unknown_option_exits_2() -> None:
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
def test_bad_setting_prints_one_error_line(name: str, value: str) -> None:
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
def test_unreachable_database_prints_one_error_line(args: list[str]) -> None:
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
def test_bad_database_url_prints_one_error_line(url: str, expected: str) -> None:
    """A URL that is not a usable PostgreSQL URL: one 'error:' line, no traceback, no password,
    exit 2 (a configuration error)."""
    result = cli("turns", DURABLE_AGENT_DATABASE_URL=url)
    assert result.returncode == 2
    line = assert_one_error_line(result)
    assert "bad database URL" in line and expected in line
    assert "s3cret-pw" not in result.stderr + result.stdout
