"""An MCP server's tools as durable-agent tools, against the real test MCP server started
over stdio: labels from annotations and from replay=, the refusals at definition, an
unreachable server, an isError result, the hidden idempotency key, and the session kept per
process, rebuilt after the server died and after a fork."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from inprocess import run_cli

pytest.importorskip("mcp")

from durable_agent.embedded.processes import free_port
from durable_agent.errors import ConfigurationError, ToolDefinitionError
from durable_agent.mcp import close_sessions, tools_from_server
from durable_agent.mcp.sessions import session_for
from durable_agent.settings import Settings
from durable_agent.step.runner import StepRunner
from durable_agent.step.tools import ToolRegistry, ToolSet, load_tools
from durable_agent.testing import MemoryJournal, SmtpInbox

SERVER = [sys.executable, "-m", "durable_agent.testing.mcp_server"]
LABELLED = {"archive_note": "safe"}


class Claimed:
    def check(self) -> None:
        pass

    def still_claimed(self) -> bool:
        return True


@pytest.fixture(scope="module")
def notes() -> ToolSet:
    """The test server's tools, listed once for the tests that need no environment of their
    own (each test's calls still open a session of their own)."""
    return tools_from_server("notes", command=SERVER, replay=LABELLED)


@pytest.fixture(autouse=True)
def _sessions_closed() -> Iterator[None]:
    """Each test's sessions (and their server subprocesses) closed after it."""
    yield
    close_sessions()


def _servers() -> list[int]:
    """The PIDs of this process's test MCP server subprocesses."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        if parent == os.getpid() and b"durable_agent.testing.mcp_server" in cmdline:
            found.append(int(entry))
    return found


def _call(runner: StepRunner, name: str, arguments: dict[str, Any]) -> str:
    return runner.tool_step(
        {
            "id": "c1",
            "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments)},
        }
    )


def _runner(*tools: Any, turn_id: str = "turn_mcp") -> tuple[StepRunner, MemoryJournal]:
    journal = MemoryJournal(turn_id=turn_id)
    return StepRunner(journal, tools=ToolRegistry(tools), guard=Claimed()), journal


def test_labels_come_from_the_annotations_and_replay_fills_the_rest(notes: ToolSet) -> None:
    tools = notes
    labels = {t.name: t.replay for t in tools}
    assert labels == {
        "lookup_note": "safe",  # readOnlyHint
        "send_email": "never",  # destructiveHint, not idempotent
        "list_sent_emails": "safe",
        "archive_note": "safe",  # no annotations: replay=
    }
    send = tools.named("send_email")
    # the server's idempotency_key is filled by the runner, never shown to the model
    assert send.wants_idempotency_key
    schema = send.openai_schema()["function"]["parameters"]
    assert set(schema["properties"]) == {"to", "subject", "body"}
    assert "idempotency_key" not in schema.get("required", [])


def test_replay_wins_over_the_annotations_and_takes_the_servers_names() -> None:
    """replay= and approval= name the server's tools; prefix= changes what the model calls."""
    tools = tools_from_server(
        "notes",
        command=SERVER,
        replay={"lookup_note": "never", "archive_note": "never"},
        prefix="notes_",
        approval=["send_email"],
    )
    assert tools.named("notes_lookup_note").replay == "never"
    assert tools.named("notes_archive_note").replay == "never"
    assert [t.name for t in tools if t.approval == "required"] == ["notes_send_email"]
    with pytest.raises(ToolDefinitionError, match="approval names 'send_mail'"):
        tools_from_server("notes", command=SERVER, replay=LABELLED, approval=["send_mail"])


def test_a_tool_without_a_label_refuses_the_start_naming_it() -> None:
    with pytest.raises(ToolDefinitionError) as refused:
        tools_from_server("notes", command=SERVER)
    text = str(refused.value)
    assert "MCP server 'notes'" in text and "'archive_note'" in text
    assert "replay=" in text and "\n" not in text


def test_an_unknown_name_in_replay_is_refused() -> None:
    with pytest.raises(ToolDefinitionError) as refused:
        tools_from_server("notes", command=SERVER, replay={**LABELLED, "archiv_note": "safe"})
    assert "'archiv_note'" in str(refused.value) and "archive_note" in str(refused.value)


@pytest.mark.parametrize(
    ("where", "named"),
    [
        ({"command": ["/nonexistent/mcp-server", "--stdio"]}, "/nonexistent/mcp-server --stdio"),
        ({"command": f"{sys.executable} -c pass"}, "-c pass"),
        ({"url": "http://127.0.0.1:{port}/mcp"}, "http://127.0.0.1:{port}/mcp"),
    ],
)
def test_a_server_that_cannot_be_reached_is_one_line_naming_it(
    where: dict[str, Any], named: str
) -> None:
    port = free_port()
    where = {k: v.format(port=port) if isinstance(v, str) else v for k, v in where.items()}
    started = time.monotonic()
    with pytest.raises(ConfigurationError) as refused:
        tools_from_server("notes", replay=LABELLED, connect_timeout=20, **where)
    text = str(refused.value)
    assert "MCP server 'notes'" in text and named.format(port=port) in text, text
    assert "\n" not in text and not isinstance(refused.value, ToolDefinitionError)
    assert time.monotonic() - started < 25


def test_command_and_url_are_exactly_one() -> None:
    with pytest.raises(ConfigurationError, match="exactly one of command"):
        tools_from_server("notes")
    with pytest.raises(ConfigurationError, match="exactly one of command"):
        tools_from_server("notes", command=SERVER, url="http://127.0.0.1:1/mcp")


def test_a_worker_whose_server_is_unreachable_does_not_start(
    settings: Settings, tmp_path: Path
) -> None:
    (tmp_path / "broken_mcp_tools.py").write_text(
        "from durable_agent.mcp import tools_from_server\n"
        "mail = tools_from_server('mail', command=['/nonexistent/mail-mcp'], replay={})\n"
    )
    result = run_cli(
        settings,
        "worker",
        DURABLE_AGENT_TOOLS="broken_mcp_tools",
        PYTHONPATH=f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
    )
    assert result.returncode != 0
    assert "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "MCP server 'mail'" in errors[0], result.stderr
    assert "/nonexistent/mail-mcp" in errors[0]


def test_an_is_error_result_is_the_tools_error_the_model_reads(notes: ToolSet) -> None:
    tools = notes
    runner, journal = _runner(*tools)
    text = _call(runner, "lookup_note", {"name": "no-such-note"})
    assert text.startswith("Error: lookup_note raised McpToolError")
    assert "No note is named 'no-such-note'" in text
    (step,) = journal.steps()
    assert step.status == "done" and step.output["error"] is True
    # the turn goes on: the next call works on the same session
    assert _call(runner, "lookup_note", {"name": "launch"}).startswith("The launch is on Friday")


def test_arguments_the_schema_refuses_never_reach_the_server(tmp_path: Path) -> None:
    archive = tmp_path / "archive.txt"
    tools = tools_from_server(
        "notes", command=SERVER, replay=LABELLED, env={"ARCHIVE_FILE": str(archive)}
    )
    runner, _ = _runner(*tools)
    text = _call(runner, "archive_note", {"name": 42})
    assert text.startswith("Error: invalid arguments for archive_note") and "name" in text
    assert not archive.exists()
    assert _call(runner, "archive_note", {"name": "launch"}) == "Archived 'launch'."
    assert archive.read_text() == "launch\n"


def test_a_never_tool_gets_the_calls_idempotency_key() -> None:
    with SmtpInbox() as inbox:
        tools = tools_from_server(
            "notes", command=SERVER, replay=LABELLED, env={"SMTP_URL": inbox.smtp_url}
        )
        runner, journal = _runner(*tools)
        arguments = {"to": "ada@example.com", "subject": "Note: launch", "body": "Friday"}
        assert _call(runner, "send_email", arguments) == "Sent 'Note: launch' to ada@example.com."
        (step,) = journal.steps()
        key = step.input["idempotency_key"]
        assert key and step.input["arguments"] == arguments  # the key is not an argument
        (message,) = inbox.messages
        assert message.email["X-Idempotency-Key"] == key


def test_one_session_per_process_rebuilt_after_the_server_died(tmp_path: Path) -> None:
    """Calls share one server; after it died between calls, a never call is sent once on a
    new session (not reported uncertain without having left)."""
    archive = tmp_path / "archive.txt"
    tools = tools_from_server(
        "notes",
        command=SERVER,
        replay={"archive_note": "never"},
        env={"ARCHIVE_FILE": str(archive)},
    )
    assert _servers() == []  # the listing's session is closed once listed
    lookup = tools.named("lookup_note")
    lookup(name="launch")
    lookup(name="standup")
    (server,) = _servers()  # two calls, one server
    os.kill(server, signal.SIGKILL)
    session = session_for(tools.named("lookup_note").function.spec)
    deadline = time.monotonic() + 10
    while not session.closed:  # the session reads the end of the server's output
        assert time.monotonic() < deadline
        time.sleep(0.05)
    runner, _ = _runner(*tools)
    assert _call(runner, "archive_note", {"name": "launch"}) == "Archived 'launch'."
    assert archive.read_text() == "launch\n"
    assert len(_servers()) == 1 and _servers() != [server]


def test_calls_from_several_threads_share_the_one_session(notes: ToolSet) -> None:
    """A threads pool's calls run at once on the process's session: one server, every
    answer its own call's."""
    from concurrent.futures import ThreadPoolExecutor

    lookup = notes.named("lookup_note")
    names = ["launch", "standup", "offsite"] * 8
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda name: lookup(name=name), names))
    assert [a.split()[1] for a in answers] == [
        {"launch": "launch", "standup": "moves", "offsite": "offsite"}[n] for n in names
    ]
    assert len(_servers()) == 1


def test_a_never_call_cut_short_by_the_servers_death_is_uncertain() -> None:
    """The server dies while send_email waits in SMTP: the call is not sent again; the model
    reads that it may or may not have happened, and the next call opens a new session."""
    with SmtpInbox() as inbox:
        tools = tools_from_server(
            "notes", command=SERVER, replay=LABELLED, env={"SMTP_URL": inbox.smtp_url}
        )
        runner, journal = _runner(*tools)
        inbox.hold()
        answer: list[str] = []
        arguments = {"to": "ada@example.com", "subject": "Note: launch", "body": "Friday"}
        sending = threading.Thread(
            target=lambda: answer.append(_call(runner, "send_email", arguments))
        )
        sending.start()
        try:
            inbox.wait_for_waiting(1, timeout=30)
            (server,) = _servers()
            os.kill(server, signal.SIGKILL)
            sending.join(30)
        finally:
            inbox.release()
        assert answer and "may or may not have happened" in answer[0], answer
        (step,) = journal.steps()
        assert step.output["uncertain"] is True and step.output["error"] is True
        assert len(_servers()) == 0  # not sent again on a new session
        assert tools.named("lookup_note")(name="launch").startswith("The launch")


def test_a_forked_child_opens_its_own_session(notes: ToolSet) -> None:
    tools = notes
    lookup = tools.named("lookup_note")
    lookup(name="launch")
    (parents,) = _servers()
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child reports through the pipe
        try:
            answer = lookup(name="standup")
            ok = answer.startswith("Standup") and parents not in _servers()
            os.write(write, b"ok" if ok and len(_servers()) == 1 else answer.encode()[:200])
            close_sessions()
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        reported = pipe.read()
    os.waitpid(child, 0)
    assert reported == b"ok"
    assert lookup(name="offsite").startswith("The offsite") and _servers() == [parents]


def test_a_tools_module_offers_a_servers_tools(tmp_path: Path, monkeypatch: Any) -> None:
    (tmp_path / "notes_mcp_tools.py").write_text(
        "import sys\n"
        "from durable_agent.mcp import tools_from_server\n"
        "notes = tools_from_server('notes', command=[sys.executable, '-m', "
        "'durable_agent.testing.mcp_server'], replay={'archive_note': 'safe'}, prefix='notes_')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    registry = load_tools(["notes_mcp_tools"])
    assert registry.names() == [
        "notes_archive_note",
        "notes_list_sent_emails",
        "notes_lookup_note",
        "notes_send_email",
    ]
    runner, _ = _runner(*registry)
    assert _call(runner, "notes_lookup_note", {"name": "launch"}).startswith("The launch")
