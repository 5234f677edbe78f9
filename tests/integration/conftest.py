"""Fixtures of the in-process worker tests: a real SMTP inbox and a scripted model server."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from durable_agent.testing import ScriptedModelServer, SmtpInbox, email_policy


@pytest.fixture
def inbox(monkeypatch: pytest.MonkeyPatch) -> Iterator[SmtpInbox]:
    """The test inbox, named to the example email tools by SMTP_URL and INBOX_URL."""
    with SmtpInbox() as box:
        monkeypatch.setenv("SMTP_URL", box.smtp_url)
        monkeypatch.setenv("INBOX_URL", box.api_url)
        yield box


@pytest.fixture
def model_server() -> Iterator[ScriptedModelServer]:
    """The scripted model, answering as the email policy does."""
    with ScriptedModelServer(email_policy) as server:
        yield server
