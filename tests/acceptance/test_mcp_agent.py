"""An agent whose tools come from an MCP server, on real prefork workers: the crash matrix
at every point (the server started over stdio by each worker process), and a worker
SIGKILLed while the server, reached over streamable HTTP, sends the email."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from durable_agent import start_turn, wait_for_turn
from durable_agent.embedded.processes import free_port
from durable_agent.runtime import Runtime
from durable_agent.settings import Settings
from durable_agent.testing import ScriptedModelServer, SmtpInbox, email_policy

if TYPE_CHECKING:
    from conftest import StartWorker

pytest.importorskip("mcp")

SERVER = [sys.executable, "-m", "durable_agent.testing.mcp_server"]
MESSAGE = "Please email the note 'launch' to ada@example.com."
CLEAN_REPLY = "Done: the note 'launch' was sent to ada@example.com."


@pytest.mark.long
@pytest.mark.timeout(600)
def test_mcp_agent_passes_the_crash_matrix_at_every_point(
    crash_matrix: Callable[..., Any],
) -> None:
    """Every step, both crash points, prefork workers: each turn ends done, one email, no
    finished call repeated, the clean run's reply; the MCP session does not survive the
    crash, the journal carries what happened."""
    report = crash_matrix("durable_agent_examples.mcp_scenario:scenario", pool="prefork")
    assert report.agent == "mcp-mailer"
    assert report.clean_reply == CLEAN_REPLY
    assert report.clean_steps == [
        "model llm",
        "tool lookup_note (safe)",
        "model llm",
        "tool send_email (never)",
        "model llm",
    ]
    assert [(p.step, p.point) for p in report.points] == [
        (step, point) for step in range(5) for point in ("before_run", "after_run")
    ]
    for point in report.points:
        assert point.status == "done" and point.same_reply, point
        assert point.effects == {"send_email": 1} and point.repeated_finished == 0, point


@pytest.fixture
def http_mcp_server(tmp_path: Path) -> Iterator[Callable[[SmtpInbox], str]]:
    """``start(inbox)``: the test MCP server over streamable HTTP, sending to ``inbox``;
    returns its URL. Stopped after the test, by its PID."""
    started: list[subprocess.Popen[bytes]] = []

    def start(inbox: SmtpInbox) -> str:
        port = free_port()
        env = {**os.environ, "SMTP_URL": inbox.smtp_url, "INBOX_URL": inbox.api_url}
        with (tmp_path / "mcp_server.log").open("wb") as log:
            process = subprocess.Popen(
                [*SERVER, "--http", "--port", str(port)],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        started.append(process)
        url = f"http://127.0.0.1:{port}/mcp"
        deadline = time.monotonic() + 30
        while True:
            assert process.poll() is None, (tmp_path / "mcp_server.log").read_text()
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=1).close()
                return url
            except urllib.error.HTTPError:
                return url  # it answers (404 at /): up
            except OSError:
                assert time.monotonic() < deadline, "the MCP server did not start in 30 s"
                time.sleep(0.1)

    yield start
    for process in started:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


@pytest.mark.timeout(240)
def test_worker_killed_during_a_never_call_over_streamable_http(
    settings: Settings,
    runtime: Runtime,
    start_worker: StartWorker,
    http_mcp_server: Callable[[SmtpInbox], str],
) -> None:
    """The MCP server holds send_email in SMTP (the inbox holds it); the prefork worker is
    SIGKILLed meanwhile. The server finishes the send; the next worker opens its own
    session, answers the interrupted call "may or may not have happened", the model checks
    list_sent_emails and finds it: one email, the clean reply."""
    with ScriptedModelServer(email_policy) as model, SmtpInbox() as inbox:
        url = http_mcp_server(inbox)
        turn_settings = settings.model_copy(
            update={
                "openai_base_url": model.base_url,
                "tools": "durable_agent_examples.mcp_agent",
                "lease_seconds": 2.0,
            }
        )
        env = {"MCP_URL": url, "SMTP_URL": inbox.smtp_url, "INBOX_URL": inbox.api_url}
        inbox.hold()
        first = start_worker(turn_settings, name="first", pool="prefork", **env)
        turn_id = start_turn("s-mcp", MESSAGE, agent="mcp-mailer", settings=turn_settings)
        inbox.wait_for_waiting(1, timeout=60)  # the server is inside send_email's SMTP
        first.kill()
        inbox.release()
        deadline = time.monotonic() + 30
        while inbox.count < 1:
            assert time.monotonic() < deadline, "the held email never arrived"
            time.sleep(0.05)

        start_worker(turn_settings, name="second", pool="prefork", **env)
        turn = wait_for_turn(turn_id, 120, settings=turn_settings)

        assert turn.status == "done" and turn.reply == CLEAN_REPLY
        assert inbox.count == 1
        steps = runtime.journal.load_journal(turn_id)
        sends = [s for s in steps if s.name == "send_email"]
        assert len(sends) == 1 and sends[0].replay == "never"
        assert "may or may not have happened" in sends[0].output["content"]
        assert [s.name for s in steps if s.kind == "tool"] == [
            "lookup_note",
            "send_email",
            "list_sent_emails",
        ]
