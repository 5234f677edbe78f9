"""Streamed answers and the Responses API: ModelClient through the real openai SDK against a
real loopback ScriptedModelServer that streams (SSE) as OpenAI does."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from durable_agent import ModelUnavailable, Settings, TurnFailed
from durable_agent.errors import InvalidArgument
from durable_agent.operate.live_tokens import Cursor
from durable_agent.step.model import ModelClient
from durable_agent.testing import ScriptedModelServer, call_tool, reply

REPLY = "The launch is on Friday, at noon."


def lookup_then_answer(body: dict[str, Any]) -> dict[str, Any]:
    if body["messages"][-1]["role"] == "tool":
        return reply(REPLY)
    return call_tool("lookup_note", {"name": "launch", "detail": "all of it"})


def chat(*extra: dict[str, Any], stream: bool = True) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "gpt-test",
        "messages": [{"role": "user", "content": "When is the launch?"}, *extra],
    }
    if stream:
        body["stream"] = True
    return body


TOOL_TURN = (
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1_0",
                "type": "function",
                "function": {"name": "lookup_note", "arguments": "{}"},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1_0", "content": "Friday"},
)


@pytest.fixture
def server() -> Iterator[ScriptedModelServer]:
    with ScriptedModelServer(lookup_then_answer) as running:
        yield running


@pytest.fixture
def client(server: ScriptedModelServer) -> ModelClient:
    return ModelClient(Settings(openai_base_url=server.base_url, model_max_retries=0))


def test_a_streamed_answer_is_recorded_as_the_unstreamed_one_with_its_usage(
    server: ScriptedModelServer, client: ModelClient
) -> None:
    pieces: list[str] = []
    streamed = client(chat(*TOOL_TURN), on_delta=pieces.append)
    whole = client(chat(*TOOL_TURN, stream=False))
    assert streamed == whole
    assert "".join(pieces) == REPLY and len(pieces) == -(-len(REPLY) // server.piece_chars)
    assert streamed["usage"]["prompt_tokens"] > 0  # from the last chunk (include_usage)
    assert server.requests[0]["stream_options"] == {"include_usage": True}
    assert server.streams == 1


def test_tool_calls_are_put_back_together_from_their_pieces(client: ModelClient) -> None:
    pieces: list[str] = []
    streamed = client(chat(), on_delta=pieces.append)
    assert streamed == client(chat(stream=False))
    assert streamed["message"]["tool_calls"][0]["function"]["arguments"] == (
        '{"name":"launch","detail":"all of it"}'
    )
    assert pieces == []  # a tool call's arguments are not text for the watchers


@pytest.mark.parametrize("kind", ["truncated", "html", "no-choices", "empty-message"])
def test_a_broken_stream_is_a_failed_call_that_is_tried_again(
    server: ScriptedModelServer, client: ModelClient, kind: str
) -> None:
    server.answer_next_malformed(kind)
    with pytest.raises(ModelUnavailable):
        client(chat())


def test_an_error_status_before_the_stream_is_the_same_as_unstreamed(
    server: ScriptedModelServer, client: ModelClient
) -> None:
    server.fail_next(1, 401)
    with pytest.raises(TurnFailed, match="refused the key"):
        client(chat())
    server.fail_next(1, 503)
    with pytest.raises(ModelUnavailable, match="503"):
        client(chat())


def test_responses_api_items_round_trip_and_reasoning_comes_back(
    server: ScriptedModelServer, client: ModelClient
) -> None:
    server.reasoning = True
    body = {"model": "gpt-test", "store": False, "input": [{"role": "user", "content": "When?"}]}
    first = client(body)
    kinds = [item["type"] for item in first["output"]]
    assert kinds == ["reasoning", "function_call"]
    call = first["output"][1]
    assert first["message"]["tool_calls"][0]["id"] == call["call_id"]
    output = {"type": "function_call_output", "call_id": call["call_id"], "output": "Friday"}
    second_body = {**body, "input": [*body["input"], *first["output"], output]}
    pieces: list[str] = []
    second = client({**second_body, "stream": True}, on_delta=pieces.append)
    assert "".join(pieces) == REPLY == second["message"]["content"]
    assert second == client(second_body)  # streamed or not, the same record
    sent = server.requests[1]["input"]
    assert sent[1]["encrypted_content"] == first["output"][0]["encrypted_content"]
    assert second["usage"]["prompt_tokens"] == second["usage"]["input_tokens"] > 0


def test_a_cursor_reads_back_what_it_wrote_and_refuses_anything_else() -> None:
    cursor = Cursor(3, "1733300000000-5", (4, 2))
    assert Cursor.parse(str(cursor)) == cursor
    assert Cursor.parse("2") == Cursor(2)
    assert Cursor.parse(str(Cursor())) == Cursor()
    for bad in ("x", "1/2/3", "1/abc-1/-", "-2/0-0/-", "1/0-0/4"):
        with pytest.raises(InvalidArgument):
            Cursor.parse(bad)


def test_a_watcher_never_splices_two_attempts_of_a_step() -> None:
    """Entries of attempt 1 of step 4, then attempt 2 (a new claim), then a late piece of
    attempt 1 (a worker that lost its claim still writing): attempt 1's text, abandoned,
    attempt 2's text from its start, and the late piece dropped."""
    from durable_agent.operate.live_tokens import _apply
    from durable_agent.operate.tokens import TokenEntry

    entries = [
        TokenEntry("1-0", 4, 1, "start", ""),
        TokenEntry("1-1", 4, 1, "delta", "Hel"),
        TokenEntry("2-0", 4, 2, "start", ""),
        TokenEntry("2-1", 4, 2, "delta", "Hello"),
        TokenEntry("2-2", 4, 1, "delta", "lo!"),  # late, from the old attempt
        TokenEntry("2-3", 4, 2, "delta", " there"),
        TokenEntry("2-4", 4, 2, "finish", ""),
        TokenEntry("3-0", 3, 2, "delta", "old step"),  # a step already given whole
    ]
    attempt = None
    given = []
    for entry in entries:
        events, attempt = _apply("t", entry, 4, attempt)
        given.extend((e.kind, e.attempt, e.text) for e in events)
    assert given == [
        ("token", 1, "Hel"),
        ("abandoned", 1, ""),
        ("token", 2, "Hello"),
        ("token", 2, " there"),
    ]
    # an attempt that failed (the call raised) says so itself
    failed, attempt = _apply("t", TokenEntry("4-0", 4, 2, "abandoned", ""), 4, (4, 2))
    assert [(e.kind, e.attempt) for e in failed] == [("abandoned", 2)] and attempt is None
