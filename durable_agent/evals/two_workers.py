"""Two workers on one turn: a frozen worker wakes up after another took its turn over.

Worker A runs a refund turn and is frozen (SIGSTOP) while its ``refund_order`` request is
inside the payments service, before the refund is applied. Its heartbeat stops with it, so
the lease (5 s) runs out; the sweeper in worker B re-enqueues the turn and B claims it at a
higher epoch. B finds A's intent with no outcome, tells the model the refund may or may not
have happened; the model checks the order and refunds again, with the idempotency key of
A's uncertain call. Then A's held request goes through and A wakes up (SIGCONT).

What must hold: the payments service executes exactly one refund (A's late request carries
the same key as B's retry), the epoch fence rejects A's outcome write, and A stops without
writing anything more. The eval also replays A's next write (its intent for the following
step) to show both defences reject it: the epoch fence, and without the fence the primary
key on (turn_id, step).
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from dataclasses import asdict, dataclass, field
from importlib import resources
from typing import Any

import psycopg

from ..errors import LeaseLost
from ..journal import Database, JournalStore, Query, parse_queries
from ..testing.harness import wait_until
from .heed_note import MESSAGE
from .stack import EvalStack


@dataclass
class TwoWorkersReport:
    turn_id: str
    lease_seconds: float
    frozen_seconds: float
    status: str
    reply: str | None
    refunds_executed: int
    refund_requests: int
    a_outcome_fenced: bool  # A's late outcome for its step is not what the journal holds
    a_next_intent_fenced: bool  # A's next intent, as A would write it, was refused
    unfenced_intent_refused_by_key: bool  # the same insert without the fence hit the key
    worker_a: list[str] = field(default_factory=list)
    worker_b: list[str] = field(default_factory=list)
    journal: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return (
            self.status == "done"
            and self.refunds_executed == 1
            and self.a_outcome_fenced
            and self.a_next_intent_fenced
            and self.unfenced_intent_refused_by_key
        )

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


def run_two_workers(stack: EvalStack, timeout: float = 60.0) -> TwoWorkersReport:
    settings, runtime = stack.settings, stack.runtime
    payments = stack.payments
    db, store = runtime.database, runtime.journal
    try:
        payments.reset()
        payments.hold(count=1)  # A's refund request waits inside the service
        worker_a = stack.start_worker("worker-a")
        turn_id = runtime.start_turn(f"two-workers-{uuid.uuid4().hex[:8]}", MESSAGE)
        payments.wait_for_waiting(1, timeout=timeout)
        frozen_at = time.monotonic()
        os.killpg(worker_a.pid, signal.SIGSTOP)
        a_epoch = store.get_turn(turn_id).lease_epoch
        a_step = max(s.step for s in store.load_journal(turn_id))
        lines_a = [
            f"claimed the turn at epoch {a_epoch}, reached step {a_step} (refund_order) and "
            "froze (SIGSTOP) with its refund request inside the payments service"
        ]
        worker_b = stack.start_worker("worker-b")
        turn = runtime.wait_for_turn(turn_id, timeout)
        steps = store.load_journal(turn_id)
        lines_b = [
            f"claimed the turn at epoch {turn.lease_epoch} after A's lease expired "
            f"({settings.lease_seconds:g}s), attempts {turn.attempts}, crashes {turn.crashes}",
            *[
                f"step {s.step}: {s.kind} {s.name}: {s.summary(90)}"
                for s in steps
                if s.epoch == turn.lease_epoch and s.step >= a_step
            ],
        ]
        # A stays frozen for two lease lengths in all (the pattern's "tool sleeps 10 s")
        time.sleep(max(0.0, 2 * settings.lease_seconds - (time.monotonic() - frozen_at)))
        payments.release()  # A's late request now reaches the service
        os.killpg(worker_a.pid, signal.SIGCONT)
        frozen_seconds = time.monotonic() - frozen_at
        wait_until(
            lambda: "stopping turn" in worker_a.log_text(), timeout, "worker A to stop the turn"
        )
        lines_a.append(
            f"woke after {frozen_seconds:.1f}s; its refund request completed (same idempotency "
            f"key: the service executed {payments.refunds_executed} refund in all)"
        )
        lines_a.append(
            f"its outcome write for step {a_step}: {_stop_line(worker_a.log_text())}; "
            "it stopped the turn"
        )
        journal = store.load_journal(turn_id)
        a_outcome_fenced = journal[a_step].epoch != a_epoch
        next_fenced, key_refused, lines = _replay_next_write(
            db, store, turn_id, a_epoch, a_step + 1
        )
        lines_a.extend(lines)
        worker_b.stop()
        worker_a.stop()
        return TwoWorkersReport(
            turn_id=turn_id,
            lease_seconds=settings.lease_seconds,
            frozen_seconds=round(frozen_seconds, 1),
            status=turn.status,
            reply=turn.reply,
            refunds_executed=payments.refunds_executed,
            refund_requests=payments.refund_requests,
            a_outcome_fenced=a_outcome_fenced,
            a_next_intent_fenced=next_fenced,
            unfenced_intent_refused_by_key=key_refused,
            worker_a=lines_a,
            worker_b=lines_b,
            journal=[s.as_json() for s in journal],
        )
    finally:
        payments.release()


def _eval_query(name: str) -> Query:
    """A query of the evals' own ``sql/two_workers.sql`` (the library never sends it)."""
    text = resources.files(__package__).joinpath("sql", "two_workers.sql").read_text()
    return parse_queries(text)[name]


_UNFENCED = _eval_query("insert_step_unfenced")


def _replay_next_write(
    db: Database, store: JournalStore, turn_id: str, epoch: int, step: int
) -> tuple[bool, bool, list[str]]:
    """What happens to the stale worker's next intent: first as A would write it, then
    without the epoch fence, straight into the primary key. Returns (refused by the fence,
    refused by the key, what happened in words)."""
    lines = []
    try:
        store.insert_intent(turn_id, epoch, step, "model", "llm", {}, "safe")
        lines.append(f"its intent for step {step} was ACCEPTED (fencing is broken)")
        fenced = False
    except LeaseLost as error:
        lines.append(
            f"its next intent (step {step}, epoch {epoch}): rejected by the epoch fence ({error})"
        )
        fenced = True
    try:
        with psycopg.connect(db.conninfo, autocommit=True) as conn:
            conn.execute(_UNFENCED.sql, {"turn_id": turn_id, "step": step, "epoch": epoch})
        lines.append(f"the same insert without the fence was ACCEPTED at step {step}")
        keyed = False
    except psycopg.errors.UniqueViolation:
        lines.append(
            f"the same insert without the fence: rejected by the primary key (turn_id, step): "
            f"step {step} is already recorded by B"
        )
        keyed = True
    return fenced, keyed, lines


def _stop_line(log: str) -> str:
    for line in log.splitlines():
        if "stopping turn" in line:
            return line.split(": ", 3)[-1].strip()
    return "(no log line)"
