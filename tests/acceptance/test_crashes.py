"""Workers die in the middle of a turn (SIGKILL, or a CRASH_AT point) and a fresh worker
finishes it: finished calls are read back, and send_email (replay="never") sends once.

The last test relabels send_email as "safe" and shows the duplicate email that the label
exists to prevent.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from durable_agent import get_turn, start_turn
from durable_agent.testing.harness import wait_until

if TYPE_CHECKING:
    from conftest import Spawn, Stack


POSSIBLY_RAN = "may or may not have happened"


def _crash_then_resume(stack: Stack, spawn: Spawn, pool: str, crash_at: str, session: str) -> str:
    """Start a turn on a worker armed with CRASH_AT and let it die there; then let the turn
    go on. Solo pool: the worker process exits, a fresh worker is started. Prefork pool: the
    pool child exits, Celery puts the message back and a new child of the same worker takes
    it (CRASH_AT does not fire again: the step is now read back, not run)."""
    first = spawn(pool=pool, concurrency=1, CRASH_AT=crash_at)
    turn_id = start_turn(session, stack.message, settings=stack.settings)
    reached = f"CRASH_AT={crash_at} reached"
    if pool == "solo":
        assert stack.wait_exit(first) == 1, stack.report(turn_id)
        assert reached in first.log_text(), stack.report(turn_id)
        spawn()
    else:
        wait_until(lambda: reached in first.log_text(), 30, f"the child to reach {crash_at}")
        assert first.alive(), stack.report(turn_id)  # the worker lives on; its child died
    return turn_id


def test_sigkill_during_a_model_call(stack: Stack, spawn: Spawn) -> None:
    """SIGKILL while the worker waits for its second model call (step 2): a second worker
    finishes with the clean reply; only that interrupted call is sent again; one email."""
    stack.on_first_request(stack.model.hold)  # answer step 0, hold step 2
    first = spawn()
    turn_id = start_turn("s-sigkill", stack.message, settings=stack.settings)
    stack.model.wait_for_waiting(1, timeout=20)  # the request of step 2 is in flight
    assert stack.model.request_count == 2, stack.report(turn_id)

    first.kill(signal.SIGKILL)
    assert stack.wait_exit(first, 10) == -signal.SIGKILL
    stack.model.release()  # the held request now answers a dead socket
    spawn()
    turn = stack.wait_turn(turn_id, 40)

    report = stack.report(turn_id)
    assert turn.status == "done" and turn.reply == stack.clean_reply, report
    assert (turn.attempts, turn.crashes) == (2, 1), report
    steps = stack.journal(turn_id)
    assert stack.shape(turn_id) == stack.clean_steps, report
    assert all(s.status == "done" for s in steps), report
    # steps 0 and 1 finished on the first worker and were read back; 2-4 ran on the second
    assert [s.epoch for s in steps] == [1, 1, 2, 2, 2], report
    assert stack.subjects() == [stack.subject], report
    digests = stack.model.request_digests()
    assert len(digests) == 4, report
    assert stack.model.repeated_requests() == 1, report
    assert digests[1] == digests[2], f"the repeat is not the interrupted step-2 call\n{report}"

    # the spend ledger accounts for every completion the model served (the one answered to
    # the dead worker too): 3 recorded calls, 1 crash waste, and step 0 read back once; the
    # lost completion's estimate is exact here, as the scripted model answers alike
    spend = get_turn(turn_id, settings=stack.settings).spend
    served = stack.model.billed()
    assert spend is not None, report
    assert (spend.billed.calls, spend.crash_waste.calls, spend.journal_saved.calls) == (3, 1, 1)
    assert spend.billed.calls + spend.crash_waste.calls == served["calls"] == 4, report
    for tokens in ("prompt_tokens", "completion_tokens"):
        ledger = getattr(spend.billed, tokens) + getattr(spend.crash_waste, tokens)
        assert ledger == served[tokens], (tokens, spend, served)


@pytest.mark.parametrize("pool", ["solo", "prefork"])
def test_crash_after_send_email_ran(stack: Stack, spawn: Spawn, pool: str) -> None:
    """CRASH_AT=3:after_run: the email went out, the outcome was never recorded. The next
    worker does not send again: the model is told the send may or may not have happened,
    checks list_sent_emails, finds it and gives the clean run's reply. Exactly one email."""
    turn_id = _crash_then_resume(stack, spawn, pool, "3:after_run", "s-after-run")
    turn = stack.wait_turn(turn_id, 40)

    report = stack.report(turn_id)
    assert turn.status == "done" and turn.reply == stack.clean_reply, report
    steps = stack.journal(turn_id)
    assert stack.shape(turn_id) == [
        *stack.clean_steps[:4],
        (4, "model", "llm", "safe"),
        (5, "tool", "list_sent_emails", "safe"),
        (6, "model", "llm", "safe"),
    ], report
    assert all(s.status == "done" for s in steps), report
    assert POSSIBLY_RAN in steps[3].output["content"], report
    assert steps[3].output.get("uncertain") is True, report
    assert stack.subject in steps[5].output["content"], report
    assert stack.subjects() == [stack.subject], report
    assert stack.model.request_count == 4, report
    assert stack.model.repeated_requests() == 0, report


@pytest.mark.parametrize("pool", ["solo", "prefork"])
def test_crash_before_send_email_ran(stack: Stack, spawn: Spawn, pool: str) -> None:
    """CRASH_AT=3:before_run: the intent was committed, the email never left. The next
    worker does not run the interrupted send; the model checks, finds nothing and sends
    again at a later step, reusing the interrupted call's idempotency key. One email."""
    turn_id = _crash_then_resume(stack, spawn, pool, "3:before_run", "s-before-run")
    turn = stack.wait_turn(turn_id, 40)

    report = stack.report(turn_id)
    assert turn.status == "done" and turn.reply == stack.clean_reply, report
    steps = stack.journal(turn_id)
    assert stack.shape(turn_id) == [
        *stack.clean_steps[:4],
        (4, "model", "llm", "safe"),
        (5, "tool", "list_sent_emails", "safe"),
        (6, "model", "llm", "safe"),
        (7, "tool", "send_email", "never"),
        (8, "model", "llm", "safe"),
    ], report
    assert all(s.status == "done" for s in steps), report
    assert POSSIBLY_RAN in steps[3].output["content"], report
    assert stack.subject not in steps[5].output["content"], report
    assert stack.subjects() == [stack.subject], report
    key = steps[3].input["idempotency_key"]
    assert steps[7].input["idempotency_key"] == key, report
    assert stack.inbox.messages[0].headers.get("X-Idempotency-Key") == key, report
    assert stack.model.request_count == 5, report
    assert stack.model.repeated_requests() == 0, report


WRONG_LABEL_MODULE = '''\
"""The example email tools with send_email wrongly labelled "safe"."""

import dataclasses

from durable_agent_examples import email_tools

lookup_note = email_tools.lookup_note
list_sent_emails = email_tools.list_sent_emails
send_email = dataclasses.replace(email_tools.send_email, replay="safe")
'''


def test_send_email_labelled_safe_sends_twice(stack: Stack, spawn: Spawn, tmp_path: Path) -> None:
    """The failure mode: with send_email relabelled "safe", CRASH_AT=3:after_run makes the
    next worker run the send again, and a second email arrives. The "never" label (the
    tests above, same crash point) is what prevents it."""
    modules = tmp_path / "tools_path"
    modules.mkdir()
    (modules / "wrong_label_email_tools.py").write_text(WRONG_LABEL_MODULE)
    env = {
        "DURABLE_AGENT_TOOLS": "wrong_label_email_tools",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(modules), os.environ.get("PYTHONPATH")])),
    }
    first = spawn(CRASH_AT="3:after_run", **env)
    assert "send_email (safe)" in first.log_text(), stack.logs()
    turn_id = start_turn("s-wrong-label", stack.message, settings=stack.settings)
    assert stack.wait_exit(first) == 1, stack.report(turn_id)
    assert stack.subjects() == [stack.subject], stack.report(turn_id)

    spawn(**env)
    turn = stack.wait_turn(turn_id, 40)

    report = stack.report(turn_id)
    assert turn.status == "done" and turn.reply == stack.clean_reply, report
    steps = stack.journal(turn_id)
    assert (steps[3].name, steps[3].replay) == ("send_email", "safe"), report
    assert POSSIBLY_RAN not in steps[3].output["content"], report
    assert stack.subjects() == [stack.subject, stack.subject], report
    # both copies carry the same key: only a downstream API that honours it would collapse them
    keys = {m.headers.get("X-Idempotency-Key") for m in stack.inbox.messages}
    assert keys == {steps[3].input["idempotency_key"]}, report
