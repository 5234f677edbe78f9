"""Whatever a tool or the model returns is recorded (sanitized, with the reason) on a real
Postgres, and the turn goes on: a never tool that acted must never be left at 'intent'."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from durable_agent import tool
from durable_agent.delivery.turn_worker import TurnWorker
from durable_agent.runtime import Runtime
from durable_agent.settings import Settings
from durable_agent.step.tools import ToolRegistry
from durable_agent.testing import ScriptedModelServer, call_tool, reply

effects: list[str] = []


class Unprintable:
    def __str__(self) -> str:
        raise RuntimeError("no string for you")


def _circular() -> dict[str, Any]:
    loop: dict[str, Any] = {"sent": True}
    loop["self"] = loop
    return loop


def _nested(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


RESULTS: dict[str, Any] = {
    "circular": _circular(),
    "nul": "sent\x00with a NUL",
    "surrogate": "half a pair: \ud800",
    "nan": {"ratio": float("nan")},
    "object": {"handle": Unprintable()},
    "bytes": b"\x00\xff raw bytes",
    "huge_int": 10**5000,  # more digits than Python writes as JSON
    "huge_int_inside": {"refunded": True, "balance": -(10**5000)},
    "deep": _nested(3000),
}


@tool(replay="never", name="ut_unstorable_send")
def send(kind: str, *, idempotency_key: str) -> Any:
    """Send something and return what cannot be stored as it is.

    Args:
        kind: Which unstorable result to return.
    """
    effects.append(kind)
    return RESULTS[kind]


@tool(replay="never", name="ut_unstorable_raise")
def raise_nul(*, idempotency_key: str) -> str:
    """Act, then raise an error whose text holds a NUL."""
    effects.append("raise")
    raise RuntimeError("failed after acting\x00!")


def _policy(kind: str, *, final: str = "done") -> Any:
    def policy(body: dict[str, Any]) -> dict[str, Any]:
        if body["messages"][-1]["role"] == "user":
            if kind == "raise":
                return call_tool("ut_unstorable_raise", {})
            return call_tool("ut_unstorable_send", {"kind": kind})
        return reply(final)

    return policy


@pytest.fixture(autouse=True)
def _clear() -> Iterator[None]:
    effects.clear()
    yield
    effects.clear()


def _run(settings: Settings, policy: Any) -> tuple[Runtime, str, Any]:
    with ScriptedModelServer(policy) as model:
        runtime = Runtime(
            settings.model_copy(update={"openai_base_url": model.base_url}),
            tools=ToolRegistry([send, raise_nul]),
        )
        turn = runtime.journal.create_turn("s", "go")
        delivery = TurnWorker(runtime).handle(turn.turn_id)
    return runtime, turn.turn_id, delivery


@pytest.mark.parametrize("kind", sorted(RESULTS))
def test_a_never_tool_result_that_cannot_be_stored_is_recorded_sanitized(
    settings: Settings, kind: str
) -> None:
    runtime, turn_id, delivery = _run(settings, _policy(kind))
    try:
        assert delivery.outcome == "done", delivery.detail
        steps = runtime.journal.load_journal(turn_id)
        assert [(s.name, s.status) for s in steps] == [
            ("llm", "done"),
            ("ut_unstorable_send", "done"),
            ("llm", "done"),
        ]
        assert effects == [kind]  # acted once; never left at intent
        output = steps[1].output
        assert output["sanitized"], output
        assert "\x00" not in output["content"]
        assert runtime.get_turn(turn_id).reply == "done"
    finally:
        runtime.close()


def test_an_error_text_with_a_nul_is_recorded(settings: Settings) -> None:
    runtime, turn_id, delivery = _run(settings, _policy("raise"))
    try:
        assert delivery.outcome == "done", delivery.detail
        output = runtime.journal.load_journal(turn_id)[1].output
        assert output["uncertain"] is True and output["error"] is True
        assert "failed after acting\ufffd!" in output["content"]
        assert effects == ["raise"]
    finally:
        runtime.close()


def test_model_text_with_a_nul_is_recorded_and_replied(settings: Settings) -> None:
    runtime, turn_id, delivery = _run(settings, _policy("nul", final="all\x00done"))
    try:
        assert delivery.outcome == "done", delivery.detail
        assert runtime.get_turn(turn_id).reply == "all\ufffddone"
        last = runtime.journal.load_journal(turn_id)[-1]
        assert last.output["message"]["content"] == "all\ufffddone"
        assert last.output["sanitized"] == ["NUL characters replaced with U+FFFD"]
    finally:
        runtime.close()


def _bad_arguments_policy(arguments: str) -> Any:
    def policy(body: dict[str, Any]) -> dict[str, Any]:
        last = body["messages"][-1]
        if last["role"] == "user":
            return call_tool("ut_unstorable_send", {})  # replaced below: arguments as given
        return reply(f"the tool said: {last['content'][:60]}")

    def with_raw_arguments(body: dict[str, Any]) -> dict[str, Any]:
        answer = policy(body)
        for call in answer.get("tool_calls") or []:
            call["function"]["arguments"] = arguments
        return answer

    return with_raw_arguments


@pytest.mark.parametrize(
    ("arguments", "says"),
    [
        ('{"kind": ' + "7" * 5000 + "}", "a number too long to read"),
        ('{"kind": ' + "[" * 3000 + "]" * 3000 + "}", "nested too deeply"),
        ('{"kind": ' + "[" * 300 + "]" * 300 + "}", "nested more than 200 levels"),
    ],
    ids=["5000-digit-integer", "nested-3000-deep", "nested-300-deep"],
)
def test_arguments_python_cannot_read_are_an_error_result_and_the_turn_goes_on(
    settings: Settings, arguments: str, says: str
) -> None:
    """Arguments holding a 5,000-digit integer or nested 3,000 deep: the tool does not run,
    the model reads an error result, and the turn ends done."""
    runtime, turn_id, delivery = _run(settings, _bad_arguments_policy(arguments))
    try:
        assert delivery.outcome == "done", delivery.detail
        steps = runtime.journal.load_journal(turn_id)
        assert [(s.name, s.status) for s in steps] == [
            ("llm", "done"),
            ("ut_unstorable_send", "done"),
            ("llm", "done"),
        ]
        output = steps[1].output
        assert output["error"] is True and says in output["content"], output
        assert effects == []  # the tool never ran
        assert runtime.get_turn(turn_id).reply == f"the tool said: {output['content'][:60]}"
    finally:
        runtime.close()
