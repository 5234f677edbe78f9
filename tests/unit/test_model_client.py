"""ModelClient through the real openai SDK against a real loopback ScriptedModelServer."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from durable_agent import ConfigurationError, ModelUnavailable, Settings, TurnFailed
from durable_agent.step.model import ModelClient, ModelSwitchedOff
from durable_agent.testing import ScriptedModelServer, call_tool, reply

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "lookup_note",
            "description": "Look up a note.",
            "parameters": {
                "type": "object",
                "properties": {"name": {"type": "string"}},
                "required": ["name"],
            },
        },
    }
]


def closed_port() -> int:
    """A loopback port nothing listens on (bound once to pick it, then closed)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def lookup_then_answer(body: dict[str, Any]) -> dict[str, Any]:
    """Call lookup_note first; answer once a tool result is in the conversation."""
    if body["messages"][-1]["role"] == "tool":
        return reply("The launch is on Friday.")
    return call_tool("lookup_note", {"name": "launch"})


def request(*extra: dict[str, Any]) -> dict[str, Any]:
    return {
        "model": "gpt-test",
        "messages": [{"role": "user", "content": "When is the launch?"}, *extra],
        "tools": TOOLS,
    }


@pytest.fixture
def server() -> Iterator[ScriptedModelServer]:
    with ScriptedModelServer(lookup_then_answer) as running:
        yield running


@pytest.fixture
def make_client() -> Iterator[Callable[..., ModelClient]]:
    """Build ModelClients for a base URL; their HTTP clients are closed afterwards."""
    made: list[ModelClient] = []

    def make(base_url: str, retries: int = 0) -> ModelClient:
        settings = Settings(
            openai_base_url=base_url,
            openai_api_key="test-key",
            model_max_retries=retries,
            model_timeout_seconds=20,
        )
        client = ModelClient(settings)
        made.append(client)
        return client

    yield make
    for client in made:
        client.client.close()


def test_tool_call_response_as_plain_data(
    server: ScriptedModelServer, make_client: Callable[..., ModelClient]
) -> None:
    """A tool-calling answer comes back as a plain dict with message, usage and model."""
    client = make_client(server.base_url)

    result = client(request())

    assert result["message"] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1_0",
                "type": "function",
                "function": {"name": "lookup_note", "arguments": '{"name":"launch"}'},
            }
        ],
    }
    assert result["finish_reason"] == "tool_calls"
    assert result["model"] == "gpt-test"
    usage = result["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"] > 0
    assert json.loads(json.dumps(result)) == result  # journal-ready plain data
    assert client.calls == 1
    assert server.request_count == 1
    sent = server.requests[0]
    assert sent["tools"] == TOOLS and sent["messages"] == request()["messages"]


def test_plain_reply_has_no_tool_calls(
    server: ScriptedModelServer, make_client: Callable[..., ModelClient]
) -> None:
    """A final answer has content and no tool_calls key."""
    client = make_client(server.base_url)
    assistant = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1_0",
                "type": "function",
                "function": {"name": "lookup_note", "arguments": '{"name":"launch"}'},
            }
        ],
    }
    tool_result = {"role": "tool", "tool_call_id": "call_1_0", "content": "Friday 10:00"}

    result = client(request(assistant, tool_result))

    assert result["message"] == {"role": "assistant", "content": "The launch is on Friday."}
    assert result["finish_reason"] == "stop"


def test_transient_500_is_retried_by_the_sdk(
    server: ScriptedModelServer, make_client: Callable[..., ModelClient]
) -> None:
    """One 500 followed by success: the SDK retries and the call succeeds."""
    server.fail_next(1, 500, retry_after=0.01)
    client = make_client(server.base_url, retries=2)

    result = client(request())

    assert result["message"]["tool_calls"][0]["function"]["name"] == "lookup_note"
    assert server.request_count == 2


@pytest.mark.parametrize("status", [500, 503, 429])
def test_persistent_server_errors_are_model_unavailable(
    server: ScriptedModelServer, make_client: Callable[..., ModelClient], status: int
) -> None:
    """A server that keeps failing gives ModelUnavailable (retryable) after the SDK's retries."""
    server.fail_next(10, status, retry_after=0.01)
    client = make_client(server.base_url, retries=2)

    with pytest.raises(ModelUnavailable) as caught:
        client(request())

    assert str(status) in str(caught.value)
    assert f"Injected failure ({status})" in str(caught.value)
    assert caught.value.retryable
    assert server.request_count == 3  # the first try and two retries


@pytest.mark.parametrize("status", [400, 422])
def test_rejected_request_fails_the_turn(
    server: ScriptedModelServer, make_client: Callable[..., ModelClient], status: int
) -> None:
    """400/422 are not retried and become TurnFailed with the API's message."""
    server.fail_next(1, status)
    client = make_client(server.base_url, retries=2)

    with pytest.raises(TurnFailed) as caught:
        client(request())

    assert f"Injected failure ({status})" in str(caught.value)
    assert not isinstance(caught.value, ModelUnavailable)
    assert server.request_count == 1


def test_connection_refused_names_the_url(make_client: Callable[..., ModelClient]) -> None:
    """Nobody listening: ModelUnavailable whose message names the URL it tried."""
    base_url = f"http://127.0.0.1:{closed_port()}/v1"
    client = make_client(base_url)

    with pytest.raises(ModelUnavailable) as caught:
        client(request())

    assert base_url in str(caught.value)
    assert "cannot reach the model API" in str(caught.value)


def test_switched_off_model_refuses_and_counts() -> None:
    """ModelSwitchedOff (used by replays) raises TurnFailed on any call and counts it."""
    model = ModelSwitchedOff()
    with pytest.raises(TurnFailed, match="1 messages"):
        model(request())
    assert model.calls == 1


def test_no_endpoint_at_all_is_a_configuration_error() -> None:
    """Neither OPENAI_API_KEY nor OPENAI_BASE_URL: one clear line, not the SDK's traceback."""
    with pytest.raises(ConfigurationError, match="OPENAI_API_KEY"):
        ModelClient(Settings(openai_api_key=None, openai_base_url=None))


@pytest.mark.parametrize(
    ("status", "says"),
    [
        (401, "refused the key"),
        (403, "does not allow this key"),
        (404, "does not know this model or URL"),
        (413, "refused a request this large"),
        (402, "rejected the request (402)"),
    ],
)
def test_configuration_errors_fail_at_once_without_retries(
    server: ScriptedModelServer, make_client: Callable[..., ModelClient], status: int, says: str
) -> None:
    """A wrong key, model or URL, or a request too large, is not an outage: one request, then
    TurnFailed (not retryable) with a reason that says what to fix."""
    server.fail_next(1, status)
    client = make_client(server.base_url, retries=3)

    with pytest.raises(TurnFailed) as caught:
        client(request())

    assert says in str(caught.value)
    assert not caught.value.retryable
    assert server.request_count == 1


@pytest.mark.parametrize("kind", ["html", "truncated", "no-choices", "empty-message"])
def test_a_200_that_is_not_a_usable_completion_is_treated_like_a_5xx(
    server: ScriptedModelServer, make_client: Callable[..., ModelClient], kind: str
) -> None:
    """An HTML page, cut-off JSON, no choices, or a message with neither content nor tool
    calls: ModelUnavailable (the turn is retried after a backoff), never a crash."""
    server.answer_next_malformed(kind)
    client = make_client(server.base_url)

    with pytest.raises(ModelUnavailable) as caught:
        client(request())

    assert caught.value.retryable
    assert server.base_url in str(caught.value)


def test_a_tool_call_of_another_type_is_kept_for_the_runner_to_answer(
    server: ScriptedModelServer, make_client: Callable[..., ModelClient]
) -> None:
    server.answer_next_malformed("custom-tool-call")
    response = make_client(server.base_url)(request())

    [call] = response["message"]["tool_calls"]
    assert call["type"] == "custom" and call["id"] == "call_custom"


def test_credentials_in_error_text_are_stripped(
    server: ScriptedModelServer, make_client: Callable[..., ModelClient]
) -> None:
    """An endpoint that echoes the key or a password in its error: stored and logged text
    has them replaced."""
    base_url = server.base_url.replace("http://", "http://user:hunter2@")
    server.fail_next(1, 401)
    server.fail_message = "bad key sk-proj-abcdefghijkl, header Bearer abc.def.ghi123"
    client = make_client(base_url)

    with pytest.raises(TurnFailed) as caught:
        client(request())

    text = str(caught.value)
    assert "sk-proj-abcdefghijkl" not in text and "abc.def.ghi123" not in text
    assert "sk-***" in text and "Bearer ***" in text
