"""Wait steps in the runner with a Parking double, and the waiting tools (no database)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from durable_agent import Agent, InvalidArgument, agent_tool, event_tool, wait_seconds
from durable_agent.errors import TurnParked
from durable_agent.settings import Settings
from durable_agent.step.agents import bind
from durable_agent.step.chat import chat_completions
from durable_agent.step.runner import StepRunner
from durable_agent.step.tools import ToolRegistry
from durable_agent.step.wait_steps import check_seconds, event_spec, sleep_spec
from durable_agent.testing import ClaimHeld, MemoryJournal


class FakeParking:
    """Parks until ``ready`` is set; records what it was asked."""

    def __init__(self) -> None:
        self.ready: dict[str, Any] | None = None
        self.prepared: list[dict[str, Any]] = []
        self.parks = 0

    def prepare(self, step: int, spec: dict[str, Any]) -> dict[str, Any]:
        self.prepared.append(spec)
        return {**spec, "until": "2030-01-01T00:00:00+00:00"}

    def wait(self, step: int, intent: dict[str, Any], parked: Callable[[], None]) -> dict[str, Any]:
        if self.ready is None:
            self.parks += 1
            parked()
            raise TurnParked("parked")
        return self.ready


def _runner(journal: MemoryJournal, parking: FakeParking, tools: ToolRegistry) -> StepRunner:
    return StepRunner(journal, tools=tools, guard=ClaimHeld(), parking=parking)


def test_a_sleep_writes_its_intent_once_and_parks_until_its_outcome_comes() -> None:
    journal, parking = MemoryJournal("t"), FakeParking()
    with pytest.raises(TurnParked):
        _runner(journal, parking, ToolRegistry()).wait_step("sleep", sleep_spec(5))
    # delivered again: the intent is read, not written again (the due time is kept)
    with pytest.raises(TurnParked):
        _runner(journal, parking, ToolRegistry()).wait_step("sleep", sleep_spec(5))
    assert len(parking.prepared) == 1 and parking.parks == 2
    parking.ready = {"content": "Waited 5 seconds.", "slept": True}
    assert _runner(journal, parking, ToolRegistry()).wait_step("sleep", sleep_spec(5))["slept"]
    parking.ready = None  # a done wait is read back: nothing is asked
    again = _runner(journal, parking, ToolRegistry())
    assert again.wait_step("sleep", sleep_spec(5))["slept"] and again.read_back == [0]
    [step] = journal.steps()
    assert (step.kind, step.name, step.status, step.input["until"]) == (
        "wait",
        "sleep",
        "done",
        "2030-01-01T00:00:00+00:00",
    )


def test_a_waiting_tool_is_a_wait_step_and_bad_arguments_run_nothing() -> None:
    journal, parking = MemoryJournal("t"), FakeParking()
    tools = ToolRegistry([wait_seconds])
    runner = _runner(journal, parking, tools)
    bad = {"id": "c1", "type": "function",
           "function": {"name": "wait_seconds", "arguments": '{"seconds": "soon"}'}}  # fmt: skip
    assert runner.tool_step(bad).startswith("Error: invalid arguments for wait_seconds")
    good = {"id": "c2", "type": "function",
            "function": {"name": "wait_seconds", "arguments": '{"seconds": 600}'}}  # fmt: skip
    with pytest.raises(TurnParked):
        runner.tool_step(good)
    steps = journal.steps()
    assert [(s.kind, s.name, s.status) for s in steps] == [
        ("wait", "wait_seconds", "done"),
        ("wait", "wait_seconds", "intent"),
    ]
    assert steps[1].input["seconds"] == 600 and steps[1].input["tool_call_id"] == "c2"


def test_waits_check_their_arguments() -> None:
    with pytest.raises(InvalidArgument):
        sleep_spec(-1)
    with pytest.raises(InvalidArgument):
        check_seconds("timeout", float("nan"))
    with pytest.raises(InvalidArgument):
        event_spec("", 10)
    assert event_spec("paid", None)["timeout"] is None


def test_agents_as_tools_and_event_tools() -> None:
    research = Agent("research", loop=lambda ctx: "facts", tools=[])
    support = Agent("support", tools=[research, event_tool("payment_settled", timeout=60)])
    bound = bind(support, Settings(), ToolRegistry(), chat_completions)
    assert bound.tools.names() == ["research", "wait_for_payment_settled"]
    ask = bound.tools.get("research")
    assert ask is not None and ask.wait is not None
    assert ask.wait({"message": "why?"}) == {
        "wait": "child",
        "agent": "research",
        "message": "why?",
    }
    assert agent_tool("x.y").name == "x_y"
    schema = bound.tools.get("wait_for_payment_settled")
    assert schema is not None and "timeout_seconds" in str(schema.openai_schema())
