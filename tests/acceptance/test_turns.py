"""A real worker process runs turns end to end: reply, journal, one email, no repeated call."""

from __future__ import annotations

from typing import TYPE_CHECKING

from durable_agent import start_turn, wait_for_turn
from durable_agent.delivery.doorbell import send
from durable_agent.runtime import runtime_for
from durable_agent.testing.harness import wait_until

if TYPE_CHECKING:
    from conftest import Spawn, Stack


def test_worker_runs_a_turn_end_to_end(stack: Stack, spawn: Spawn) -> None:
    """One turn: the reply, five finished journal rows, one email, three model calls."""
    spawn()
    turn_id = start_turn("s-end-to-end", stack.message, settings=stack.settings)

    turn = wait_for_turn(turn_id, 30, settings=stack.settings)

    report = stack.report(turn_id)
    assert turn.status == "done", report
    assert turn.reply == stack.clean_reply, report
    assert turn.attempts == 1 and turn.crashes == 0, report
    steps = stack.journal(turn_id)
    assert stack.shape(turn_id) == stack.clean_steps, report
    assert all(s.status == "done" and s.epoch == 1 for s in steps), report
    assert "Friday at 10:00" in steps[1].output["content"], report
    assert [(m.subject, m.recipients) for m in stack.inbox.messages] == [
        (stack.subject, (stack.address,))
    ], report
    # the email carries the idempotency key the runner derived for step 3
    key = steps[3].input["idempotency_key"]
    assert stack.inbox.messages[0].headers.get("X-Idempotency-Key") == key, report
    assert stack.model.request_count == 3, report
    assert stack.model.repeated_requests() == 0, report


def test_two_turns_of_a_session_run_in_order(stack: Stack, spawn: Spawn) -> None:
    """With two workers, the second turn starts only after the first finished, and its
    conversation holds the first turn's message and reply."""
    first_message = stack.message
    second_message = "Now email the note 'standup' to bob@example.com."
    first_id = start_turn("s-ordered", first_message, settings=stack.settings)
    second_id = start_turn("s-ordered", second_message, settings=stack.settings)
    spawn()
    spawn()

    second = wait_for_turn(second_id, 40, settings=stack.settings)
    first = wait_for_turn(first_id, 5, settings=stack.settings)

    report = stack.report(second_id)
    assert first.status == "done" and first.reply == stack.clean_reply, report
    assert second.status == "done", report
    assert second.reply == "Done: the note 'standup' was sent to bob@example.com.", report
    second_steps = stack.journal(second_id)
    assert first.finished_at is not None
    assert first.finished_at <= second_steps[0].created_at, report
    assert stack.subjects() == ["Note: launch", "Note: standup"], report

    requests = stack.model.requests
    assert len(requests) == 6 and stack.model.repeated_requests() == 0, report
    assert all(r["messages"][-1]["content"] != second_message for r in requests[:3]), report
    opening = requests[3]["messages"]  # the second turn's first model call
    assert [(m["role"], m["content"]) for m in opening[1:]] == [
        ("user", first_message),
        ("assistant", stack.clean_reply),
        ("user", second_message),
    ], report


def test_duplicate_delivery_runs_nothing_twice(stack: Stack, spawn: Spawn) -> None:
    """A second copy of the run_turn message reaches another worker while the turn runs:
    it steps aside without running anything (the sweeper, not the copy, would look again if
    the claim expired). One attempt, one email, no model call repeated."""
    spawn()
    spawn()
    stack.model.hold()  # keep the first delivery inside its first model call
    turn_id = start_turn("s-duplicate", stack.message, settings=stack.settings)
    stack.model.wait_for_waiting(1, timeout=20)

    send(runtime_for(stack.settings), "s-duplicate", turn_id, message_id="dup")  # delivered again
    wait_until(
        lambda: any(f"turn {turn_id} is held by" in w.log_text() for w in stack.workers),
        20,
        f"the duplicate of {turn_id} to find the turn claimed\n{stack.logs()}",
    )
    stack.model.release()
    turn = wait_for_turn(turn_id, 30, settings=stack.settings)

    report = stack.report(turn_id)
    assert turn.status == "done" and turn.reply == stack.clean_reply, report
    assert turn.attempts == 1, report
    assert stack.shape(turn_id) == stack.clean_steps, report
    assert stack.subjects() == [stack.subject], report
    assert stack.model.request_count == 3, report
    assert stack.model.repeated_requests() == 0, report


def test_a_turn_delivered_to_another_queue_is_handed_back(stack: Stack, spawn: Spawn) -> None:
    """A turn of the email queue arrives on a queue whose worker has other tools (a misrouted
    run_turn.delay, or a re-send to the wrong queue): that worker does not run it with its
    tools, it sends the turn back to its own queue, where the email worker runs it."""
    billing = stack.settings.model_copy(
        update={
            "queue": f"{stack.settings.queue}-billing",
            "tools": "durable_agent_examples.payments_tools",
        }
    )
    other = spawn(settings=billing, DURABLE_AGENT_TOOLS="durable_agent_examples.payments_tools")
    turn = stack.store.create_turn("s-routed", stack.message, queue=stack.settings.queue)
    send(runtime_for(billing), "s-routed", turn.turn_id, queue=billing.queue, message_id="m-1")
    wait_until(
        lambda: "belongs to queue" in other.log_text(), 20, "the billing worker to refuse it"
    )
    spawn()  # the email queue's worker
    done = stack.wait_turn(turn.turn_id, 30)

    report = stack.report(turn.turn_id)
    assert done.status == "done" and done.reply == stack.clean_reply, report
    assert "there is no tool named" not in str(stack.journal(turn.turn_id)), report
    assert done.attempts == 1, report  # the billing worker never claimed it
    assert stack.subjects() == [stack.subject], report
