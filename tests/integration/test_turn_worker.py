"""TurnWorker in-process on a real Postgres, a scripted model server and a real SMTP inbox.

Crashes are simulated in-process: a Faults subclass raises a BaseException at the same named
point where ``CRASH_AT`` would ``os._exit``; the turn runs in its own thread so that the
worker that resumes it (in the test's thread) is a different lease owner.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest
from inprocess import CrashAt, SimulatedCrash

from durable_agent.delivery.turn_worker import Delivery, TurnWorker
from durable_agent.journal import Claim, JournalStore, Leases
from durable_agent.journal.records import Step
from durable_agent.operate.spend import spend_of_turns
from durable_agent.runtime import Runtime
from durable_agent.settings import Settings
from durable_agent.step.faults import CrashPoint
from durable_agent.step.tools import ToolRegistry, load_tools
from durable_agent.testing import (
    ScriptedModelServer,
    SmtpInbox,
    call_tool,
    call_tools,
    email_policy,
    reply,
    tool_call,
)

if TYPE_CHECKING:
    from conftest import DatabaseClock

MESSAGE = "Please email the note launch to ada@example.com"
REPLY = "Done: the note 'launch' was sent to ada@example.com."
SUBJECT = "Note: launch"
EMAIL_TURN = ["llm", "lookup_note", "llm", "send_email", "llm"]


@pytest.fixture
def tools() -> ToolRegistry:
    return load_tools(["durable_agent_examples.email_tools"])


@pytest.fixture
def worker_settings(settings: Settings, model_server: ScriptedModelServer) -> Settings:
    return settings.model_copy(update={"openai_base_url": model_server.base_url})


@pytest.fixture
def make_worker(
    worker_settings: Settings, tools: ToolRegistry, inbox: SmtpInbox
) -> Iterator[Callable[..., TurnWorker]]:
    """TurnWorker factory: settings overrides as keywords, optional crash point."""
    runtimes: list[Runtime] = []

    def make(crash: tuple[int, CrashPoint] | None = None, **overrides: Any) -> TurnWorker:
        runtime = Runtime(worker_settings.model_copy(update=overrides), tools=tools)
        runtimes.append(runtime)
        return runtime.build_turn_worker(faults=CrashAt(crash))

    yield make
    for runtime in runtimes:
        runtime.close()


def _journal(store: JournalStore, turn_id: str) -> list[Step]:
    return store.load_journal(turn_id)


def _names(steps: list[Step]) -> list[str]:
    return [s.name for s in steps]


def _handle_when_free(worker: TurnWorker, turn_id: str, clock: DatabaseClock) -> Delivery:
    """Deliver the turn; while it is refused (a lease or a deferral still runs), move the
    database's clock on and deliver it again."""
    for _ in range(10):
        delivery = worker.handle(turn_id)
        if delivery.outcome != "refused":
            return delivery
        clock.advance(10.0)
    raise AssertionError(f"turn {turn_id} still refused: {delivery.detail}")


def _crash_in_thread(worker: TurnWorker, turn_id: str) -> None:
    """Run the turn on another thread (another lease owner) and expect it to 'crash'."""
    caught: list[BaseException] = []

    def run() -> None:
        try:
            worker.handle(turn_id)
        except BaseException as error:
            caught.append(error)

    thread = threading.Thread(target=run, name="doomed-worker")
    thread.start()
    thread.join(timeout=60)
    assert not thread.is_alive()
    assert len(caught) == 1 and isinstance(caught[0], SimulatedCrash), caught


def _header(inbox: SmtpInbox, index: int, name: str) -> str | None:
    headers = inbox.messages[index].headers
    return next((v for k, v in headers.items() if k.lower() == name.lower()), None)


def test_handle_runs_email_turn_to_done(
    make_worker: Callable[..., TurnWorker],
    store: JournalStore,
    inbox: SmtpInbox,
    model_server: ScriptedModelServer,
) -> None:
    """One delivery runs the turn: reply recorded, 5 journal rows, exactly one email."""
    turn = store.create_turn("s", MESSAGE)

    delivery = make_worker().handle(turn.turn_id)

    assert (delivery.outcome, delivery.detail) == ("done", REPLY)
    assert delivery.executed == [0, 1, 2, 3, 4] and delivery.read_back == []
    done = store.get_turn(turn.turn_id)
    assert (done.status, done.reply, done.error, done.lease_owner) == ("done", REPLY, None, None)
    steps = _journal(store, turn.turn_id)
    assert [s.step for s in steps] == [0, 1, 2, 3, 4]
    assert [s.kind for s in steps] == ["model", "tool", "model", "tool", "model"]
    assert _names(steps) == EMAIL_TURN
    assert [s.replay for s in steps] == ["safe", "safe", "safe", "never", "safe"]
    assert {(s.status, s.epoch) for s in steps} == {("done", 1)}
    assert steps[3].input["arguments"]["to"] == "ada@example.com"
    assert steps[4].output["message"]["content"] == REPLY
    assert inbox.count == 1
    assert inbox.messages[0].subject == SUBJECT
    assert _header(inbox, 0, "X-Idempotency-Key") == steps[3].input["idempotency_key"]
    assert model_server.request_count == 3 and model_server.repeated_requests() == 0


def test_handle_on_finished_turn_does_nothing(
    make_worker: Callable[..., TurnWorker],
    store: JournalStore,
    leases: Leases,
    inbox: SmtpInbox,
    model_server: ScriptedModelServer,
) -> None:
    """A duplicate delivery of a done turn is refused: no model request, no email, no write."""
    turn = store.create_turn("s", MESSAGE)
    worker = make_worker()
    assert worker.handle(turn.turn_id).outcome == "done"
    requests, journal = model_server.request_count, _journal(store, turn.turn_id)

    again = worker.handle(turn.turn_id)

    assert again.outcome == "refused"
    assert "already done" in again.detail
    refusal = leases.claim(turn.turn_id, "someone", 30.0)
    assert not isinstance(refusal, Claim) and refusal.reason == "finished"
    assert model_server.request_count == requests
    assert inbox.count == 1
    assert _journal(store, turn.turn_id) == journal
    assert store.get_turn(turn.turn_id).lease_epoch == 1


def test_resume_after_crash_inside_never_tool_does_not_send_again(
    make_worker: Callable[..., TurnWorker],
    store: JournalStore,
    inbox: SmtpInbox,
    model_server: ScriptedModelServer,
    clock: DatabaseClock,
) -> None:
    """send_email ran, then the worker died: the resumed turn reads back the finished steps,
    records 'may or may not have happened' instead of sending, and checks the outbox."""
    turn = store.create_turn("s", MESSAGE)
    _crash_in_thread(make_worker(crash=(3, "after_run"), lease_seconds=0.5), turn.turn_id)
    assert inbox.count == 1
    before = _journal(store, turn.turn_id)
    assert [(s.name, s.status) for s in before] == [
        ("llm", "done"),
        ("lookup_note", "done"),
        ("llm", "done"),
        ("send_email", "intent"),
    ]
    assert model_server.request_count == 2

    delivery = _handle_when_free(make_worker(), turn.turn_id, clock)

    assert (delivery.outcome, delivery.detail) == ("done", REPLY)
    assert delivery.read_back == [0, 1, 2]
    assert delivery.executed == [3, 4, 5, 6]
    assert inbox.count == 1  # the interrupted send was not run again
    steps = _journal(store, turn.turn_id)
    assert _names(steps) == [*EMAIL_TURN[:4], "llm", "list_sent_emails", "llm"]
    assert all(s.status == "done" for s in steps)
    assert [s.epoch for s in steps] == [1, 1, 1, 2, 2, 2, 2]
    assert "may or may not have happened" in steps[3].output["content"]
    assert steps[3].output["uncertain"] is True
    assert SUBJECT in steps[5].output["content"]
    # the model paid only for the new steps: 2 before the crash, 2 after, none repeated
    assert model_server.request_count == 4
    assert model_server.repeated_requests() == 0
    final = store.get_turn(turn.turn_id)
    assert (final.status, final.attempts, final.crashes) == ("done", 2, 1)


def test_resume_after_crash_before_never_tool_retries_with_the_same_key(
    make_worker: Callable[..., TurnWorker],
    store: JournalStore,
    inbox: SmtpInbox,
    model_server: ScriptedModelServer,
    clock: DatabaseClock,
) -> None:
    """The worker died with send_email's intent committed but before sending: the resumed turn
    does not send blindly; the outbox is empty, so the model sends once, reusing the key."""
    turn = store.create_turn("s", MESSAGE)
    _crash_in_thread(make_worker(crash=(3, "before_run"), lease_seconds=0.5), turn.turn_id)
    assert inbox.count == 0
    interrupted_key = _journal(store, turn.turn_id)[3].input["idempotency_key"]

    delivery = _handle_when_free(make_worker(), turn.turn_id, clock)

    assert (delivery.outcome, delivery.detail) == ("done", REPLY)
    steps = _journal(store, turn.turn_id)
    assert _names(steps) == [*EMAIL_TURN[:4], "llm", "list_sent_emails", "llm", "send_email", "llm"]
    assert "may or may not have happened" in steps[3].output["content"]
    assert steps[5].output["content"] == "[]"
    assert steps[7].input["idempotency_key"] == interrupted_key
    assert inbox.count == 1
    assert _header(inbox, 0, "X-Idempotency-Key") == interrupted_key
    assert model_server.repeated_requests() == 0


def test_resume_reruns_an_interrupted_safe_tool(
    make_worker: Callable[..., TurnWorker],
    store: JournalStore,
    inbox: SmtpInbox,
    model_server: ScriptedModelServer,
    clock: DatabaseClock,
) -> None:
    """A safe tool whose outcome was lost (lookup_note) simply runs again on resume."""
    turn = store.create_turn("s", MESSAGE)
    _crash_in_thread(make_worker(crash=(1, "after_run"), lease_seconds=0.5), turn.turn_id)
    assert [s.status for s in _journal(store, turn.turn_id)] == ["done", "intent"]

    delivery = _handle_when_free(make_worker(), turn.turn_id, clock)

    assert (delivery.outcome, delivery.detail) == ("done", REPLY)
    assert delivery.read_back == [0] and delivery.executed == [1, 2, 3, 4]
    steps = _journal(store, turn.turn_id)
    assert _names(steps) == EMAIL_TURN
    assert steps[1].output["content"].startswith("The launch is on Friday")
    assert inbox.count == 1
    assert model_server.request_count == 3 and model_server.repeated_requests() == 0


def test_model_failing_with_500_defers_the_turn_and_keeps_its_journal(
    make_worker: Callable[..., TurnWorker],
    store: JournalStore,
    inbox: SmtpInbox,
    model_server: ScriptedModelServer,
    clock: DatabaseClock,
) -> None:
    """500 on every model request: the delivery is deferred, the turn is queued again with the
    error, and its journal is kept; once the model is back the turn resumes and finishes."""
    turn = store.create_turn("s", MESSAGE)
    model_server.fail_next(2, 500, retry_after=0.01)  # the first call and the SDK's one retry
    worker = make_worker()

    delivery = worker.handle(turn.turn_id)

    assert delivery.outcome == "deferred", delivery
    assert "500" in delivery.detail
    assert model_server.request_count == 2
    queued = store.get_turn(turn.turn_id)
    assert (queued.status, queued.lease_owner) == ("queued", None)
    assert queued.error is not None and "500" in queued.error and "will retry" in queued.error
    assert queued.not_before is not None and queued.not_before > queued.updated_at
    assert [(s.name, s.status) for s in _journal(store, turn.turn_id)] == [("llm", "intent")]

    resumed = _handle_when_free(worker, turn.turn_id, clock)

    assert (resumed.outcome, resumed.detail) == ("done", REPLY)
    assert [s.status for s in _journal(store, turn.turn_id)] == ["done"] * 5
    assert inbox.count == 1
    # the spend ledger: the failed call is noted as not billed, so its rerun is no crash waste
    spend = spend_of_turns(store, {}, [turn.turn_id])[turn.turn_id]
    assert (spend.billed.calls, spend.crash_waste.calls, spend.failed_calls) == (3, 0, 1)


def test_model_failing_mid_turn_keeps_finished_steps(
    make_worker: Callable[..., TurnWorker],
    store: JournalStore,
    inbox: SmtpInbox,
    model_server: ScriptedModelServer,
    clock: DatabaseClock,
) -> None:
    """The model breaks after the email went out: the deferred turn keeps the done steps and
    the resumed delivery reads them back, so the email is not sent twice."""
    broken = threading.Event()
    broken.set()

    def policy(body: dict[str, Any]) -> dict[str, Any]:
        sent = any(
            m.get("role") == "tool" and str(m.get("content", "")).startswith("Sent")
            for m in body["messages"]
        )
        if sent and broken.is_set():
            raise RuntimeError("model backend down")  # the server answers 500
        return email_policy(body)

    model_server.policy = policy
    turn = store.create_turn("s", MESSAGE)
    worker = make_worker()

    delivery = worker.handle(turn.turn_id)

    assert delivery.outcome == "deferred", delivery
    assert store.get_turn(turn.turn_id).status == "queued"
    steps = _journal(store, turn.turn_id)
    assert [(s.name, s.status) for s in steps] == [
        ("llm", "done"),
        ("lookup_note", "done"),
        ("llm", "done"),
        ("send_email", "done"),
        ("llm", "intent"),
    ]
    assert inbox.count == 1

    broken.clear()
    resumed = _handle_when_free(worker, turn.turn_id, clock)

    assert (resumed.outcome, resumed.detail) == ("done", REPLY)
    assert resumed.read_back == [0, 1, 2, 3] and resumed.executed == [4]
    assert inbox.count == 1


def test_unknown_tool_and_bad_arguments_become_recorded_error_results(
    make_worker: Callable[..., TurnWorker],
    store: JournalStore,
    model_server: ScriptedModelServer,
) -> None:
    """An unknown tool, arguments that are not JSON, and arguments failing the schema are each
    recorded as an error result the model reads; the turn goes on to a reply."""

    def policy(body: dict[str, Any]) -> dict[str, Any]:
        results = [m["content"] for m in body["messages"] if m.get("role") == "tool"]
        if not results:
            not_json = {"type": "function", "function": {"name": "lookup_note", "arguments": "{no"}}
            return call_tools(
                tool_call("no_such_tool", {"x": 1}), not_json, tool_call("lookup_note")
            )
        return reply("saw: " + " | ".join(results))

    model_server.policy = policy
    turn = store.create_turn("s", "do something odd")

    delivery = make_worker().handle(turn.turn_id)

    assert delivery.outcome == "done", delivery
    steps = _journal(store, turn.turn_id)
    assert [(s.kind, s.name, s.replay) for s in steps] == [
        ("model", "llm", "safe"),
        ("tool", "no_such_tool", None),
        ("tool", "lookup_note", "safe"),
        ("tool", "lookup_note", "safe"),
        ("model", "llm", "safe"),
    ]
    assert all(s.status == "done" for s in steps)
    assert all(s.output["error"] is True for s in steps[1:4])
    assert "no tool named 'no_such_tool'" in steps[1].output["content"]
    assert "not valid JSON" in steps[2].output["content"]
    assert steps[2].input["arguments"] == "{no"
    assert "invalid arguments for lookup_note" in steps[3].output["content"]
    assert "name" in steps[3].output["content"]
    for step in steps[1:4]:
        assert step.output["content"] in delivery.detail
    assert store.get_turn(turn.turn_id).reply == delivery.detail
    assert model_server.request_count == 2


def test_step_cap_fails_the_turn_naming_the_limit(
    make_worker: Callable[..., TurnWorker],
    store: JournalStore,
    model_server: ScriptedModelServer,
) -> None:
    """A model that never stops calling tools hits max_steps: the turn fails with the reason."""
    model_server.policy = lambda body: call_tool("lookup_note", {"name": "launch"})
    turn = store.create_turn("s", "loop forever")

    delivery = make_worker(max_steps=3).handle(turn.turn_id)

    assert delivery.outcome == "failed"
    assert "limit of 3 steps" in delivery.detail and "DURABLE_AGENT_MAX_STEPS" in delivery.detail
    failed = store.get_turn(turn.turn_id)
    assert (failed.status, failed.error, failed.reply) == ("failed", delivery.detail, None)
    assert _names(_journal(store, turn.turn_id)) == ["llm", "lookup_note", "llm"]
    assert model_server.request_count == 2


def test_turn_at_crash_cap_is_failed_on_next_claim(
    make_worker: Callable[..., TurnWorker],
    store: JournalStore,
    leases: Leases,
    model_server: ScriptedModelServer,
    clock: DatabaseClock,
) -> None:
    """A turn whose worker died max_crashes times is failed with the reason, not run again."""
    turn = store.create_turn("s", MESSAGE)
    dead = leases.claim(turn.turn_id, "dead-worker", 0.5)
    assert isinstance(dead, Claim)
    store.insert_intent(turn.turn_id, dead.epoch, 0, "model", "llm", {"messages": 2}, "safe")

    delivery = _handle_when_free(make_worker(max_crashes=1), turn.turn_id, clock)

    assert delivery.outcome == "failed"
    assert "died 1 times" in delivery.detail
    assert "DURABLE_AGENT_MAX_CRASHES=1" in delivery.detail
    assert "step 0 (model llm)" in delivery.detail
    failed = store.get_turn(turn.turn_id)
    assert (failed.status, failed.error, failed.crashes) == ("failed", delivery.detail, 1)
    assert model_server.request_count == 0
    assert [s.status for s in _journal(store, turn.turn_id)] == ["intent"]


def test_turn_resumed_under_a_changed_agent_is_reported(
    make_worker: Callable[..., TurnWorker],
    store: JournalStore,
    inbox: SmtpInbox,
    model_server: ScriptedModelServer,
    clock: DatabaseClock,
) -> None:
    """A deploy changed the agent mid-turn (its instructions and model): the turn keeps the
    digest it started with, finishes under the new agent, and says what changed."""
    turn = store.create_turn("s", MESSAGE)
    first = make_worker(crash=(3, "after_run"), lease_seconds=0.5)
    _crash_in_thread(first, turn.turn_id)
    started = store.get_turn(turn.turn_id)
    assert started.agent == "default"
    assert started.agent_digest == first.agents["default"].digest
    assert started.agent_changes is None

    later = make_worker(system_prompt="A new prompt.", model="model-v2")
    delivery = _handle_when_free(later, turn.turn_id, clock)

    assert delivery.outcome == "done" and inbox.count == 1
    done = store.get_turn(turn.turn_id)
    assert done.agent_digest == started.agent_digest != later.agents["default"].digest
    assert done.agent_changes == "model gpt-4o-mini -> model-v2; instructions changed"


def test_turn_of_an_agent_nobody_here_defines_waits_without_a_crash(
    make_worker: Callable[..., TurnWorker], store: JournalStore, settings: Settings
) -> None:
    """A turn of an unknown agent is given back with the reason, to be sent again later;
    it is not run and does not count as a crash."""
    turn = store.create_turn("s", MESSAGE, queue=settings.queue, agent="ghost")

    delivery = make_worker().handle(turn.turn_id)

    assert delivery.outcome == "deferred"
    assert "no agent named 'ghost'" in delivery.detail
    waiting = store.get_turn(turn.turn_id)
    assert (waiting.status, waiting.crashes, waiting.lease_owner) == ("queued", 0, None)
    assert waiting.not_before is not None and "ghost" in (waiting.error or "")
    assert store.load_journal(turn.turn_id) == []


def test_start_turn_names_an_agent(settings: Settings) -> None:
    """start_turn(agent=...) records the agent; an unknown one is an InvalidArgument."""
    from durable_agent import InvalidArgument

    runtime = Runtime(settings)
    try:
        turn_id = runtime.start_turn("s", "hi")
        assert runtime.get_turn(turn_id).agent == "default"
        with pytest.raises(InvalidArgument, match="no agent named 'billing'"):
            runtime.start_turn("s", "hi", agent="billing")
        with pytest.raises(InvalidArgument, match="agent must be"):
            runtime.start_turn("s", "hi", agent="bad name!")
    finally:
        runtime.close()


def test_a_five_call_turn_is_eight_journal_statements(
    make_worker: Callable[..., TurnWorker],
    store: JournalStore,
    inbox: SmtpInbox,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What a turn costs Postgres: a model or safe outcome goes with the next statement (the
    last one with the turn's end); only the claim, the never step and the end wait for the
    WAL flush; watchers are told after the flushed commits."""
    from durable_agent.journal import db as db_module

    worker = make_worker()
    turn = store.create_turn("s-count", MESSAGE)
    statements: list[str] = []
    real_run = db_module._run

    def count(conn: Any, query: Any, params: Any, *args: Any, **kwargs: Any) -> Any:
        statements.append(query.name)
        return real_run(conn, query, params, *args, **kwargs)

    monkeypatch.setattr(db_module, "_run", count)
    delivery = worker.handle(turn.turn_id)
    monkeypatch.undo()

    assert delivery.outcome == "done", delivery
    assert statements == [
        "claim_turn",  # with the agent's digest, on a turn's first run
        "insert_step",  # 0 llm
        "finish_and_insert_step",  # 0 done, 1 lookup_note
        "finish_and_insert_step",  # 1 done, 2 llm
        "finish_and_insert_step",  # 2 done, 3 send_email (flushed)
        "announce",  # step 2
        "finish_step",  # 3 done (flushed)
        "insert_step",  # 4 llm, telling watchers of step 3
        "end_turn",  # 4 done, the reply (flushed)
        "announce",  # step 4 and the end, in one statement
    ]
    steps = store.load_journal(turn.turn_id)
    assert _names(steps) == EMAIL_TURN and all(s.status == "done" for s in steps)
    assert store.get_turn(turn.turn_id).reply == REPLY and len(inbox.messages) == 1


def test_a_turn_handed_back_and_received_again_waits_instead_of_spinning(
    make_worker: Callable[..., TurnWorker],
    store: JournalStore,
    settings: Settings,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A turn of a queue this worker does not serve is handed back to its queue once. If it
    comes back to the same worker (which then consumes that queue too), it is not sent again
    at once: it waits in Postgres for a worker of its queue (the sweeper sends it when due),
    and that is logged once, not per delivery."""
    worker = make_worker()
    turn = store.create_turn("s-elsewhere", "hello", queue=f"{settings.queue}-other")

    first = worker.handle(turn.turn_id)
    assert first.outcome == "refused" and first.follow_up is not None, first
    assert first.follow_up[2] == f"{settings.queue}-other"

    caplog.set_level("WARNING", logger="durable_agent.delivery.turn_worker")
    again = [worker.handle(turn.turn_id) for _ in range(5)]

    assert all(d.outcome == "refused" and d.follow_up is None for d in again), again
    waiting = store.get_turn(turn.turn_id)
    assert waiting.status == "queued" and waiting.not_before is not None, waiting
    told = [r for r in caplog.records if "came back to this worker" in r.getMessage()]
    assert len(told) == 1, [r.getMessage() for r in caplog.records]
