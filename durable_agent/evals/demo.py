"""``durable-agent demo``: a turn whose worker dies mid-way, finished by another worker.

The agent looks up a note (safe), emails it (never) and replies. Worker 1 dies right after
``send_email`` ran and before its outcome was recorded: the email is out, the journal does
not know. Worker 2 picks the turn up through the sweeper and the claim, reads the finished
steps back instead of running them, tells the model the send may or may not have happened,
and the model checks the outbox instead of sending again. One email arrives.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from ..journal import Step, Turn
from ..testing.harness import wait_until
from .stack import EvalStack

MESSAGE = "Email the note 'launch' to ada@example.com"
CRASH_AT = "send_email:after_run"


@dataclass
class DemoResult:
    turn: Turn
    journal_at_crash: list[Step]
    journal: list[Step]
    emails: list[tuple[str, str]]
    model_requests: int | None
    repeated_requests: int | None
    read_back: list[int] = field(default_factory=list)


def run_demo(stack: EvalStack, say: Callable[[str], None], message: str = MESSAGE) -> DemoResult:
    runtime = stack.runtime
    store = runtime.journal
    say(f"starting worker 1, armed to die right after send_email runs (CRASH_AT={CRASH_AT})")
    first = stack.start_worker("worker-1", CRASH_AT=CRASH_AT)
    turn_id = runtime.start_turn(f"demo-{uuid.uuid4().hex[:8]}", message)
    say(f"submitted turn {turn_id}: {message!r}")
    code = first.wait_exit(120)
    say(
        f"worker 1 (pid {first.pid}) died with exit code {code}; emails in the inbox: "
        f"{stack.inbox.count}"
    )
    at_crash = store.load_journal(turn_id)
    say(
        "starting worker 2; its sweeper sees worker 1's process is gone, ends its claim "
        "and re-enqueues the turn"
    )
    stack.start_worker("worker-2")
    turn = runtime.wait_for_turn(turn_id, 120)
    wait_until(lambda: stack.inbox.count >= 1, 10, "the email")
    journal = store.load_journal(turn_id)
    read_back = [s.step for s in journal if s.status == "done" and s.epoch < turn.lease_epoch]
    return DemoResult(
        turn=turn,
        journal_at_crash=at_crash,
        journal=journal,
        emails=[(", ".join(m.recipients), m.subject) for m in stack.inbox.messages],
        model_requests=stack.model.request_count if stack.model else None,
        repeated_requests=stack.model.repeated_requests() if stack.model else None,
        read_back=read_back,
    )
