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
from pathlib import Path

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
    """An unknown command is a usage error (exit 2): one line listing the valid choices."""
    result = cli("frobnicate")
    assert result.returncode == 2
    line = assert_one_error_line(result)
    assert "invalid choice: 'frobnicate'" in line and "durable-agent --help" in line


def test_no_command_exits_2(cli: Cli) -> None:
    """Running with no command is a usage error, one line."""
    result = cli()
    assert result.returncode == 2
    assert "COMMAND" in assert_one_error_line(result)


def test_submit_without_session_exits_2_with_one_line(cli: Cli) -> None:
    """submit needs --session: exit 2, one line naming the command and the argument."""
    result = cli("submit", "hello")
    assert result.returncode == 2
    line = assert_one_error_line(result)
    assert line.startswith("error: durable-agent submit:") and "--session" in line
    assert result.stdout == ""


def test_unknown_option_exits_2(cli: Cli) -> None:
    """Extra options are only passed through for `worker`; elsewhere they are an error."""
    result = cli("turns", "--frobnicate")
    assert result.returncode == 2
    assert "unrecognized arguments: --frobnicate" in assert_one_error_line(result)


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
        ("postgresql://u:s3cret-pw@127.0.0.1/db?sslmode=bogus", "sslmode='bogus' is not one"),
        (
            "postgresql://u:s3cret-pw@127.0.0.1/db?target_session_attrs=bogus",
            "target_session_attrs='bogus' is not one",
        ),
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
        ["watch", "turn_x", "--timeout", "nan"],
        ["health", "--timeout", "-0.5"],
        ["eval", "crash-matrix", "--lease-seconds", "nan"],
        ["eval", "crash-matrix", "--sweep-interval", "-1"],
        ["eval", "two-workers", "--lease-seconds", "inf"],
        ["eval", "heed-note", "--runs", "-3"],
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
    """Out-of-range or malformed values (``--timeout nan``, a negative number): one
    ``error:`` line naming the command and the argument, exit 2, no usage, no traceback,
    no wait, nothing started (the URL here reaches nothing)."""
    result = cli(*args, DURABLE_AGENT_DATABASE_URL=UNREACHABLE)
    assert result.returncode == 2, result
    line = assert_one_error_line(result)
    assert line.startswith("error: durable-agent"), line
    assert "usage:" not in result.stderr


BAD_UTF8 = os.fsdecode(b"turn-\xff\xfe")  # what Python makes of invalid UTF-8 in argv


@pytest.mark.parametrize(
    "args",
    [
        ["journal", BAD_UTF8],
        ["wait", BAD_UTF8, "--timeout", "0"],
        ["replay", BAD_UTF8],
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
    from durable_agent.cli import worker_argv

    argv = worker_argv(["turns"], "INFO", ["--concurrency", "4"])
    name = argv[argv.index("--hostname") + 1]
    assert name == f"turns-{os.getpid()}@%h"
    assert worker_argv(["turns"], "INFO", ["-n", "mine@%h"]).count("--hostname") == 0
    assert worker_argv(["turns"], "INFO", ["--hostname=mine@%h"]).count("--hostname") == 0


UNREACHABLE_BROKER = "redis://127.0.0.1:1/0"

SCENARIOS = """
from durable_agent.testing import Scenario

def typo():
    return Scenario(
        name="typo", message="Email the note 'launch' to ada@example.com",
        modules=["durable_agent_examples.email_tools"], policy="email",
        effects={"send_emial": lambda: 0},
    )

def uncounted():
    return Scenario(
        name="uncounted", message="Email the note 'launch' to ada@example.com",
        modules=["durable_agent_examples.email_tools", "durable_agent_examples.payments_tools"],
        policy="email", effects={"send_email": lambda: 0},
    )

def needs(inbox):
    return typo()
"""


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--relabel", "nosuch=safe"], "agent 'default' has no tool 'nosuch'"),
        (["--point", "99:after_run"], "--point 99:after_run: agent 'default' stops at 64 steps"),
        (["--point", "send_emial:after_run"], "agent 'default' has no tool 'send_emial'"),
        (["--scenario", "my_scenarios:needs"], "is a function that needs arguments"),
        (["--scenario", "my_scenarios:typo"], "effects names 'send_emial', not a never tool"),
        (["--scenario", "my_scenarios:uncounted"], "never tool(s) 'refund_order' of agent"),
    ],
    ids=[
        "relabel-unknown-tool",
        "point-past-the-cap",
        "point-misspelt-tool",
        "scenario-args",
        "effects-typo",
        "never-tool-uncounted",
    ],
)
def test_crash_matrix_mistakes_are_one_line_before_anything_runs(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], says: str
) -> None:
    """The crash matrix checks its command and the scenario against the scenario's agent
    before it starts anything: Postgres and Redis here reach nothing, so a check that came
    after the start would say "cannot reach", and one after a clean run would never come."""
    (tmp_path / "my_scenarios.py").write_text(SCENARIOS)
    monkeypatch.chdir(tmp_path)
    result = cli(
        "eval",
        "crash-matrix",
        *args,
        DURABLE_AGENT_DATABASE_URL=UNREACHABLE,
        DURABLE_AGENT_BROKER_URL=UNREACHABLE_BROKER,
    )
    assert result.returncode == 2, result
    line = assert_one_error_line(result)
    assert says in line, line


def test_help_names_the_model_server_and_every_exit_code(cli: Cli) -> None:
    """`durable-agent --help` lists the test kit's model server and the exit codes, 4 too."""
    result = cli("--help")
    assert result.returncode == 0
    assert "model-server" in result.stdout
    for code in ("0 success", "1 the command failed", "2 a usage", "3 wait", "4 no turn"):
        assert code in " ".join(result.stdout.split()), code
    for endpoint in ("/_stats", "/_reset", "/_fail", "/_delay"):
        assert endpoint in result.stdout


def test_durable_agent_model_server_serves_the_scripted_model() -> None:
    """`durable-agent model-server --policy email` is the real server: its JSON line, then a
    real request to /_stats; SIGTERM ends it with 0."""
    import json
    import signal
    import urllib.request

    process = subprocess.Popen(
        [sys.executable, "-m", "durable_agent", "model-server", "--policy", "email"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        info = json.loads(process.stdout.readline())
        with urllib.request.urlopen(f"http://127.0.0.1:{info['port']}/_stats", timeout=10) as r:
            assert json.loads(r.read())["requests"] == 0
    finally:
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=10)  # closes the pipes
    assert process.returncode == 0, err


MATRIX = """
import sys
from durable_agent.cli.console import out
from durable_agent.evals.commands import matrix_table
from durable_agent.evals.crash_matrix import MatrixReport, PointResult
points = [
    PointResult(step=s, point=p, call="tool send_email (never)", turn_id="t", crashed=True,
                model_requests=5, repeated_finished=0, repeated_interrupted=1,
                effects={"send_email": 1, "charge_card_for_the_order": 1},
                expected={"send_email": 1}, same_reply=True, recovery_seconds=1.25,
                status="done", reply="r")
    for s in range(2) for p in ("before_run", "after_run")
]
report = MatrixReport(scenario="email", agent="default", message="m", clean_reply="r",
                      clean_steps=[], clean_model_requests=5, clean_effects={},
                      relabel={}, lease_seconds=2, sweep_interval_seconds=0.5, points=points)
out.print(matrix_table(report))
"""


@pytest.mark.parametrize("columns", [None, "60"])
def test_piped_tables_keep_every_column_whole(columns: str | None) -> None:
    """A table printed to a pipe is not cut to 120 columns (``before_r…``): every cell is
    whole; with COLUMNS set, the table fits it and folds cells instead of cutting them."""
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    if columns:
        env["COLUMNS"] = columns
    result = subprocess.run(
        [sys.executable, "-c", MATRIX], capture_output=True, text=True, env=env, timeout=60
    )
    assert result.returncode == 0, result.stderr
    text = result.stdout
    assert "…" not in text, text
    if columns is None:
        assert "before_run" in text and "after_run" in text, text
        assert "send_email 1, charge_card_for_the_order 1" in text, text
        assert "0 (+1 interrupted)" in text, text
    else:
        rows = [line for line in text.splitlines() if line[:1] in "┏┃┡│└"]
        assert rows and max(len(line) for line in rows) <= 60, text


@pytest.mark.parametrize("query", ["sslmode=bogus", "target_session_attrs=bogus"])
def test_a_worker_with_a_bad_libpq_parameter_stops_with_a_configuration_error(
    cli: Cli, query: str
) -> None:
    """Not "cannot reach Postgres" (exit 1, which a supervisor retries forever): exit 2."""
    url = f"postgresql://u:s3cret-pw@127.0.0.1:5432/db?{query}"
    result = cli("worker", DURABLE_AGENT_DATABASE_URL=url)
    assert result.returncode == 2, result
    line = assert_one_error_line(result)
    assert query.split("=")[0] in line and "cannot reach" not in line, line


def test_a_journal_table_with_shortened_outcomes_says_where_the_whole_text_is() -> None:
    """An outcome cut to its one-line summary is named in the table's caption, with the way
    to the whole text (--json); a table with nothing cut has no such caption."""
    from durable_agent.cli.tables import journal_table
    from durable_agent.testing import make_step

    short = make_step(0, "tool", "lookup_note", {}, "safe", "done", {"content": "Friday."})
    long = make_step(1, "tool", "lookup_note", {}, "safe", "done", {"content": "x " * 100})
    assert journal_table([short]).caption is None
    caption = journal_table([short, long]).caption
    assert isinstance(caption, str) and "--json" in caption
