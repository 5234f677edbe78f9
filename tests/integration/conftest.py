"""Fixtures of the in-process worker tests: a real SMTP inbox and a scripted model server."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from durable_agent.runtime import Runtime
from durable_agent.settings import Settings
from durable_agent.step.tools import ToolRegistry, load_tools
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


@pytest.fixture
def tools() -> ToolRegistry:
    return load_tools(["durable_agent_examples.email_tools"])


@pytest.fixture
def runtimes(
    settings: Settings, model_server: ScriptedModelServer, tools: ToolRegistry
) -> Iterator[Callable[..., Runtime]]:
    """Runtimes on this test's database with the keys given (``""``: none)."""
    made: list[Runtime] = []

    def make(keys: str, **overrides: Any) -> Runtime:
        runtime = Runtime(
            settings.model_copy(
                update={"keys": keys, "openai_base_url": model_server.base_url, **overrides}
            ),
            tools=tools,
        )
        made.append(runtime)
        return runtime

    yield make
    for runtime in made:
        runtime.close()
