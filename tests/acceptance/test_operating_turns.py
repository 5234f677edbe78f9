"""Operating turns with real worker processes killed at the new points: a cancel that
reaches a turn whose worker was killed, and an approval that survives a parked worker's
death and a crash right after the approved call ran."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import TYPE_CHECKING

from durable_agent import cancel_turn, start_turn
from durable_agent.delivery.doorbell import send
from durable_agent.runtime import runtime_for
from durable_agent.settings import Settings
from durable_agent.testing.harness import settings_env, wait_until

if TYPE_CHECKING:
    from conftest import Spawn, Stack

APPROVAL = {"DURABLE_AGENT_APPROVAL_REQUIRED": "send_email"}


def run_cli(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "durable_agent", *args],
        env={**os.environ, **settings_env(settings)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_cancel_stops_a_turn_whose_worker_was_killed_and_the_session_goes_on(
    stack: Stack, spawn: Spawn
) -> None:
    """The cancel arrives while the worker is inside a model call; the worker is then
    SIGKILLed. The next worker's claim sees the cancel before it runs anything: the turn
    ends cancelled with who and why, the interrupted model call is not made again, no
    email is sent for it, and the session's next turn runs."""
    first_worker = spawn()
    stack.model.hold()
    first = start_turn("s-cancel", stack.message, settings=stack.settings)
    second = start_turn(
        "s-cancel", "Now email the note 'standup' to bob@example.com.", settings=stack.settings
    )
    stack.model.wait_for_waiting(1, timeout=20)

    asked = cancel_turn(first, "wrong recipient", by="ops", settings=stack.settings)
    assert not asked.cancelled and "stops at its next step boundary" in asked.describe()
    first_worker.kill()
    stack.model.release()
    spawn()

    cancelled = stack.wait_turn(first)
    done = stack.wait_turn(second)
    report = stack.report(first)
    assert (cancelled.status, cancelled.error) == ("cancelled", "cancelled by ops: wrong recipient")
    assert [(s.step, s.status) for s in stack.journal(first)] == [(0, "intent")], report
    assert done.status == "done", report
    assert done.reply == "Done: the note 'standup' was sent to bob@example.com.", report
    assert stack.subjects() == ["Note: standup"], report
    assert stack.model.request_count == 4 and stack.model.repeated_requests() == 0, report


def test_approval_survives_killed_workers_and_the_call_runs_once(
    stack: Stack, spawn: Spawn
) -> None:
    """send_email needs approval. The turn parks and its worker is SIGKILLed while it waits
    (nothing holds the turn); it is approved while no worker runs; the next worker dies
    right after the approved send (CRASH_AT); the last one resumes: 'may or may not have
    happened', it checks the outbox and replies. One email; no approval asked twice; a
    duplicate delivery runs nothing; the interrupted send is in the uncertain inbox."""
    parked_worker = spawn(**APPROVAL)
    turn_id = start_turn("s-approve", stack.message, settings=stack.settings)
    wait_until(
        lambda: stack.store.get_turn(turn_id).status == "waiting",
        30,
        f"the turn to park\n{stack.logs()}",
    )
    parked = stack.store.get_turn(turn_id)
    assert (parked.lease_owner, parked.lease_expires_at) == (None, None)
    parked_worker.kill()

    listed = run_cli(stack.settings, "approvals", "--json")
    assert [(a["step"], a["tool"], a["decision"]) for a in json.loads(listed.stdout)] == [
        (3, "send_email", None)
    ], listed.stderr
    approved = run_cli(stack.settings, "approve", turn_id, "3", "--by", "ada")
    assert approved.returncode == 0, approved.stderr
    assert stack.store.get_turn(turn_id).status == "queued"

    crashing = spawn(ready=False, CRASH_AT="send_email:after_run", **APPROVAL)
    assert stack.wait_exit(crashing) != 0
    assert stack.subjects() == [stack.subject]
    last = spawn(**APPROVAL)
    turn = stack.wait_turn(turn_id)

    report = stack.report(turn_id)
    assert (turn.status, turn.reply) == ("done", stack.clean_reply), report
    steps = stack.journal(turn_id)
    assert steps[3].input["approval"]["decided_by"] == "ada", report
    assert steps[3].output["uncertain"] is True, report
    assert [s.name for s in steps[4:]] == ["llm", "list_sent_emails", "llm"], report
    send(runtime_for(stack.settings), "s-approve", turn_id, message_id="dup")
    wait_until(lambda: "already done" in last.log_text(), 20, "the duplicate to be refused")
    assert stack.subjects() == [stack.subject], report
    assert stack.model.repeated_requests() == 0, report

    inbox = json.loads(run_cli(stack.settings, "uncertain", "--json").stdout)
    assert [(e["turn_id"], e["step"], e["how"], e["next"]) for e in inbox] == [
        (
            turn_id,
            3,
            "interrupted",
            "checked with list_sent_emails (step 5), then did not retry; the turn ended done",
        )
    ]
