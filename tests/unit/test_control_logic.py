"""Unit tests of operating turns without services: ages, notes, the approval gate in the
runner (an in-memory journal and a fake decision store), and how the inbox tells what the
model did after an uncertain call."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from durable_agent import ConfigurationError, InvalidArgument, Settings, tool
from durable_agent.errors import ReplayDiverged, ToolDefinitionError, TurnParked
from durable_agent.journal.operator_store import Approval
from durable_agent.operate.approvals import Gate
from durable_agent.operate.cancel import check_note
from durable_agent.operate.retention import parse_age
from durable_agent.operate.uncertain import _effect
from durable_agent.settings import load_settings
from durable_agent.step.runner import StepRunner
from durable_agent.step.tools import ToolRegistry
from durable_agent.testing import MemoryJournal, make_step

RAN: list[str] = []
NOW = datetime(2026, 1, 1, tzinfo=UTC)


@tool(replay="never", name="ut_control_pay", approval="required")
def pay(amount: int, *, idempotency_key: str) -> str:
    """Pay (irreversible, needs a person's yes).

    Args:
        amount: In cents.
    """
    RAN.append(idempotency_key)
    return f"paid {amount}"


@tool(replay="safe", name="ut_control_look")
def look() -> str:
    """Read something."""
    return "ok"


class Guard:
    def check(self) -> None:
        pass

    def still_claimed(self) -> bool:
        return True


class Decisions:
    """Stands in for OperatorStore: the approval found, and what parking records."""

    def __init__(self, found: Approval | None) -> None:
        self.found = found
        self.parked: list[tuple[Any, ...]] = []

    def find_approval(self, turn_id: str, step: int) -> Approval | None:
        return self.found

    def park_for_approval(self, *args: Any) -> bool:
        self.parked.append(args)
        return True


def _approval(decision: str | None, amount: int = 5, reason: str | None = None) -> Approval:
    return Approval(
        "turn_u", 1, "ut_control_pay", {"amount": amount}, "k", NOW, decision, reason, "ada", NOW
    )


def _runner(decisions: Decisions) -> tuple[StepRunner, MemoryJournal]:
    journal = MemoryJournal("turn_u", 1, [])
    gate = Gate(decisions, "turn_u", 1, frozenset())  # type: ignore[arg-type]
    runner = StepRunner(journal, tools=ToolRegistry([pay, look]), guard=Guard(), approval_gate=gate)
    runner.next_step = 1
    return runner, journal


def _call(amount: int = 5) -> dict[str, Any]:
    arguments = f'{{"amount": {amount}}}'
    return {
        "id": "c1",
        "type": "function",
        "function": {"name": "ut_control_pay", "arguments": arguments},
    }


def test_an_undecided_call_parks_the_turn_and_runs_nothing() -> None:
    RAN.clear()
    decisions = Decisions(None)
    runner, journal = _runner(decisions)
    with pytest.raises(TurnParked, match="durable-agent approve turn_u 1"):
        runner.tool_step(_call())
    assert RAN == [] and journal.steps() == []
    [(turn_id, epoch, step, name, arguments, key)] = decisions.parked
    assert (turn_id, epoch, step, name, arguments) == (
        "turn_u",
        1,
        1,
        "ut_control_pay",
        {"amount": 5},
    )
    assert key and key.startswith("da-")


def test_a_denied_call_is_recorded_as_not_run_and_the_model_reads_why() -> None:
    RAN.clear()
    runner, journal = _runner(Decisions(_approval("denied", reason="too much")))
    text = runner.tool_step(_call())
    assert text == "Error: ut_control_pay was not run: the call was denied by ada: too much."
    assert RAN == []
    [step] = journal.steps()
    assert (step.status, step.output["denied"]) == ("done", True)


def test_an_approved_call_runs_once_with_the_decision_in_its_intent() -> None:
    RAN.clear()
    runner, journal = _runner(Decisions(_approval("approved")))
    assert runner.tool_step(_call()) == "paid 5"
    [step] = journal.steps()
    assert step.input["approval"] == {"decided_by": "ada", "decided_at": NOW.isoformat()}
    assert [step.input["idempotency_key"]] == RAN


def test_a_decision_about_other_arguments_is_a_divergence() -> None:
    runner, _ = _runner(Decisions(_approval("approved", amount=7)))
    with pytest.raises(ReplayDiverged, match="step 1"):
        runner.tool_step(_call(5))


def test_tools_without_approval_pass_the_gate_untouched() -> None:
    decisions = Decisions(None)
    runner, _ = _runner(decisions)
    call = {
        "id": "c2",
        "type": "function",
        "function": {"name": "ut_control_look", "arguments": "{}"},
    }
    assert runner.tool_step(call) == "ok"
    assert decisions.parked == []


def test_approval_label_is_checked_at_import() -> None:
    with pytest.raises(ToolDefinitionError, match="approval must be 'none' or 'required'"):
        tool(replay="never", approval="maybe")(lambda: None)  # type: ignore[arg-type]
    assert pay.approval == "required" and look.approval == "none"


@pytest.mark.parametrize(
    ("text", "seconds"), [("30d", 30 * 86_400), ("12h", 43_200), ("90m", 5400), ("2w", 1_209_600)]
)
def test_ages(text: str, seconds: float) -> None:
    assert parse_age(text) == seconds


@pytest.mark.parametrize("text", ["soon", "30", "0d", "-1d", "30 days", "1e9w"])
def test_bad_ages(text: str) -> None:
    with pytest.raises(InvalidArgument):
        parse_age(text)


def test_notes() -> None:
    assert check_note("note", None) is None and check_note("note", "  ") is None
    assert check_note("reason", "ok", required=True) == "ok"
    for bad in ("x" * 2001, "a\x00b", 5, "\ud800"):
        with pytest.raises(InvalidArgument):
            check_note("note", bad)
    with pytest.raises(InvalidArgument, match="reason is required"):
        check_note("reason", " ", required=True)


def test_hook_and_approval_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DURABLE_AGENT_UNCERTAIN_CALLBACK", "not a path")
    with pytest.raises(ConfigurationError, match="DURABLE_AGENT_UNCERTAIN_CALLBACK"):
        load_settings()
    monkeypatch.delenv("DURABLE_AGENT_UNCERTAIN_CALLBACK")
    settings = Settings(approval_required=" refund_order, send_email ,")
    assert settings.approval_tools == frozenset({"refund_order", "send_email"})


def _row(turn_status: str, output: dict[str, Any]) -> dict[str, Any]:
    return {
        "turn_id": "turn_u",
        "session_id": "s",
        "step": 1,
        "tool": "ut_control_pay",
        "input": {"arguments": {"amount": 5}, "idempotency_key": "k1"},
        "status": "done",
        "output": output,
        "created_at": NOW,
        "turn_status": turn_status,
        "verdict": None,
        "note": None,
        "resolved_by": None,
        "resolved_at": None,
    }


def test_the_inbox_says_what_the_model_did_next() -> None:
    later = [
        make_step(2, "model", "llm", {}, "safe", "done", {}),
        make_step(3, "tool", "ut_control_look", {"arguments": {}}, "safe", "done", {}),
        make_step(5, "tool", "ut_control_pay", {"idempotency_key": "k2"}, "never", "done", {}),
    ]
    raised = _effect(_row("done", {"error": True, "uncertain": True}), later)
    assert raised.how == "raised"
    assert (
        raised.next
        == "checked with ut_control_look (step 3), then retried with the new key (step 5)"
    )
    assert (raised.retry, raised.retry_step) == ("new key", 5)
    waiting = _effect(_row("running", {"uncertain": True}), later[:1])
    assert (waiting.how, waiting.next) == ("interrupted", "no retry yet; the turn is running")
