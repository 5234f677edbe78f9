"""Unit tests of the agent loop (run_agent, initial_messages) over an in-memory journal."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from durable_agent import StepLimitReached, TurnFailed, tool
from durable_agent.journal.codec import digest
from durable_agent.journal.records import Step
from durable_agent.step.chat import initial_messages, run_agent
from durable_agent.step.model import ModelSwitchedOff
from durable_agent.step.runner import StepRunner
from durable_agent.step.tools import ToolRegistry
from durable_agent.testing import MemoryJournal

RUNS: list[tuple[str, Any]] = []
"""Every tool run in a test, in order."""


@tool(replay="safe", name="ut_agent_lookup")
def lookup(name: str) -> str:
    """Look up a note.

    Args:
        name: The note's name.
    """
    RUNS.append(("ut_agent_lookup", name))
    return f"note {name}: launch on Friday"


@tool(replay="never", name="ut_agent_send")
def send(to: str, body: str, *, idempotency_key: str) -> str:
    """Send an email.

    Args:
        to: The recipient.
        body: The text.
    """
    RUNS.append(("ut_agent_send", (to, body, idempotency_key)))
    return f"sent to {to}"


TOOLS = ToolRegistry([lookup, send])


class MemoryStore(MemoryJournal):
    def __init__(self) -> None:
        super().__init__("turn_agent", 1)

    def journal(self) -> list[Step]:
        return self.steps()


class AlwaysClaimed:
    def check(self) -> None:
        pass

    def still_claimed(self) -> bool:
        return True


class ScriptedModel:
    """A model: look up a note and email it (two tool calls in one reply), then answer."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []

    def __call__(self, request: dict[str, Any]) -> dict[str, Any]:
        self.requests.append(json.loads(json.dumps(request)))
        last = request["messages"][-1]
        n = len(request["messages"])
        if last["role"] == "user":
            message = {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    _call(f"call_{n}_0", "ut_agent_lookup", {"name": "launch"}),
                    _call(f"call_{n}_1", "ut_agent_send", {"to": "ada@example.com", "body": "hi"}),
                ],
            }
        else:
            message = {"role": "assistant", "content": f"Done after {n} messages."}
        return {"message": message, "usage": {"total_tokens": n}}


class ToolForever:
    """A model that calls a tool on every request."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, request: dict[str, Any]) -> dict[str, Any]:
        self.calls += 1
        call = _call(f"c{self.calls}", "ut_agent_lookup", {"name": str(self.calls)})
        return {"message": {"role": "assistant", "content": None, "tool_calls": [call]}}


def _call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }


def runner_for(store: MemoryStore, journal: list[Step], max_steps: int = 64) -> StepRunner:
    store.rows = {row.step: row for row in journal}
    return StepRunner(
        store,
        tools=TOOLS,
        guard=AlwaysClaimed(),
        max_steps=max_steps,
    )


def conversation() -> list[dict[str, Any]]:
    return initial_messages(
        "Be brief.", [("earlier question", "earlier answer")], "Email the launch note to Ada"
    )


@pytest.fixture(autouse=True)
def clean_runs() -> Iterator[None]:
    RUNS.clear()
    yield
    RUNS.clear()


def test_initial_messages_orders_system_history_and_user() -> None:
    """System prompt, then each earlier (user, assistant) pair, then this turn's message."""
    assert conversation() == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "earlier question"},
        {"role": "assistant", "content": "earlier answer"},
        {"role": "user", "content": "Email the launch note to Ada"},
    ]


def test_initial_messages_without_system_prompt() -> None:
    """An empty system prompt adds no system message."""
    assert initial_messages("", [], "hi") == [{"role": "user", "content": "hi"}]


def test_loop_runs_model_tools_model_until_plain_reply() -> None:
    """model -> both tool calls -> model -> reply, numbered 0..3 in the journal."""
    store = MemoryStore()
    runner = runner_for(store, [])
    model = ScriptedModel()

    reply = run_agent(runner, model="m", tools=TOOLS, messages=conversation(), call_model=model)

    assert reply == "Done after 7 messages."
    assert len(model.requests) == 2
    assert [(r.step, r.kind, r.name, r.status) for r in store.journal()] == [
        (0, "model", "llm", "done"),
        (1, "tool", "ut_agent_lookup", "done"),
        (2, "tool", "ut_agent_send", "done"),
        (3, "model", "llm", "done"),
    ]
    assert [name for name, _ in RUNS] == ["ut_agent_lookup", "ut_agent_send"]
    assert runner.executed == [0, 1, 2, 3] and runner.read_back == []

    second = model.requests[1]
    assert second["tools"] == TOOLS.openai_schemas()
    assistant, tool1, tool2 = second["messages"][4:]
    assert [c["id"] for c in assistant["tool_calls"]] == ["call_4_0", "call_4_1"]
    assert tool1 == {
        "role": "tool",
        "tool_call_id": "call_4_0",
        "content": "note launch: launch on Friday",
    }
    assert tool2 == {
        "role": "tool",
        "tool_call_id": "call_4_1",
        "content": "sent to ada@example.com",
    }


def test_full_replay_needs_no_model_and_no_tools() -> None:
    """With the whole journal, a replay returns the same reply with zero model calls."""
    store = MemoryStore()
    first = run_agent(
        runner_for(store, []),
        model="m",
        tools=TOOLS,
        messages=conversation(),
        call_model=ScriptedModel(),
    )
    RUNS.clear()

    switched_off = ModelSwitchedOff()
    runner = runner_for(MemoryStore(), store.journal())
    again = run_agent(
        runner, model="m", tools=TOOLS, messages=conversation(), call_model=switched_off
    )

    assert again == first
    assert switched_off.calls == 0
    assert RUNS == []
    assert runner.read_back == [0, 1, 2, 3] and runner.executed == []
    assert runner.divergences == []


def test_partial_replay_sends_the_same_request_again() -> None:
    """Resuming after step 2 rebuilds a byte-identical request for the final model call."""
    store = MemoryStore()
    model = ScriptedModel()
    run_agent(
        runner_for(store, []), model="m", tools=TOOLS, messages=conversation(), call_model=model
    )
    partial = store.journal()[:3]  # the final model call was never recorded
    RUNS.clear()

    resumed_model = ScriptedModel()
    reply = run_agent(
        runner_for(MemoryStore(), partial),
        model="m",
        tools=TOOLS,
        messages=conversation(),
        call_model=resumed_model,
    )

    assert reply == "Done after 7 messages."
    assert RUNS == []  # the tools were read back
    assert len(resumed_model.requests) == 1
    assert digest(resumed_model.requests[0]) == digest(model.requests[1])


def test_replay_that_needs_the_model_fails_with_switched_off_model() -> None:
    """ModelSwitchedOff turns a missing model step into TurnFailed and counts the attempt."""
    store = MemoryStore()
    run_agent(
        runner_for(store, []),
        model="m",
        tools=TOOLS,
        messages=conversation(),
        call_model=ScriptedModel(),
    )
    switched_off = ModelSwitchedOff()

    with pytest.raises(TurnFailed, match="replay needed a model call"):
        run_agent(
            runner_for(MemoryStore(), store.journal()[:3]),
            model="m",
            tools=TOOLS,
            messages=conversation(),
            call_model=switched_off,
        )
    assert switched_off.calls == 1


def test_no_tools_means_no_tools_key() -> None:
    """With an empty registry the request has no 'tools' entry and a plain reply ends it."""
    seen: list[dict[str, Any]] = []

    def model(request: dict[str, Any]) -> dict[str, Any]:
        seen.append(request)
        return {"message": {"role": "assistant", "content": "plain"}}

    store = MemoryStore()
    runner = StepRunner(
        store,
        tools=ToolRegistry(),
        guard=AlwaysClaimed(),
    )
    reply = run_agent(
        runner, model="m", tools=ToolRegistry(), messages=conversation(), call_model=model
    )
    assert reply == "plain"
    assert "tools" not in seen[0]
    assert len(store.journal()) == 1


def test_endless_tool_calls_hit_the_step_cap() -> None:
    """A model that never stops calling tools ends in StepLimitReached at max_steps."""
    store = MemoryStore()
    model = ToolForever()

    with pytest.raises(StepLimitReached):
        run_agent(
            runner_for(store, [], max_steps=5),
            model="m",
            tools=TOOLS,
            messages=conversation(),
            call_model=model,
        )

    assert [r.step for r in store.journal()] == [0, 1, 2, 3, 4]
    assert model.calls == 3
