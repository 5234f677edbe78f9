"""Tests for the loopback SMTP inbox and its JSON API."""

from __future__ import annotations

import gc
import json
import smtplib
import urllib.error
import urllib.request
import warnings
from collections.abc import Iterator
from email.message import EmailMessage
from typing import Any

import pytest

from durable_agent.testing import SmtpInbox
from durable_agent.testing.__main__ import ServerProcess


def http(method: str, url: str) -> tuple[int, Any]:
    """Send one request and return (status, decoded JSON) without raising on HTTP errors."""
    request = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        with error:
            return error.code, json.loads(error.read())


def send(host: str, port: int, to: str, subject: str, body: str, **extra: str) -> None:
    message = EmailMessage()
    message["From"] = "Agent <agent@example.com>"
    message["To"] = to
    message["Subject"] = subject
    message["Message-ID"] = f"<{abs(hash(subject))}@example.com>"
    for name, value in extra.items():
        message[name] = value
    message.set_content(body)
    with smtplib.SMTP(host, port, timeout=10) as client:
        client.send_message(message)


@pytest.fixture
def inbox() -> Iterator[SmtpInbox]:
    with SmtpInbox() as running:
        yield running


def test_smtp_messages_are_kept_and_served_as_json(inbox: SmtpInbox) -> None:
    assert inbox.smtp_url == f"smtp://127.0.0.1:{inbox.smtp_port}"
    assert inbox.api_url.startswith("http://127.0.0.1:")

    send(inbox.smtp_host, inbox.smtp_port, "ada@example.com", "Note: launch", "Ship it.\nFriday.")
    send(inbox.smtp_host, inbox.smtp_port, "bob@example.com", "Other", "Hello")

    received = inbox.wait_for(2, timeout=10)
    assert [m.subject for m in received] == ["Note: launch", "Other"]
    assert inbox.count == 2
    first = received[0]
    assert first.sender == "agent@example.com"
    assert first.recipients == ("ada@example.com",)
    assert first.body == "Ship it.\nFriday."
    assert first.email["Subject"] == "Note: launch"

    status, listed = http("GET", f"{inbox.api_url}/messages")
    assert status == 200
    assert [m["id"] for m in listed] == ["1", "2"]
    assert listed[0] == {
        "id": "1",
        "from": "agent@example.com",
        "to": ["ada@example.com"],
        "subject": "Note: launch",
        "body": "Ship it.\nFriday.",
        "message_id": f"<{abs(hash('Note: launch'))}@example.com>",
        "headers": listed[0]["headers"],
    }
    assert listed[0]["headers"]["To"] == "ada@example.com"

    status, only_bob = http("GET", f"{inbox.api_url}/messages?to=BOB@example.com")
    assert [m["subject"] for m in only_bob] == ["Other"]
    assert http("GET", f"{inbox.api_url}/messages/2")[1]["subject"] == "Other"
    assert http("GET", f"{inbox.api_url}/messages/9")[0] == 404

    assert http("DELETE", f"{inbox.api_url}/messages")[0] == 200
    assert http("GET", f"{inbox.api_url}/messages")[1] == []
    assert inbox.count == 0


def test_envelope_recipients_include_bcc(inbox: SmtpInbox) -> None:
    message = EmailMessage()
    message["From"] = "agent@example.com"
    message["To"] = "ada@example.com"
    message["Subject"] = "Both"
    message.set_content("x")
    with smtplib.SMTP(inbox.smtp_host, inbox.smtp_port, timeout=10) as client:
        client.send_message(message, to_addrs=["ada@example.com", "audit@example.com"])
    (received,) = inbox.wait_for(1, timeout=10)
    assert received.recipients == ("ada@example.com", "audit@example.com")
    assert [m.subject for m in inbox.messages_to("audit@example.com")] == ["Both"]


def test_wait_for_times_out_with_a_clear_message(inbox: SmtpInbox) -> None:
    with pytest.raises(TimeoutError, match=r"expected 1 message\(s\) in the inbox"):
        inbox.wait_for(1, timeout=0.05)


def test_start_stop_is_warning_free_and_keeps_ports() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        inbox = SmtpInbox()
        with inbox:
            smtp_port, api_url = inbox.smtp_port, inbox.api_url
            # A client still connected when the server stops must not leak anything.
            lingering = smtplib.SMTP(inbox.smtp_host, inbox.smtp_port, timeout=10)
            lingering.ehlo()
        lingering.close()
        assert not inbox.running
        with inbox:
            assert (inbox.smtp_port, inbox.api_url) == (smtp_port, api_url)
            send(inbox.smtp_host, inbox.smtp_port, "ada@example.com", "Again", "x")
            assert inbox.wait_for(1, timeout=10)[0].subject == "Again"
        gc.collect()


def test_command_line_inbox() -> None:
    proc = ServerProcess("inbox")
    try:
        proc.start()
        info = proc.info
        assert info["smtp_url"] == f"smtp://{info['smtp_host']}:{info['smtp_port']}"
        send(info["smtp_host"], info["smtp_port"], "ada@example.com", "From afar", "Hi")
        status, listed = http("GET", f"{info['api_url']}/messages?to=ada@example.com")
        assert status == 200
        assert [m["subject"] for m in listed] == ["From afar"]
        assert proc.stop() == 0
    finally:
        proc.kill()
