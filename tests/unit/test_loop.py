"""Unit tests of the public loop API (TurnContext) over an in-memory journal: a loop of
one's own gets numbered, journalled, read-back calls, like the built-in one."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from durable_agent import InvalidArgument, TurnContext, TurnFailed, tool
from durable_agent.step.loop import TurnInput, run_loop
from durable_agent.step.runner import POSSIBLY_RAN, StepRunner
from durable_agent.step.tools import ToolRegistry
from durable_agent.testing import ClaimHeld, MemoryJournal, make_step

EFFECTS: list[str] = []


@tool(replay="safe", name="ut_loop_read")
def read(key: str) -> str:
    """Read a value.

    Args:
        key: The key.
    """
    return f"value of {key}"


@tool(replay="never", name="ut_loop_write")
def write(key: str, value: str, *, idempotency_key: str) -> str:
    """Write a value.

    Args:
        key: The key.
        value: The value.
    """
    EFFECTS.append(f"{key}={value}")
    return "written"


TOOLS = ToolRegistry([read, write])


class Model:
    """Answers every request with the text 'plan' or 'reply'; records the requests."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []

    def __call__(self, request: dict[str, Any]) -> dict[str, Any]:
        self.requests.append(json.loads(json.dumps(request)))
        text = "reply" if len(self.requests) > 1 else "plan"
        return {"message": {"role": "assistant", "content": text}}


def read_then_write(ctx: TurnContext) -> str:
    """Not the built-in shape: ask once, call two tools directly, ask again."""
    ctx.model({"messages": ctx.messages(), "tools": []})
    value = ctx.tool("ut_loop_read", {"key": "a"})
    ctx.tool("ut_loop_write", {"key": "b", "value": value})
    answer = ctx.model({"messages": [*ctx.messages(), {"role": "user", "content": "report"}]})
    return str(answer["message"]["content"])


def context(journal: MemoryJournal, model: Model, **agent: Any) -> TurnContext:
    runner = StepRunner(journal, tools=TOOLS, guard=ClaimHeld())
    return TurnContext(
        runner,
        call_model=model,
        turn=TurnInput(journal.turn_id, "s1", "do it", [("earlier", "answer")]),
        model=agent.pop("model", "m-1"),
        instructions="Be careful.",
        tools=TOOLS,
        **agent,
    )


@pytest.fixture(autouse=True)
def clean() -> Iterator[None]:
    EFFECTS.clear()
    yield
    EFFECTS.clear()


def test_own_loop_steps_are_numbered_and_journalled() -> None:
    """model, tool, tool, model: steps 0..3 in the order the loop makes them."""
    journal = MemoryJournal()
    model = Model()

    reply = run_loop(read_then_write, context(journal, model, parameters={"temperature": 0}))

    assert reply == "reply"
    assert [(s.step, s.kind, s.name, s.status) for s in journal.steps()] == [
        (0, "model", "llm", "done"),
        (1, "tool", "ut_loop_read", "done"),
        (2, "tool", "ut_loop_write", "done"),
        (3, "model", "llm", "done"),
    ]
    assert EFFECTS == ["b=value of a"]
    first, second = model.requests
    assert first["model"] == "m-1" and first["temperature"] == 0
    assert "tools" not in first  # "tools": [] sends none
    assert second["tools"] == TOOLS.openai_schemas()  # absent: the agent's tools
    assert first["messages"] == [
        {"role": "system", "content": "Be careful."},
        {"role": "user", "content": "earlier"},
        {"role": "assistant", "content": "answer"},
        {"role": "user", "content": "do it"},
    ]
    assert journal.steps()[2].input["tool_call_id"] == "call_2"
    assert journal.steps()[2].input["idempotency_key"].startswith("da-")


def test_own_loop_replays_from_the_journal_without_calls() -> None:
    """A second delivery with the whole journal reads every step back: no model, no tool."""
    journal = MemoryJournal()
    first = run_loop(read_then_write, context(journal, Model()))
    EFFECTS.clear()

    again_model = Model()
    again = MemoryJournal(steps=journal.steps())
    reply = run_loop(read_then_write, context(again, again_model))

    assert reply == first
    assert again_model.requests == [] and EFFECTS == [] and again.writes == []


def test_interrupted_never_tool_of_own_loop_is_not_run_again() -> None:
    """An intent of the never tool without an outcome: 'may or may not have happened'."""
    journal = MemoryJournal()
    run_loop(read_then_write, context(journal, Model()))
    steps = journal.steps()
    intent = make_step(
        2, "tool", "ut_loop_write", steps[2].input, "never", "intent", turn_id=journal.turn_id
    )
    resumed = MemoryJournal(steps=[*steps[:2], intent])
    EFFECTS.clear()

    seen: list[str] = []

    def loop(ctx: TurnContext) -> str:
        ctx.model({"messages": ctx.messages(), "tools": []})
        ctx.tool("ut_loop_read", {"key": "a"})
        seen.append(ctx.tool("ut_loop_write", {"key": "b", "value": "value of a"}))
        return "ok"

    run_loop(loop, context(resumed, Model()))

    assert EFFECTS == []
    assert POSSIBLY_RAN in seen[0]
    assert resumed.steps()[2].status == "done" and resumed.steps()[2].output["uncertain"]


def test_unknown_tool_is_an_error_result_and_runs_nothing() -> None:
    """A tool the agent does not have: an error text for the loop, recorded as done."""
    journal = MemoryJournal()

    def loop(ctx: TurnContext) -> str:
        return ctx.tool("no_such_tool", {"x": 1})

    text = run_loop(loop, context(journal, Model()))

    assert text.startswith("Error: there is no tool named 'no_such_tool'")
    assert [(s.step, s.name, s.status) for s in journal.steps()] == [(0, "no_such_tool", "done")]


def test_loop_must_return_text_and_model_needs_messages() -> None:
    """A loop's answer is the reply text; ctx.model() needs a messages list."""
    with pytest.raises(TurnFailed, match="returned int"):
        run_loop(lambda ctx: 42, context(MemoryJournal(), Model()))  # type: ignore[arg-type,return-value]
    with pytest.raises(InvalidArgument, match="messages"):
        context(MemoryJournal(), Model()).model({"prompt": "hi"})
