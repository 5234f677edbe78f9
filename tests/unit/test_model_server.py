"""Tests for the scripted OpenAI-compatible model server, through the real `openai` SDK."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from durable_agent.testing import ScriptedModelServer, call_tool, call_tools, reply, tool_call
from durable_agent.testing.__main__ import ServerProcess
from durable_agent.testing.model_server import request_digest

USER: Any = [{"role": "user", "content": "Email the note 'launch' to ada@example.com"}]
TOOLS: Any = [{"type": "function", "function": {"name": "lookup_note", "parameters": {}}}]


def two_calls(body: dict[str, Any]) -> dict[str, Any]:
    """Call two tools on the first request of a turn, then answer."""
    if body["messages"][-1]["role"] == "tool":
        return reply("all done")
    return call_tools(tool_call("lookup_note", {"name": "launch"}), tool_call("ping", {}))


def http(method: str, url: str, body: bytes | None = None) -> tuple[int, bytes]:
    """Send one request and return (status, body) without raising on HTTP errors."""
    request = urllib.request.Request(url, data=body, method=method)
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        with error:
            return error.code, error.read()


@pytest.fixture
def server() -> Iterator[ScriptedModelServer]:
    with ScriptedModelServer(two_calls) as running:
        yield running


@pytest.fixture
def client(server: ScriptedModelServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=server.base_url, api_key="test", max_retries=0) as sdk:
        yield sdk


def test_sdk_gets_tool_calls_with_parsed_arguments(
    server: ScriptedModelServer, client: openai.OpenAI
) -> None:
    completion = client.chat.completions.create(model="gpt-test", messages=USER, tools=TOOLS)

    choice = completion.choices[0]
    assert completion.model == "gpt-test"
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls
    assert calls is not None
    assert [c.id for c in calls] == ["call_1_0", "call_1_1"]
    assert [c.function.name for c in calls] == ["lookup_note", "ping"]  # type: ignore[union-attr]
    assert json.loads(calls[0].function.arguments) == {"name": "launch"}  # type: ignore[union-attr]
    assert completion.usage is not None and completion.usage.total_tokens > 0
    assert server.requests[0]["tools"] == TOOLS


def test_final_reply_has_no_tool_calls(client: openai.OpenAI) -> None:
    messages: Any = [
        *USER,
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1_0", "type": "function",
             "function": {"name": "lookup_note", "arguments": "{}"}},
        ]},
        {"role": "tool", "tool_call_id": "call_1_0", "content": "Ship it"},
    ]  # fmt: skip

    choice = client.chat.completions.create(model="m", messages=messages).choices[0]

    assert choice.finish_reason == "stop"
    assert choice.message.content == "all done"
    assert choice.message.tool_calls is None


def test_identical_requests_get_identical_bytes_and_count_as_repeated(
    server: ScriptedModelServer,
) -> None:
    url = f"{server.base_url}/chat/completions"
    body = json.dumps({"model": "m", "messages": USER, "tools": TOOLS}).encode()
    reordered = json.dumps({"tools": TOOLS, "temperature": 0, "messages": USER, "model": "m"})
    other = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})

    first = http("POST", url, body)
    second = http("POST", url, body)
    third = http("POST", url, reordered.encode())
    http("POST", url, other.encode())

    assert first[0] == 200
    assert first == second == third
    assert server.request_count == 4
    assert server.repeated_requests() == 2
    digests = server.request_digests()
    assert digests[0] == digests[1] == digests[2] != digests[3]
    assert digests[0] == request_digest(json.loads(body))

    server.reset_counts()
    assert (server.request_count, server.repeated_requests(), server.requests) == (0, 0, [])


@pytest.mark.parametrize(
    ("status", "error"), [(500, openai.InternalServerError), (429, openai.RateLimitError)]
)
def test_injected_failures_are_retried_by_the_sdk(
    server: ScriptedModelServer, status: int, error: type[Exception]
) -> None:
    server.fail_next(2, status, retry_after=0.01)
    with openai.OpenAI(base_url=server.base_url, api_key="test", max_retries=3) as sdk:
        completion = sdk.chat.completions.create(model="m", messages=USER)
    assert completion.choices[0].finish_reason == "tool_calls"
    assert server.request_count == 3
    assert server.repeated_requests() == 2

    server.fail_next(1, status)
    with (
        openai.OpenAI(base_url=server.base_url, api_key="test", max_retries=0) as sdk,
        pytest.raises(error) as raised,
    ):
        sdk.chat.completions.create(model="m", messages=USER)
    assert "Injected failure" in str(raised.value)


def test_policy_errors_are_500s_the_sdk_does_not_retry() -> None:
    def broken(body: dict[str, Any]) -> dict[str, Any]:
        raise RuntimeError("policy bug")

    with (
        ScriptedModelServer(broken) as server,
        openai.OpenAI(base_url=server.base_url, api_key="test", max_retries=3) as sdk,
    ):
        with pytest.raises(openai.InternalServerError, match="policy bug"):
            sdk.chat.completions.create(model="m", messages=USER)
        assert server.request_count == 1


def test_hold_blocks_requests_until_release(
    server: ScriptedModelServer, client: openai.OpenAI
) -> None:
    results: list[str] = []

    def call() -> None:
        completion = client.chat.completions.create(model="m", messages=USER)
        results.append(completion.choices[0].finish_reason)

    server.hold()
    worker = threading.Thread(target=call)
    worker.start()
    try:
        server.wait_for_waiting(1, timeout=10)
        assert server.request_count == 1
        assert results == []
        assert json.loads(http("GET", f"{server.url}/_stats")[1])["waiting"] == 1
    finally:
        server.release()
        worker.join(timeout=10)
    assert not worker.is_alive()
    assert results == ["tool_calls"]


def test_wait_for_waiting_times_out(server: ScriptedModelServer) -> None:
    server.hold()
    with pytest.raises(TimeoutError, match="expected 1 held request"):
        server.wait_for_waiting(1, timeout=0.05)


def test_stop_wakes_held_requests() -> None:
    server = ScriptedModelServer(two_calls).start()
    statuses: list[int] = []
    url = f"{server.base_url}/chat/completions"
    body = json.dumps({"model": "m", "messages": USER}).encode()
    worker = threading.Thread(target=lambda: statuses.append(http("POST", url, body)[0]))
    server.hold()
    worker.start()
    try:
        server.wait_for_waiting(1, timeout=10)
    finally:
        server.stop()
        worker.join(timeout=10)
    assert not worker.is_alive()
    assert not server.running


def test_delay_seconds_delays_the_answer(
    server: ScriptedModelServer, client: openai.OpenAI
) -> None:
    server.delay_seconds = 0.2
    started = time.monotonic()
    client.chat.completions.create(model="m", messages=USER)
    assert time.monotonic() - started >= 0.2


def test_invalid_requests_get_openai_errors(server: ScriptedModelServer) -> None:
    url = f"{server.base_url}/chat/completions"
    for payload in (b"not json", b"[]", json.dumps({"model": "m"}).encode()):
        status, body = http("POST", url, payload)
        assert status == 400
        assert json.loads(body)["error"]["type"] == "invalid_request_error"
    status, body = http("GET", f"{server.base_url}/nope")
    assert status == 404
    assert "message" in json.loads(body)["error"]
    assert server.request_count == 0


def test_models_endpoint(client: openai.OpenAI) -> None:
    assert [model.id for model in client.models.list()] == ["scripted-model"]


def test_stats_and_control_endpoints(server: ScriptedModelServer, client: openai.OpenAI) -> None:
    client.chat.completions.create(model="m", messages=USER)
    client.chat.completions.create(model="m", messages=USER)

    stats = json.loads(http("GET", f"{server.url}/_stats")[1])
    assert stats["requests"] == 2
    assert stats["repeated"] == 1
    assert stats["digests"] == server.request_digests()

    http("POST", f"{server.url}/_fail", json.dumps({"n": 1, "status": 503}).encode())
    with pytest.raises(openai.InternalServerError):
        client.chat.completions.create(model="m", messages=USER)

    assert http("POST", f"{server.url}/_reset")[0] == 200
    assert json.loads(http("GET", f"{server.url}/_stats")[1])["requests"] == 0


def test_helpers_build_openai_messages() -> None:
    assert reply("hi") == {"role": "assistant", "content": "hi"}
    message = call_tool("send_email", {"to": "a@b.c"}, call_id="fixed")
    assert message["tool_calls"] == [
        {
            "id": "fixed",
            "type": "function",
            "function": {"name": "send_email", "arguments": '{"to":"a@b.c"}'},
        }
    ]
    with pytest.raises(ValueError):
        call_tools()


def test_restart_keeps_the_port() -> None:
    server = ScriptedModelServer(two_calls)
    with server:
        port = server.port
    with server:
        assert server.port == port
        assert http("GET", f"{server.base_url}/models")[0] == 200


def test_command_line_model_server() -> None:
    proc = ServerProcess("model-server", "--policy", "email")
    try:
        proc.start()
        base_url = proc.info["base_url"]
        with openai.OpenAI(base_url=base_url, api_key="test", max_retries=0) as sdk:
            completion = sdk.chat.completions.create(model="m", messages=USER)
        calls = completion.choices[0].message.tool_calls
        assert calls is not None
        assert calls[0].function.name == "lookup_note"  # type: ignore[union-attr]
        stats = json.loads(http("GET", base_url.removesuffix("/v1") + "/_stats")[1])
        assert stats["requests"] == 1
        assert proc.stop() == 0
    finally:
        proc.kill()


def _test_kit(*args: str) -> Any:
    import subprocess
    import sys

    return subprocess.run(
        [sys.executable, "-m", "durable_agent.testing", *args],
        capture_output=True,
        text=True,
        timeout=30,
        stdin=subprocess.DEVNULL,
    )


def _one_error_line(result: Any) -> str:
    assert "Traceback" not in result.stderr + result.stdout, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), result.stderr
    return str(lines[0])


def test_a_port_in_use_is_one_line_and_exit_1() -> None:
    """The model server (and the inbox) on a port another socket holds: one line, exit 1."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        for args in (
            ("model-server", "--policy", "email", "--port", port),
            ("inbox", "--smtp-port", port),
            ("payments", "--port", port),
        ):
            result = _test_kit(*args)
            assert result.returncode == 1, result
            line = _one_error_line(result)
            assert f"port {port}" in line and "in use" in line, line


@pytest.mark.parametrize(
    ("policy", "says"),
    [
        ("os:getcwd", "cannot be called with one argument"),
        ("json:dumps", "not an assistant message"),
        ("os:sep", "not a function"),
    ],
)
def test_a_policy_that_is_not_a_policy_is_refused_at_start(policy: str, says: str) -> None:
    """Before: the server started and answered 500 to every request. Now: one line, exit 2,
    and no server (the run ends well within the timeout)."""
    result = _test_kit("model-server", "--policy", policy)
    assert result.returncode == 2, result
    line = _one_error_line(result)
    assert f"policy {policy!r} is not a policy" in line and says in line, line
    assert result.stdout == ""


@pytest.mark.parametrize(
    "args",
    [
        ["model-server", "--policy", "email", "--port", "-1"],
        ["payments", "--order", "A-1"],
        ["inbox", "--api-port", "x"],
        ["model-server"],
        ["nosuch"],
    ],
)
def test_test_kit_usage_mistakes_are_one_line(args: list[str]) -> None:
    result = _test_kit(*args)
    assert result.returncode == 2, result
    assert _one_error_line(result).startswith("error: python -m durable_agent.testing")


def test_a_scenario_policy_that_is_not_a_policy_is_a_configuration_error() -> None:
    from durable_agent.errors import ConfigurationError
    from durable_agent.testing import Scenario

    scenario = Scenario(message="hi", effects={"x": lambda: 0}, policy="json:dumps")
    with pytest.raises(ConfigurationError, match="not an assistant message"):
        scenario.resolved_policy()
