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


RESULTS: dict[str, Any] = {
    "circular": _circular(),
    "nul": "sent\x00with a NUL",
    "surrogate": "half a pair: \ud800",
    "nan": {"ratio": float("nan")},
    "object": {"handle": Unprintable()},
    "bytes": b"\x00\xff raw bytes",
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
