"""Parked turns in-process on a real Postgres: sleeps, events and child agents on the one
park mechanism. A parked turn holds no claim and no message; what wakes it is counted."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from durable_agent import EventSent, TurnEnded, TurnNotFound, send_event
from durable_agent.delivery.turn_worker import TurnWorker
from durable_agent.journal import WaitStore
from durable_agent.runtime import Runtime
from durable_agent.settings import Settings

if TYPE_CHECKING:
    from conftest import DatabaseClock


@pytest.fixture
def wait_settings(settings: Settings) -> Settings:
    return settings.model_copy(update={"agents": "wait_agents", "tools": ""})


@pytest.fixture
def wait_runtime(wait_settings: Settings) -> Iterator[Runtime]:
    runtime = Runtime(wait_settings)
    yield runtime
    runtime.close()


@pytest.fixture
def worker(wait_runtime: Runtime) -> TurnWorker:
    return wait_runtime.build_turn_worker()


@pytest.fixture
def start(wait_runtime: Runtime) -> Callable[..., str]:
    def start(agent: str, message: str = "hi", **kw: Any) -> str:
        return wait_runtime.start_turn(f"s-{agent}", message, agent=agent, **kw)

    return start


def _turn(runtime: Runtime, turn_id: str) -> Any:
    return runtime.journal.get_turn(turn_id)


def test_a_sleeping_turn_holds_nothing_and_the_sweeper_wakes_it_once_due(
    worker: TurnWorker, wait_runtime: Runtime, start: Callable[..., str], clock: DatabaseClock
) -> None:
    turn_id = start("sleeper")
    first = worker.handle(turn_id)
    assert first.outcome == "parked"
    turn = _turn(wait_runtime, turn_id)
    assert (turn.status, turn.lease_owner, turn.message_id) == ("waiting", None, None)
    waits = WaitStore(wait_runtime.database).waits([turn_id])
    assert waits[turn_id].kind == "sleep" and waits[turn_id].wake_at is not None
    steps = wait_runtime.journal.load_journal(turn_id)
    assert [(s.kind, s.name, s.status) for s in steps] == [("wait", "sleep", "intent")]
    # a duplicate delivery while it sleeps runs nothing
    assert worker.handle(turn_id).outcome == "refused"
    # not due yet: a sweep sends nothing
    assert turn_id not in [t for _, t, _ in wait_runtime.sweeper().sweep_once()]
    clock.advance(31)
    sent = wait_runtime.sweeper().sweep_once()
    assert [(t, why) for _, t, why in sent] == [(turn_id, "woken")]
    assert worker.handle(turn_id).outcome == "done"
    turn = _turn(wait_runtime, turn_id)
    assert turn.reply == "awake"
    steps = wait_runtime.journal.load_journal(turn_id)
    assert steps[0].status == "done" and steps[0].output["slept"] is True
    assert WaitStore(wait_runtime.database).waits([turn_id]) == {}


def test_the_due_time_is_fixed_when_the_sleep_is_first_written(
    worker: TurnWorker, wait_runtime: Runtime, start: Callable[..., str], clock: DatabaseClock
) -> None:
    turn_id = start("sleeper")
    assert worker.handle(turn_id).outcome == "parked"
    until = wait_runtime.journal.load_journal(turn_id)[0].input["until"]
    clock.advance(20)
    # woken early (an operator, a stray wake): it parks again until the same due time
    with wait_runtime.database.transaction() as tx:
        tx.run("wake_due", batch=10)  # nothing is due yet
    wait_runtime.database.run("wake", turn_id=turn_id, kind="sleep", name="")
    assert worker.handle(turn_id).outcome == "parked"
    assert wait_runtime.journal.load_journal(turn_id)[0].input["until"] == until
    clock.advance(11)
    wait_runtime.sweeper().sweep_once()
    assert worker.handle(turn_id).outcome == "done"


def test_an_event_sent_while_the_turn_waits_wakes_it_and_is_read_once(
    worker: TurnWorker, wait_runtime: Runtime, start: Callable[..., str]
) -> None:
    turn_id = start("waiter")
    assert worker.handle(turn_id).outcome == "parked"
    sent = send_event(turn_id, "go", {"n": 1}, event_id="e1", settings=wait_runtime.settings)
    assert isinstance(sent, EventSent) and sent.outcome == "woke"
    turn = _turn(wait_runtime, turn_id)
    assert turn.status == "queued" and turn.message_id is not None  # sent at once
    again = send_event(turn_id, "go", {"n": 1}, event_id="e1", settings=wait_runtime.settings)
    assert again.outcome == "duplicate"
    assert worker.handle(turn_id).outcome == "done"
    assert _turn(wait_runtime, turn_id).reply == "got {'n': 1} (e1)"
    events = WaitStore(wait_runtime.database).events(turn_id)
    assert [(e.event_id, e.consumed_step) for e in events] == [("e1", 0)]
    with pytest.raises(TurnEnded):
        send_event(turn_id, "go", {"n": 2}, event_id="e2", settings=wait_runtime.settings)
    with pytest.raises(TurnNotFound):
        send_event("nope", "go", settings=wait_runtime.settings)


def test_an_event_sent_before_the_wait_is_kept_and_each_is_read_by_one_wait(
    worker: TurnWorker, wait_runtime: Runtime, start: Callable[..., str]
) -> None:
    turn_id = start("twice")
    s = wait_runtime.settings
    assert send_event(turn_id, "go", "a", event_id="a", settings=s).outcome == "kept"
    assert send_event(turn_id, "other", "x", event_id="x", settings=s).outcome == "kept"
    # the first wait reads "a" without parking; the second parks
    assert worker.handle(turn_id).outcome == "parked"
    assert send_event(turn_id, "go", "b", event_id="b", settings=s).outcome == "woke"
    assert worker.handle(turn_id).outcome == "done"
    assert _turn(wait_runtime, turn_id).reply == "a then b"
    states = {e.event_id: e.state for e in WaitStore(wait_runtime.database).events(turn_id)}
    assert states == {
        "a": "consumed at step 0",
        "b": "consumed at step 1",
        "x": "never read: the turn ended (done)",
    }


def test_an_event_wait_times_out(
    worker: TurnWorker, wait_runtime: Runtime, start: Callable[..., str], clock: DatabaseClock
) -> None:
    turn_id = start("waiter")
    assert worker.handle(turn_id).outcome == "parked"
    clock.advance(31)
    wait_runtime.sweeper().sweep_once()
    assert worker.handle(turn_id).outcome == "done"
    assert _turn(wait_runtime, turn_id).reply == "timed out"


def test_a_child_agent_runs_and_its_end_wakes_the_parent(
    worker: TurnWorker, wait_runtime: Runtime, start: Callable[..., str]
) -> None:
    parent = start("delegator", "ping")
    first = worker.handle(parent)
    assert first.outcome == "parked" and first.follow_up is not None
    _, child, _ = first.follow_up
    assert WaitStore(wait_runtime.database).parent_of(child).parent_turn_id == parent
    assert worker.handle(child).outcome == "done"
    # the child's end woke the parent in its own transaction
    assert _turn(wait_runtime, parent).status == "queued"
    assert worker.handle(parent).outcome == "done"
    assert _turn(wait_runtime, parent).reply == "child said echo: ping"


def test_a_failed_child_gives_the_parent_an_error_it_can_act_on(
    worker: TurnWorker, wait_runtime: Runtime, start: Callable[..., str]
) -> None:
    parent = start("delegator", "fail now")
    first = worker.handle(parent)
    _, child, _ = first.follow_up or ("", "", "")
    assert worker.handle(child).outcome == "failed"
    assert worker.handle(parent).outcome == "done"
    assert _turn(wait_runtime, parent).reply.startswith("child failed: Error: agent echo")


def test_children_nest_up_to_the_depth_limit(
    wait_settings: Settings, start: Callable[..., str]
) -> None:
    runtime = Runtime(wait_settings.model_copy(update={"max_child_depth": 2}))
    try:
        worker = runtime.build_turn_worker()
        top = runtime.start_turn("nest", "5", agent="nester")
        pending = [top]
        for _ in range(20):
            if not pending:
                break
            turn_id = pending.pop()
            delivery = worker.handle(turn_id)
            if delivery.follow_up:
                pending.append(turn_id)
                pending.append(delivery.follow_up[1])
        reply = runtime.journal.get_turn(top).reply
        assert reply is not None and reply.startswith("5/4/stopped at 3")
        assert "nest at most 2 deep" in reply
    finally:
        runtime.close()


def test_cancelling_a_parked_parent_cancels_its_open_child(
    worker: TurnWorker, wait_runtime: Runtime, start: Callable[..., str]
) -> None:
    from durable_agent import cancel_turn

    parent = start("delegator", "ping")
    _, child, _ = worker.handle(parent).follow_up or ("", "", "")
    result = cancel_turn(parent, "no longer needed", settings=wait_runtime.settings)
    assert result.cancelled
    assert _turn(wait_runtime, child).status == "cancelled"
    assert "parent turn" in (_turn(wait_runtime, child).error or "")
    assert WaitStore(wait_runtime.database).waits([parent, child]) == {}  # nothing waits


def test_prune_keeps_a_finished_child_while_its_parent_is_open(
    worker: TurnWorker, wait_runtime: Runtime, start: Callable[..., str], clock: DatabaseClock
) -> None:
    from durable_agent import prune

    parent = start("delegator", "ping")
    _, child, _ = worker.handle(parent).follow_up or ("", "", "")
    assert worker.handle(child).outcome == "done"
    clock.advance(2 * 86_400)
    assert prune("1d", settings=wait_runtime.settings).turns == 0  # the parent still needs it
    assert worker.handle(parent).outcome == "done"
    clock.advance(2 * 86_400)
    assert prune("1d", settings=wait_runtime.settings).turns == 2


def test_the_cli_sends_events_lists_them_and_shows_what_parked_turns_wait_for(
    worker: TurnWorker, wait_settings: Settings, start: Callable[..., str]
) -> None:
    import json

    from inprocess import run_cli

    turn_id = start("waiter")
    assert worker.handle(turn_id).outcome == "parked"
    listed = run_cli(wait_settings, "turns", "--json")
    assert listed.returncode == 0, listed.stderr
    row = next(r for r in json.loads(listed.stdout) if r["turn_id"] == turn_id)
    assert row["waits_for"]["kind"] == "event" and row["waits_for"]["name"] == "go"
    table = run_cli(wait_settings, "turns", "--limit", "5", COLUMNS="200")
    assert "waits for event 'go'" in " ".join(table.stdout.split())
    bad = run_cli(wait_settings, "send-event", turn_id, "go", "{not json")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "not JSON" in bad.stderr
    sent = run_cli(wait_settings, "send-event", turn_id, "go", '{"ok": true}', "--event-id", "x1")
    assert sent.returncode == 0 and "woke turn" in sent.stdout, sent.stderr
    again = run_cli(wait_settings, "send-event", turn_id, "go", "{}", "--event-id", "x1")
    assert again.returncode == 0 and "nothing changed" in again.stdout
    assert worker.handle(turn_id).outcome == "done"
    ended = run_cli(wait_settings, "send-event", turn_id, "go", "{}", "--event-id", "x2")
    assert ended.returncode == 1 and "has ended (done)" in ended.stderr
    missing = run_cli(wait_settings, "send-event", "no-such-turn", "go")
    assert missing.returncode == 4
    events = run_cli(wait_settings, "events", turn_id, "--json")
    assert [e["state"] for e in json.loads(events.stdout)] == ["consumed at step 0"]


def test_spend_of_a_turn_rolls_its_children_up(
    worker: TurnWorker, wait_settings: Settings, start: Callable[..., str]
) -> None:
    import json

    from inprocess import run_cli

    parent = start("delegator", "ping")
    _, child, _ = worker.handle(parent).follow_up or ("", "", "")
    worker.handle(child)
    worker.handle(parent)
    result = run_cli(wait_settings, "spend", "--turn", parent, "--json")
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)
    assert [r["turn"] for r in rows] == [parent, f"child {child} (echo, step 0)", "total"]


def test_the_console_turn_page_says_what_a_parked_turn_waits_for(
    worker: TurnWorker, wait_settings: Settings, start: Callable[..., str]
) -> None:
    import base64

    from starlette.testclient import TestClient

    from durable_agent.web.app import create_app
    from durable_agent.web.auth import Authenticator

    parent = start("delegator", "ping")
    _, child, _ = worker.handle(parent).follow_up or ("", "", "")
    runtime = Runtime(wait_settings.model_copy(update={"console_auth": "ada:s3cret-pass"}))
    try:
        auth = Authenticator(runtime.settings.console_logins, "tok-0123456789abcdef")
        client = TestClient(create_app(runtime, auth), base_url="http://console.test")
        basic = {"Authorization": "Basic " + base64.b64encode(b"ada:s3cret-pass").decode()}
        page = client.get(f"/turns/{parent}", headers=basic)
        assert page.status_code == 200
        assert f"Waits for child turn {child} (step 0)." in page.text
        worker.handle(child)
        worker.handle(parent)
        done = client.get(f"/turns/{parent}", headers=basic)
        assert done.status_code == 200 and "Waits for" not in done.text
        assert "agent:echo" in done.text  # the wait step in the timeline
    finally:
        runtime.close()


def test_a_loop_that_waits_cannot_run_on_a_test_journal() -> None:
    from durable_agent.errors import TurnFailed
    from durable_agent.step.runner import StepRunner
    from durable_agent.step.tools import ToolRegistry
    from durable_agent.testing import ClaimHeld, MemoryJournal

    runner = StepRunner(MemoryJournal("t1"), tools=ToolRegistry(), guard=ClaimHeld())
    with pytest.raises(TurnFailed, match="cannot park a turn"):
        runner.wait_step("sleep", {"wait": "sleep", "seconds": 1.0})


def test_a_turn_that_waited_replays_from_its_journal_alone(
    worker: TurnWorker, wait_runtime: Runtime, start: Callable[..., str]
) -> None:
    from durable_agent.operate.replay import replay_turn

    parent = start("delegator", "ping")
    _, child, _ = worker.handle(parent).follow_up or ("", "", "")
    worker.handle(child)
    worker.handle(parent)
    report = replay_turn(wait_runtime.journal, wait_runtime.agents, parent, max_steps=64)
    assert report.ok and report.model_calls == 0, report.describe()


def test_a_child_runs_on_its_own_queue_and_is_streamed_under_the_step_that_started_it(
    worker: TurnWorker, wait_runtime: Runtime, start: Callable[..., str]
) -> None:
    parent = start("delegator", "ping")
    first = worker.handle(parent)
    assert first.follow_up is not None
    _, child, queue = first.follow_up
    assert queue == "wait-tests-far" and _turn(wait_runtime, child).queue == queue
    worker.handle(child)
    worker.handle(parent)
    events = list(wait_runtime.stream_turn(parent, timeout=10))
    told = [(e.turn_id, e.parent_step, e.step.step if e.step else None, e.kind) for e in events]
    assert told == [
        (child, 0, 0, "step"),  # the child's only step, under the parent's step 0
        (parent, None, 0, "step"),
        (parent, None, None, "end"),
    ]
    assert events[0].as_json()["parent_turn_id"] == parent


def test_a_child_step_resumes_a_stream_before_the_step_that_started_it(
    worker: TurnWorker, wait_runtime: Runtime, start: Callable[..., str]
) -> None:
    parent = start("delegator", "ping")
    _, child, _ = worker.handle(parent).follow_up or ("", "", "")
    worker.handle(child)
    worker.handle(parent)
    first = next(iter(wait_runtime.stream_turn(parent, timeout=10)))
    assert first.turn_id == child and first.id == "-1"
    again = list(wait_runtime.stream_turn(parent, after_step=int(first.id), timeout=10))
    assert [e.turn_id for e in again][:2] == [child, parent]  # told again, nothing skipped


def test_declared_events_refuse_other_names_at_once(
    worker: TurnWorker, wait_runtime: Runtime, wait_settings: Settings, start: Callable[..., str]
) -> None:
    from inprocess import run_cli

    from durable_agent import InvalidArgument

    turn_id = start("waiter")  # Agent(events=["go"])
    with pytest.raises(InvalidArgument, match="never waits for the event 'nope'"):
        send_event(turn_id, "nope", {}, settings=wait_runtime.settings)
    here = str(Path(__file__).parent)  # where the agents' module is
    refused = run_cli(wait_settings, "send-event", turn_id, "nope", PYTHONPATH=here)
    assert refused.returncode == 2 and "never waits for the event 'nope'" in refused.stderr
    assert WaitStore(wait_runtime.database).events(turn_id) == []
    strict = start("strict")  # declares "stop", waits for "go"
    delivery = worker.handle(strict)
    assert delivery.outcome == "failed" and "does not declare" in delivery.detail


def test_sealed_events_and_child_messages_show_nothing_in_clear(
    wait_settings: Settings, pg: Any, start: Callable[..., str]
) -> None:
    """With keys set, an event's payload (bound to its turn and event id) and a child turn's
    message are sealed at rest, and read back clear by the turn that waits."""
    from durable_agent.journal.sealing import new_key

    runtime = Runtime(wait_settings.model_copy(update={"keys": f"k1:{new_key()}"}))
    try:
        worker = runtime.build_turn_worker()
        waiter = runtime.start_turn("s-sealed", "hi", agent="waiter")
        assert worker.handle(waiter).outcome == "parked"
        send_event(waiter, "go", {"card": "4242-secret"}, event_id="e1", settings=runtime.settings)
        assert worker.handle(waiter).outcome == "done"
        assert "4242-secret" in (runtime.journal.get_turn(waiter).reply or "")
        parent = runtime.start_turn("s-sealed-2", "child-secret ping", agent="delegator")
        _, child, _ = worker.handle(parent).follow_up or ("", "", "")
        assert worker.handle(child).outcome == "done"
        dump = " ".join(
            str(pg.execute(f"SELECT coalesce(string_agg(t::text, ' '), '') FROM {t} AS t")
                .fetchone()[0])
            for t in ("events", "turns", "journal")
        )  # fmt: skip
        assert "4242-secret" not in dump and "child-secret" not in dump
        assert [e.payload for e in WaitStore(runtime.database).events(waiter)] == [
            {"card": "4242-secret"}
        ]
    finally:
        runtime.close()
