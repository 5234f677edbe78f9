"""What a worker does with one delivery of a turn: claim, run, finish, or step aside.

Every delivery first claims the turn in Postgres. A delivery that finds the turn finished
does nothing; one that finds a live claim of another worker (or an earlier turn of the
session still open) does not run it: the sweeper re-sends the turn from Postgres when it is
due, so a turn whose worker died is never left without a message.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from .agent import initial_messages, run_agent
from .errors import LeaseLost, ModelUnavailable, ServiceUnavailable, TurnFailed
from .faults import Faults
from .heartbeat import Heartbeat
from .journal import Refusal, worker_identity
from .journal.records import Claim
from .redact import redact
from .runner import StepRunner
from .tools import ToolRegistry

if TYPE_CHECKING:
    from .runtime import Runtime

log = logging.getLogger(__name__)


class Outcome(StrEnum):
    """What became of one delivery."""

    DONE = "done"  # the turn finished with a reply
    FAILED = "failed"  # the turn ended as failed, with the reason
    REFUSED = "refused"  # not run: finished, held by another worker, waiting or deferred
    DEFERRED = "deferred"  # given back (the model API kept failing, or the journal lost its
    # last writes in a Postgres crash); the turn runs again after a backoff, or at once
    LOST = "lost"  # another worker took the turn over mid-run; this one stopped
    INTERRUPTED = "interrupted"  # Postgres could not be reached; the message goes back


@dataclass
class Delivery:
    """What became of one delivery, and what the caller should enqueue."""

    turn_id: str
    outcome: Outcome
    detail: str = ""
    follow_up: tuple[str, str, str] | None = None  # (session_id, turn_id, queue) to enqueue
    read_back: list[int] = field(default_factory=list)
    executed: list[int] = field(default_factory=list)


class TurnWorker:
    """Runs turns for one worker process."""

    def __init__(
        self,
        runtime: Runtime,
        *,
        tools: ToolRegistry | None = None,
        model: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
        faults: Faults | None = None,
    ) -> None:
        self.runtime = runtime
        self.settings = runtime.settings
        self.store = runtime.journal
        self.leases = runtime.leases
        self.tools = tools if tools is not None else runtime.tools
        self.model = model if model is not None else runtime.model
        self.faults = faults if faults is not None else Faults.from_env()

    def handle(self, turn_id: str) -> Delivery:
        self.faults.maybe_crash_before_claim()
        claim = self.leases.claim(
            turn_id, worker_identity(), self.settings.lease_seconds, self.runtime.queues
        )
        if isinstance(claim, Refusal):
            log.info("delivery of %s not run: %s", turn_id, claim.detail)
            delivery = Delivery(turn_id, Outcome.REFUSED, claim.detail)
            if claim.reason == "elsewhere":  # hand it back to the queue it belongs to
                turn = self.store.get_turn(turn_id)
                delivery.follow_up = (turn.session_id, turn.turn_id, turn.queue)
            return delivery
        if claim.turn.crashes >= self.settings.max_crashes:
            return self._give_up(claim)
        return self._run(claim)

    def _run(self, claim: Claim) -> Delivery:
        turn = claim.turn
        settings = self.settings
        delivery = Delivery(turn.turn_id, Outcome.DONE)
        runner: StepRunner | None = None
        with Heartbeat(self.leases, turn.turn_id, claim.epoch, settings.lease_seconds) as beat:
            try:
                # the first claim of a turn finds no journal, the first turn of a session
                # no history: neither is read then
                runner = StepRunner(
                    self.store.for_claim(turn.turn_id, claim.epoch, empty=claim.epoch == 1),
                    tools=self.tools,
                    guard=beat,
                    faults=self.faults,
                    max_steps=settings.max_steps,
                )
                history = self.store.session_history(turn.session_id, turn.seq) if turn.seq else []
                messages = initial_messages(settings.system_prompt, history, turn.message)
                reply = run_agent(
                    runner,
                    model=settings.model,
                    tools=self.tools,
                    messages=messages,
                    call_model=self.model,
                )
                beat.check()
                ended = self.leases.finish(turn.turn_id, claim.epoch, reply)
                if ended is None:
                    raise LeaseLost(f"turn {turn.turn_id}: reply not recorded, epoch moved on")
                delivery.detail, delivery.follow_up = reply, ended.next_turn
            except LeaseLost as error:
                if beat.unreachable:  # not taken over: Postgres was out of reach for a lease
                    delivery.outcome, delivery.detail = Outcome.INTERRUPTED, str(error)
                    return delivery
                if self.leases.release(turn.turn_id, claim.epoch, 0.0, str(error)):
                    # still ours: the journal lost its last writes in a Postgres crash, so
                    # the turn starts again from what survived
                    log.warning("restarting turn %s: %s", turn.turn_id, error)
                    delivery.outcome, delivery.detail = Outcome.DEFERRED, str(error)
                    delivery.follow_up = (turn.session_id, turn.turn_id, turn.queue)
                    return delivery
                log.warning("stopping turn %s: %s", turn.turn_id, error)
                delivery.outcome, delivery.detail = Outcome.LOST, str(error)
                return delivery
            except ModelUnavailable as error:
                delay = min(settings.retry_backoff_max_seconds, 2.0 ** min(turn.attempts, 10))
                log.warning("turn %s: %s; retrying in %.0fs", turn.turn_id, error, delay)
                self.store.note_failed_call(turn.turn_id, claim.epoch)  # the spend ledger's
                self.leases.release(turn.turn_id, claim.epoch, delay, f"{error} (will retry)")
                delivery.outcome, delivery.detail = Outcome.DEFERRED, str(error)
                return delivery
            except ServiceUnavailable as error:
                delivery.outcome, delivery.detail = Outcome.INTERRUPTED, str(error)
                return delivery
            except Exception as error:  # TurnFailed, or a bug: end the turn with the reason
                if not isinstance(error, TurnFailed):
                    log.exception("turn %s: unexpected error", turn.turn_id)
                reason = (
                    str(error)
                    if isinstance(error, TurnFailed)
                    else redact(f"unexpected error: {type(error).__name__}: {error}")
                )
                log.error("turn %s failed: %s", turn.turn_id, reason)
                ended = self.leases.fail(turn.turn_id, claim.epoch, reason)
                delivery.outcome, delivery.detail = Outcome.FAILED, reason
                delivery.follow_up = ended.next_turn if ended else None
            finally:
                if runner is not None:
                    delivery.read_back, delivery.executed = runner.read_back, runner.executed
        return delivery

    def _give_up(self, claim: Claim) -> Delivery:
        turn = claim.turn
        steps = self.store.load_journal(turn.turn_id)
        where = f"step {steps[-1].step} ({steps[-1].kind} {steps[-1].name})" if steps else "start"
        reason = (
            f"gave up: the worker running this turn died {turn.crashes} times "
            f"(DURABLE_AGENT_MAX_CRASHES={self.settings.max_crashes}); last reached {where}"
        )
        log.error("turn %s: %s", turn.turn_id, reason)
        ended = self.leases.fail(turn.turn_id, claim.epoch, reason)
        return Delivery(
            turn.turn_id, Outcome.FAILED, reason, follow_up=ended.next_turn if ended else None
        )
