"""Unit tests of StepRunner, the replay-aware step table, against an in-memory journal.

The journal is the public in-memory one of ``durable_agent.testing``; it logs every write in
one event list shared with the tools and the guard, so a test can assert the order of
"intent committed", "tool ran" and "outcome recorded".
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any, cast

import pytest

from durable_agent import (
    LeaseLost,
    ReplayDiverged,
    StepLimitReached,
    current_call,
    still_claimed,
    tool,
)
from durable_agent.journal.records import Step
from durable_agent.step.runner import MODEL_STEP_NAME, POSSIBLY_RAN, StepRunner
from durable_agent.step.tools import ToolRegistry
from durable_agent.testing import MemoryJournal, Write, make_step

Event = tuple[Any, ...]
EVENTS: list[Event] = []
"""Everything that happened in a test, in order: store writes, guard checks, tool runs."""
FAILURES = {"ut_runner_charge": 0}
"""How many more times each flaky tool raises before it succeeds."""


class SimulatedCrash(Exception):
    """Stands for a worker dying at a point of the step (nothing after it happens)."""


@tool(replay="safe", name="ut_runner_lookup")
def lookup(key: str) -> str:
    """Read a value.

    Args:
        key: Which value.
    """
    EVENTS.append(("run", "ut_runner_lookup", key))
    return f"value of {key}"


@tool(replay="never", name="ut_runner_send")
def send(to: str, *, idempotency_key: str) -> str:
    """Send a message (irreversible).

    Args:
        to: The recipient.
    """
    EVENTS.append(("run", "ut_runner_send", to, idempotency_key))
    return f"sent to {to}"


@tool(replay="never", name="ut_runner_charge")
def charge(amount: int, *, idempotency_key: str) -> dict[str, Any]:
    """Charge a card; raises while FAILURES says so."""
    EVENTS.append(("run", "ut_runner_charge", amount, idempotency_key))
    if FAILURES["ut_runner_charge"] > 0:
        FAILURES["ut_runner_charge"] -= 1
        raise ConnectionError("reset by peer")
    return {"charged": amount}


@tool(replay="safe", name="ut_runner_boom")
def boom(reason: str) -> str:
    """Always fails."""
    EVENTS.append(("run", "ut_runner_boom", reason))
    raise ValueError(reason)


@tool(replay="safe", name="ut_runner_whoami")
def whoami() -> dict[str, Any]:
    """Report the call context the runner bound for this call."""
    EVENTS.append(("run", "ut_runner_whoami"))
    context = current_call()
    assert context is not None
    return {
        "turn_id": context.turn_id,
        "step": context.step,
        "tool": context.tool,
        "key": context.idempotency_key,
        "claimed": still_claimed(),
    }


TOOLS = ToolRegistry([lookup, send, charge, boom, whoami])


class FakeGuard:
    """The lease guard: check() raises LeaseLost once `lost` is set."""

    def __init__(self) -> None:
        self.lost = False

    def check(self) -> None:
        EVENTS.append(("check", self.lost))
        if self.lost:
            raise LeaseLost("the epoch moved on")

    def still_claimed(self) -> bool:
        return not self.lost


class FakeStore(MemoryJournal):
    """The in-memory journal of durable_agent.testing, logging every write in EVENTS."""

    def __init__(self, journal: list[Step] | None = None, turn_id: str = "turn_unit") -> None:
        super().__init__(turn_id, 7, journal or [], before_write=self._log)
        self.crash_on_outcome = False
        self.on_intent: Callable[[], None] | None = None

    def _log(self, write: Write) -> None:
        if write.op == "outcome":
            if self.crash_on_outcome:
                raise SimulatedCrash(f"died before recording step {write.step}")
            EVENTS.append(("record_outcome", write.step))
        else:
            EVENTS.append((f"insert_{write.op}", write.step, write.kind, write.name))
        if write.op == "intent" and self.on_intent is not None:
            self.on_intent()

    def journal(self) -> list[Step]:
        return self.steps()


def make_row(
    turn_id: str,
    step: int,
    kind: str,
    name: str,
    input: dict[str, Any],
    replay: str | None,
    status: str,
    output: Any,
    epoch: int = 1,
) -> Step:
    """A journal row as the real store would read it back (JSON round-tripped)."""
    return make_step(
        step,
        cast(Any, kind),
        name,
        input,
        cast(Any, replay),
        cast(Any, status),
        output,
        turn_id=turn_id,
        epoch=epoch,
    )


def make_runner(
    journal: list[Step] | None = None,
    *,
    turn_id: str = "turn_unit",
    tools: ToolRegistry = TOOLS,
    max_steps: int = 64,
    strict: bool = False,
) -> tuple[StepRunner, FakeStore, FakeGuard]:
    store, guard = FakeStore(journal, turn_id), FakeGuard()
    runner = StepRunner(
        store,
        tools=tools,
        guard=guard,
        max_steps=max_steps,
        strict=strict,
    )
    return runner, store, guard


def call(name: str, arguments: Any, call_id: str = "call_1") -> dict[str, Any]:
    """A tool call as the model sends it (arguments as a JSON string)."""
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": text}}


def request(*contents: str) -> dict[str, Any]:
    return {
        "model": "m",
        "messages": [{"role": "user", "content": c} for c in contents],
        "tools": TOOLS.openai_schemas(),
    }


class CountingModel:
    """A model callable that answers a fixed message and counts its calls."""

    def __init__(self, answer: str = "hello") -> None:
        self.calls = 0
        self.answer = answer

    def __call__(self, body: dict[str, Any]) -> dict[str, Any]:
        self.calls += 1
        EVENTS.append(("model_call", len(body["messages"])))
        return {"message": {"role": "assistant", "content": self.answer}, "usage": None}


def runs(name: str | None = None) -> list[Event]:
    return [e for e in EVENTS if e[0] == "run" and (name is None or e[1] == name)]


def writes() -> list[Event]:
    return [e for e in EVENTS if e[0] in ("insert_intent", "insert_done", "record_outcome")]


def journal_with_interrupted(
    name: str, arguments: dict[str, Any], turn_id: str = "turn_unit"
) -> list[Step]:
    """Run one tool call whose outcome never gets recorded; return the journal it left."""
    runner, store, _ = make_runner(turn_id=turn_id)
    store.crash_on_outcome = True
    with pytest.raises(SimulatedCrash):
        runner.tool_step(call(name, arguments))
    journal = store.journal()
    assert [(r.step, r.status, r.name) for r in journal] == [(0, "intent", name)]
    return journal


@pytest.fixture(autouse=True)
def clean_events() -> Iterator[None]:
    EVENTS.clear()
    FAILURES["ut_runner_charge"] = 0
    yield
    EVENTS.clear()


# -- row: none (a first run) -------------------------------------------------------------------


def test_first_run_commits_intent_before_tool_runs_and_outcome_after() -> None:
    """No row: guard check, intent committed, guard check, tool runs, outcome recorded."""
    runner, store, _ = make_runner()

    text = runner.tool_step(call("ut_runner_send", {"to": "ada@example.com"}))

    assert text == "sent to ada@example.com"
    kinds = [e[0] for e in EVENTS]
    assert kinds == ["check", "insert_intent", "check", "run", "record_outcome"]
    row = store.rows[0]
    assert (row.kind, row.name, row.replay, row.status) == (
        "tool",
        "ut_runner_send",
        "never",
        "done",
    )
    assert row.input["arguments"] == {"to": "ada@example.com"}
    assert row.input["tool_call_id"] == "call_1"
    assert row.output == {"content": "sent to ada@example.com"}
    assert runner.executed == [0] and runner.read_back == []


def test_first_run_model_step_commits_intent_before_the_call() -> None:
    """A model step commits its intent (kind model, name llm, replay safe) before calling."""
    runner, store, _ = make_runner()
    model = CountingModel("hi there")

    response = runner.model_step(request("hello"), model)

    assert response["message"]["content"] == "hi there"
    assert [e[0] for e in EVENTS] == ["check", "insert_intent", "model_call", "record_outcome"]
    row = store.rows[0]
    assert (row.kind, row.name, row.replay, row.status) == (
        "model",
        MODEL_STEP_NAME,
        "safe",
        "done",
    )
    assert row.input["messages"] == 1
    assert row.output == response


# -- row: done ---------------------------------------------------------------------------------


def test_done_tool_row_is_read_back_without_calling() -> None:
    """A done row returns its stored content; the tool is not run and nothing is written."""
    journal = [
        make_row(
            "turn_unit",
            0,
            "tool",
            "ut_runner_send",
            {"arguments": {"to": "ada@example.com"}, "idempotency_key": "k"},
            "never",
            "done",
            {"content": "sent earlier"},
        )
    ]
    runner, _, _ = make_runner(journal)

    text = runner.tool_step(call("ut_runner_send", {"to": "ada@example.com"}))

    assert text == "sent earlier"
    assert runs() == [] and writes() == []
    assert runner.read_back == [0] and runner.executed == []


def test_done_model_row_is_read_back_without_calling() -> None:
    """A replayed model step returns the recorded response and makes no model call."""
    first, store, _ = make_runner()
    recorded = first.model_step(request("hello"), CountingModel("recorded answer"))
    EVENTS.clear()

    replay, _, _ = make_runner(store.journal())
    model = CountingModel("a different answer")
    response = replay.model_step(request("hello"), model)

    assert response == recorded
    assert model.calls == 0
    assert writes() == []
    assert replay.read_back == [0] and replay.divergences == []


# -- row: intent -------------------------------------------------------------------------------


def test_model_intent_is_run_again() -> None:
    """An intent without outcome for a model call: the model is called again and recorded."""
    first, store, _ = make_runner()

    def dies(body: dict[str, Any]) -> dict[str, Any]:
        raise SimulatedCrash("died inside the model call")

    with pytest.raises(SimulatedCrash):
        first.model_step(request("hello"), dies)
    assert store.rows[0].status == "intent"
    EVENTS.clear()

    second, store2, _ = make_runner(store.journal())
    model = CountingModel("second try")
    response = second.model_step(request("hello"), model)

    assert model.calls == 1
    assert response["message"]["content"] == "second try"
    assert [e[0] for e in writes()] == ["record_outcome"]  # no second intent
    assert store2.rows[0].status == "done"
    assert second.executed == [0]


def test_safe_tool_intent_is_run_again_with_recorded_arguments() -> None:
    """An interrupted safe tool runs again, with the arguments of the recorded intent."""
    journal = journal_with_interrupted("ut_runner_lookup", {"key": "colour"})
    assert len(runs("ut_runner_lookup")) == 1
    EVENTS.clear()

    runner, store, _ = make_runner(journal)
    text = runner.tool_step(call("ut_runner_lookup", {"key": "colour"}))

    assert text == "value of colour"
    assert runs() == [("run", "ut_runner_lookup", "colour")]
    assert [e[0] for e in writes()] == ["record_outcome"]
    assert store.rows[0].output == {"content": "value of colour"}


def test_never_tool_intent_is_not_run_again() -> None:
    """An interrupted never tool is not run; the result says it may or may not have happened,
    with the original arguments and the idempotency key the first attempt used."""
    journal = journal_with_interrupted("ut_runner_send", {"to": "ada@example.com"})
    first_key = runs("ut_runner_send")[0][3]
    EVENTS.clear()

    runner, store, _ = make_runner(journal)
    text = runner.tool_step(call("ut_runner_send", {"to": "ada@example.com"}))

    assert runs() == []
    assert POSSIBLY_RAN in text
    assert "ut_runner_send" in text
    assert '{"to":"ada@example.com"}' in text
    assert first_key in text
    assert [e[0] for e in writes()] == ["record_outcome"]
    assert store.rows[0].output["uncertain"] is True
    assert store.rows[0].output["content"] == text
    assert runner.executed == [0]


def test_never_intent_stays_uncertain_after_relabelling_to_safe() -> None:
    """A row recorded as never is not re-run even if the tool is now labelled safe."""
    journal = journal_with_interrupted("ut_runner_send", {"to": "bob@example.com"})
    EVENTS.clear()

    runner, _, _ = make_runner(journal, tools=TOOLS.relabelled({"ut_runner_send": "safe"}))
    text = runner.tool_step(call("ut_runner_send", {"to": "bob@example.com"}))

    assert runs() == []
    assert POSSIBLY_RAN in text


def test_never_intent_stays_uncertain_after_the_tool_is_removed() -> None:
    """The interrupted never tool is gone from the registry (a deploy removed it): the call may
    still have happened, so the model is told so, not that the tool does not exist."""
    journal = journal_with_interrupted("ut_runner_send", {"to": "eve@example.com"})
    EVENTS.clear()

    runner, _, _ = make_runner(journal, tools=ToolRegistry())
    text = runner.tool_step(call("ut_runner_send", {"to": "eve@example.com"}))

    assert runs() == []
    assert POSSIBLY_RAN in text
    assert "no tool named" not in text


# -- divergence --------------------------------------------------------------------------------


def test_tool_name_mismatch_raises_replay_diverged() -> None:
    """Another tool at a recorded step fails, naming the turn, the step and both names."""
    first, store, _ = make_runner(turn_id="turn_div")
    first.tool_step(call("ut_runner_lookup", {"key": "a"}))
    first.tool_step(call("ut_runner_lookup", {"key": "b"}))
    EVENTS.clear()

    runner, _, _ = make_runner(store.journal(), turn_id="turn_div")
    runner.tool_step(call("ut_runner_lookup", {"key": "a"}))
    with pytest.raises(ReplayDiverged) as caught:
        runner.tool_step(call("ut_runner_send", {"to": "x@example.com"}))

    error = caught.value
    assert (error.turn_id, error.step) == ("turn_div", 1)
    message = str(error)
    assert "turn_div" in message and "step 1" in message
    assert "ut_runner_lookup" in message and "ut_runner_send" in message
    assert runs() == [] and writes() == []


def test_model_call_where_a_tool_was_recorded_diverges() -> None:
    """A model call at a step that recorded a tool call diverges, naming both."""
    first, store, _ = make_runner()
    first.tool_step(call("ut_runner_lookup", {"key": "a"}))

    runner, _, _ = make_runner(store.journal())
    model = CountingModel()
    with pytest.raises(ReplayDiverged) as caught:
        runner.model_step(request("hello"), model)

    assert "tool ut_runner_lookup" in str(caught.value)
    assert f"model {MODEL_STEP_NAME}" in str(caught.value)
    assert model.calls == 0


def test_strict_replay_of_a_changed_conversation_raises() -> None:
    """strict=True: a recorded model step whose messages digest differs raises ReplayDiverged."""
    first, store, _ = make_runner(turn_id="turn_strict")
    first.model_step(request("hello"), CountingModel())

    strict, _, _ = make_runner(store.journal(), turn_id="turn_strict", strict=True)
    model = CountingModel()
    with pytest.raises(ReplayDiverged) as caught:
        strict.model_step(request("hello", "and something new"), model)
    assert "turn_strict" in str(caught.value) and "step 0" in str(caught.value)
    assert model.calls == 0


def test_lenient_replay_of_a_changed_conversation_uses_the_record() -> None:
    """strict=False: the divergence is noted and the recorded reply is used."""
    first, store, _ = make_runner()
    recorded = first.model_step(request("hello"), CountingModel("recorded"))

    lenient, _, _ = make_runner(store.journal())
    model = CountingModel("new")
    response = lenient.model_step(request("hello", "and something new"), model)

    assert response == recorded and model.calls == 0
    assert [d.step for d in lenient.divergences] == [0]
    assert "2 now" in lenient.divergences[0].detail


# -- tool failures and bad model output ---------------------------------------------------------


def test_safe_tool_exception_is_recorded_as_error_result() -> None:
    """A raising safe tool gives a recorded error result the model reads; the turn goes on."""
    runner, store, _ = make_runner()

    text = runner.tool_step(call("ut_runner_boom", {"reason": "disk full"}))

    assert text == "Error: ut_runner_boom raised ValueError: disk full"
    assert store.rows[0].output == {"content": text, "error": True}
    assert POSSIBLY_RAN not in text
    assert [e[0] for e in writes()] == ["insert_intent", "record_outcome"]


def test_never_tool_exception_is_recorded_as_uncertain() -> None:
    """A raising never tool's result says the effect is uncertain and gives the key."""
    FAILURES["ut_runner_charge"] = 1
    runner, store, _ = make_runner()

    text = runner.tool_step(call("ut_runner_charge", {"amount": 500}))

    key = runs("ut_runner_charge")[0][3]
    assert text.startswith("Error: ut_runner_charge raised ConnectionError: reset by peer")
    assert POSSIBLY_RAN in text and key in text
    assert store.rows[0].output["uncertain"] is True
    assert store.rows[0].output["error"] is True


@pytest.mark.parametrize(
    ("name", "arguments", "expected"),
    [
        ("ut_runner_missing", {"key": "a"}, "there is no tool named 'ut_runner_missing'"),
        ("ut_runner_lookup", '{"key": "a"', "not valid JSON"),
        ("ut_runner_lookup", "[1, 2]", "must be a JSON object"),
        ("ut_runner_lookup", {"key": 5}, "invalid arguments for ut_runner_lookup: key"),
        ("ut_runner_lookup", {}, "invalid arguments for ut_runner_lookup: key: Field required"),
        ("ut_runner_send", {"to": "a@b.c", "idempotency_key": "mine"}, "invalid arguments"),
    ],
)
def test_bad_tool_calls_are_recorded_and_not_run(name: str, arguments: Any, expected: str) -> None:
    """Unknown tools and bad arguments become one done row explaining the error."""
    runner, store, _ = make_runner()

    text = runner.tool_step(call(name, arguments))

    assert expected in text and text.startswith("Error:")
    assert runs() == []
    assert [e[0] for e in writes()] == ["insert_done"]
    row = store.rows[0]
    assert (row.status, row.name) == ("done", name)
    assert row.output == {"content": text, "error": True}
    assert runner.executed == [0]


def test_turn_continues_after_a_bad_call() -> None:
    """After a refused call the next step number is used for the next call."""
    runner, store, _ = make_runner()
    runner.tool_step(call("ut_runner_missing", {}))
    runner.tool_step(call("ut_runner_lookup", {"key": "k"}))
    assert [(r.step, r.name) for r in store.journal()] == [
        (0, "ut_runner_missing"),
        (1, "ut_runner_lookup"),
    ]


# -- step cap ----------------------------------------------------------------------------------


def test_step_cap_raises_step_limit_reached() -> None:
    """The call after max_steps raises StepLimitReached before writing or running anything."""
    runner, store, _ = make_runner(max_steps=2, turn_id="turn_cap")
    runner.tool_step(call("ut_runner_lookup", {"key": "a"}))
    runner.model_step(request("x"), CountingModel())
    EVENTS.clear()

    with pytest.raises(StepLimitReached) as caught:
        runner.tool_step(call("ut_runner_lookup", {"key": "b"}))

    assert "turn_cap" in str(caught.value) and "2 steps" in str(caught.value)
    assert EVENTS == []
    assert sorted(store.rows) == [0, 1]


# -- idempotency keys --------------------------------------------------------------------------


def test_idempotency_key_is_stable_per_turn_and_step() -> None:
    """Same (turn, step) gives the same key across runs; another step or turn another key."""
    keys: list[str] = []
    for turn_id, lookups_first in (("turn_k1", 0), ("turn_k1", 0), ("turn_k1", 1), ("turn_k2", 0)):
        runner, store, _ = make_runner(turn_id=turn_id)
        for _ in range(lookups_first):
            runner.tool_step(call("ut_runner_lookup", {"key": "x"}))
        runner.tool_step(call("ut_runner_send", {"to": "ada@example.com"}))
        key = runs("ut_runner_send")[-1][3]
        assert store.rows[lookups_first].input["idempotency_key"] == key
        keys.append(key)

    assert keys[0] == keys[1]
    assert len({keys[0], keys[2], keys[3]}) == 3
    assert all(k.startswith("da-") for k in keys)


def test_retry_after_uncertain_replay_reuses_the_key() -> None:
    """After an interrupted never call, the model's retry with the same arguments gets the
    interrupted call's key; a call with other arguments gets a fresh one."""
    journal = journal_with_interrupted("ut_runner_send", {"to": "ada@example.com"})
    first_key = runs("ut_runner_send")[0][3]
    EVENTS.clear()

    runner, store, _ = make_runner(journal)
    runner.tool_step(call("ut_runner_send", {"to": "ada@example.com"}))  # uncertain, not run
    runner.tool_step(call("ut_runner_send", {"to": "ada@example.com"}, "call_2"))
    runner.tool_step(call("ut_runner_send", {"to": "bob@example.com"}, "call_3"))

    sent = runs("ut_runner_send")
    assert sent[0] == ("run", "ut_runner_send", "ada@example.com", first_key)
    assert sent[1][2] == "bob@example.com" and sent[1][3] != first_key
    assert store.rows[1].input["idempotency_key"] == first_key


def test_retry_after_never_tool_exception_reuses_the_key() -> None:
    """A never tool that raised (uncertain) and is retried with the same args reuses its key."""
    FAILURES["ut_runner_charge"] = 1
    runner, _, _ = make_runner()

    runner.tool_step(call("ut_runner_charge", {"amount": 500}))
    runner.tool_step(call("ut_runner_charge", {"amount": 500}, "call_2"))
    runner.tool_step(call("ut_runner_charge", {"amount": 700}, "call_3"))

    keys = [e[3] for e in runs("ut_runner_charge")]
    assert keys[0] == keys[1]
    assert keys[2] != keys[0]


def test_uncertain_row_read_back_still_lends_its_key() -> None:
    """Replaying a journal whose uncertain result is done keeps the key for a later retry."""
    journal = journal_with_interrupted("ut_runner_send", {"to": "ada@example.com"})
    first_key = runs("ut_runner_send")[0][3]
    second, store, _ = make_runner(journal)
    second.tool_step(call("ut_runner_send", {"to": "ada@example.com"}))  # now done, uncertain
    EVENTS.clear()

    third, _, _ = make_runner(store.journal())
    third.tool_step(call("ut_runner_send", {"to": "ada@example.com"}))  # read back
    third.tool_step(call("ut_runner_send", {"to": "ada@example.com"}, "call_2"))

    assert runs("ut_runner_send") == [("run", "ut_runner_send", "ada@example.com", first_key)]


# -- the lease guard ---------------------------------------------------------------------------


def test_lost_lease_before_the_intent_writes_nothing() -> None:
    """A guard that already lost the turn stops the step before any write or run."""
    runner, store, guard = make_runner()
    guard.lost = True

    with pytest.raises(LeaseLost):
        runner.tool_step(call("ut_runner_send", {"to": "ada@example.com"}))

    assert runs() == [] and writes() == [] and store.rows == {}


def test_lease_lost_after_intent_stops_never_tool_before_it_runs() -> None:
    """The claim is lost while the intent is committed: the never tool does not run."""
    runner, store, guard = make_runner()

    def lose() -> None:
        guard.lost = True

    store.on_intent = lose

    with pytest.raises(LeaseLost):
        runner.tool_step(call("ut_runner_send", {"to": "ada@example.com"}))

    assert runs() == []
    assert [e[0] for e in writes()] == ["insert_intent"]
    assert store.rows[0].status == "intent"


def test_lease_lost_before_recording_uncertain_result() -> None:
    """Replaying an interrupted never call with a lost claim records nothing."""
    journal = journal_with_interrupted("ut_runner_send", {"to": "ada@example.com"})
    EVENTS.clear()
    runner, store, guard = make_runner(journal)
    guard.lost = True

    with pytest.raises(LeaseLost):
        runner.tool_step(call("ut_runner_send", {"to": "ada@example.com"}))

    assert runs() == [] and writes() == []
    assert store.rows[0].status == "intent"


# -- what a tool sees --------------------------------------------------------------------------


def test_tool_sees_its_call_context() -> None:
    """Inside a tool, current_call() names the turn, step, tool and key; outside a tool there
    is no current call."""
    runner, store, _ = make_runner(turn_id="turn_ctx")
    runner.tool_step(call("ut_runner_lookup", {"key": "a"}))

    seen = json.loads(runner.tool_step(call("ut_runner_whoami", {})))

    assert seen == {
        "turn_id": "turn_ctx",
        "step": 1,
        "tool": "ut_runner_whoami",
        "key": store.rows[1].input["idempotency_key"],
        "claimed": True,
    }
    assert current_call() is None
    assert still_claimed() is True


def test_tool_still_claimed_asks_the_guard() -> None:
    """still_claimed() inside a tool turns False once the guard has lost the turn."""
    runner, store, guard = make_runner()

    def lose() -> None:
        guard.lost = True

    store.on_intent = lose  # a safe tool is not re-checked after its intent, so it runs

    seen = json.loads(runner.tool_step(call("ut_runner_whoami", {})))

    assert seen["claimed"] is False


@tool(replay="never", name="ut_runner_typed")
def typed(flag: bool, n: int, ratio: float = 0.5, *, idempotency_key: str) -> str:
    """A tool whose arguments need converting.

    Args:
        flag: A switch.
        n: A count.
        ratio: A fraction.
    """
    EVENTS.append(("run", "ut_runner_typed", flag, n, ratio))
    return f"{flag!r} {n!r} {ratio!r}"


def test_tools_get_the_converted_values_and_the_journal_records_them() -> None:
    """The model sends "false" and "42": the tool gets False and 42 (not the truthy string),
    and the intent records what the tool received, defaults included."""
    runner, store, _ = make_runner(tools=ToolRegistry([typed]))

    text = runner.tool_step(call("ut_runner_typed", {"flag": "false", "n": "42"}))

    assert runs("ut_runner_typed") == [("run", "ut_runner_typed", False, 42, 0.5)]
    assert text == "False 42 0.5"
    assert store.rows[0].input["arguments"] == {"flag": False, "n": 42, "ratio": 0.5}

    # an interrupted safe replay or a resume reads the recorded values back unchanged
    EVENTS.clear()
    again, _, _ = make_runner(store.steps(), tools=ToolRegistry([typed]))
    assert again.tool_step(call("ut_runner_typed", {"flag": "false", "n": "42"})) == text
    assert runs() == []
