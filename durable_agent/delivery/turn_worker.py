"""What a worker does with one delivery of a turn: claim, run, finish, or step aside.

Every delivery first claims the turn in Postgres. A delivery that finds the turn finished
does nothing; one that finds a live claim of another worker (or an earlier turn of the
session still open) does not run it: the sweeper re-sends the turn from Postgres when it is
due, so a turn whose worker died is never left without a message.
"""

from __future__ import annotations

import contextlib
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from ..errors import (
    BudgetExhausted,
    KeyUnavailable,
    LeaseLost,
    ModelUnavailable,
    PayloadTampered,
    ServiceUnavailable,
    TurnCancelled,
    TurnFailed,
    TurnParked,
)
from ..journal import (
    Claim,
    ClaimedJournal,
    JournalStore,
    Leases,
    OperatorStore,
    Refusal,
    WaitStore,
    worker_identity,
)
from ..operate.approvals import approval_gate
from ..operate.budgets import Budgets
from ..operate.cancel import end_cancelled, stop_if_cancelled
from ..operate.parking import Parking
from ..operate.tokens import TokenStreams
from ..redact import redact
from ..settings import Settings
from ..step.agents import AgentBook, BoundAgent, changes
from ..step.faults import Faults
from ..step.loop import run_loop
from ..step.observe import StepObserver
from ..step.runner import StepRunner
from .heartbeat import Heartbeat
from .outage import Outage

ModelCall = Callable[[dict[str, Any]], dict[str, Any]]
ObserveSteps = Callable[[Claim], StepObserver]
"""Gives the observer of one claimed delivery's steps (the tracer's, when tracing is on)."""

log = logging.getLogger(__name__)

UNKNOWN_AGENT_RETRY_SECONDS = 30.0
HAND_BACK_SECONDS = 30.0
"""How long a turn this worker handed back, and received again, waits before it is sent."""
MISSING_KEY_FIRST_SECONDS = 15.0
MISSING_KEY_MAX_SECONDS = 300.0
"""A turn with a row sealed under a key this worker lacks is handed back to wait this long
(doubling with each attempt of the turn, up to the most) for a worker that holds the key."""


def missing_key_delay(attempts: int) -> float:
    """How long a turn handed back for a missing key waits before it is sent again."""
    doublings = min(max(attempts - 1, 0), 8)
    return min(MISSING_KEY_MAX_SECONDS, MISSING_KEY_FIRST_SECONDS * 2.0**doublings)


class Outcome(StrEnum):
    """What became of one delivery."""

    DONE = "done"  # the turn finished with a reply
    FAILED = "failed"  # the turn ended as failed, with the reason
    REFUSED = "refused"  # not run: finished, held by another worker, waiting or deferred
    DEFERRED = "deferred"  # given back (the model API kept failing, or the journal lost its
    # last writes in a Postgres crash); the turn runs again after a backoff, or at once
    LOST = "lost"  # another worker took the turn over mid-run; this one stopped
    CANCELLED = "cancelled"  # cancelled on request; stopped at a step boundary
    PARKED = "parked"  # it waits (approval, time, event, child); what it waits for sends it
    INTERRUPTED = "interrupted"  # Postgres could not be reached; the message goes back


@dataclass
class Delivery:
    """What became of one delivery, and what the caller should enqueue."""

    turn_id: str
    outcome: Outcome
    detail: str = ""
    follow_up: tuple[str, str, str] | None = None  # (session_id, turn_id, queue) to enqueue
    next_of_key: tuple[str, str, str] | None = None  # the turn its concurrency key lets in
    read_back: list[int] = field(default_factory=list)
    executed: list[int] = field(default_factory=list)


class TurnWorker:
    """Runs turns for one worker process, with the parts the runtime hands it: the
    journal, the claims, the operators' records (cancels, approvals), the agents this
    process serves, the model client and the process's view of Postgres outages."""

    def __init__(
        self,
        settings: Settings,
        *,
        store: JournalStore,
        leases: Leases,
        operator_store: OperatorStore,
        agents: AgentBook,
        model: ModelCall,
        outage: Outage,
        faults: Faults | None = None,
        tokens: TokenStreams | None = None,
        budgets: Budgets | None = None,
        observe_steps: ObserveSteps | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.leases = leases
        self.operator_store = operator_store
        self.agents = agents
        self.model = model
        self.outage = outage
        self.tokens = tokens  # where streamed answers' text goes (None: nowhere)
        self.budgets = budgets  # the fleet's model budgets (None: none configured)
        self.faults = faults if faults is not None else Faults.from_env()
        self.waits = WaitStore(store.db)
        self.observe_steps = observe_steps
        self._handed_back: dict[str, float] = {}  # turn id -> when this process handed it back
        self._told_back: set[str] = set()  # turns whose coming back was logged

    def handle(self, turn_id: str) -> Delivery:
        self.faults.maybe_crash_before_claim()
        claim = self.leases.claim(
            turn_id,
            worker_identity(),
            self.settings.lease_seconds,
            self.agents.queues,
            self.agents.served_specs,
        )
        if isinstance(claim, Refusal):
            if claim.reason == "elsewhere":
                return self._hand_back(turn_id, claim.detail)
            if claim.reason == "key_busy":  # woken when a turn of its key ends
                self.leases.wait_for_key(turn_id)
                return Delivery(turn_id, Outcome.REFUSED, claim.detail)
            log.info("delivery of %s not run: %s", turn_id, claim.detail)
            return Delivery(turn_id, Outcome.REFUSED, claim.detail)
        if claim.turn.unreadable:  # its message does not open here
            delivery = self._unreadable(claim)
        elif claim.turn.crashes >= self.settings.max_crashes:
            delivery = self._give_up(claim)
        else:
            agent = self.agents.get(claim.turn.agent)
            if agent is None or not self.agents.serves(agent.name):
                return self._not_served(claim)
            delivery = self._run(claim, agent)
        if self.leases.key_limit is not None and delivery.outcome not in (
            Outcome.LOST,
            Outcome.INTERRUPTED,
        ):  # its slot is free: the oldest waiting turn of its key goes next
            delivery.next_of_key = self.leases.wake_next_of_key(turn_id)
        return delivery

    def _hand_back(self, turn_id: str, why: str) -> Delivery:
        """A turn of a queue this worker does not serve goes back to its own queue. If it
        comes back here within HAND_BACK_SECONDS (this worker consumes that queue too, which
        the start check refuses, or workers of mixed settings), it is not sent again at once:
        it waits that long in Postgres and the sweeper sends it then, to whichever worker of
        its queue takes it. Said once per turn, not per delivery."""
        now = time.monotonic()
        for old in [t for t, at in self._handed_back.items() if now - at > HAND_BACK_SECONDS]:
            del self._handed_back[old]
            self._told_back.discard(old)
        delivery = Delivery(turn_id, Outcome.REFUSED, why)
        if turn_id not in self._handed_back:
            log.info("delivery of %s not run: %s; handed back", turn_id, why)
            self._handed_back[turn_id] = now
            turn = self.store.find_turn(turn_id, marked=True)  # its ids, not its payloads
            if turn is not None:
                delivery.follow_up = (turn.session_id, turn.turn_id, turn.queue)
            return delivery
        self.store.defer_unclaimed(turn_id, HAND_BACK_SECONDS)
        if turn_id not in self._told_back:
            self._told_back.add(turn_id)
            log.warning(
                "turn %s came back to this worker after it handed it back (%s): it waits "
                "%.0fs for a worker that serves its queue, then the sweeper sends it again",
                turn_id,
                why,
                HAND_BACK_SECONDS,
            )
        delivery.detail = f"{why}; handed back before, waits {HAND_BACK_SECONDS:.0f}s"
        return delivery

    def _not_served(self, claim: Claim) -> Delivery:
        """A turn of an agent this worker does not define (or serve): given back, to be
        sent again after a while, without counting as a crash."""
        turn = claim.turn
        if self.agents.get(turn.agent) is None:
            why = (
                f"no agent named {turn.agent!r} is defined in this worker's modules "
                f"(known: {', '.join(self.agents.names())}); waiting for a worker that has it"
            )
        else:
            why = f"agent {turn.agent!r} is not served by this worker; waiting for one that is"
        log.warning("turn %s: %s", turn.turn_id, why)
        self.leases.release(turn.turn_id, claim.epoch, UNKNOWN_AGENT_RETRY_SECONDS, why)
        return Delivery(turn.turn_id, Outcome.DEFERRED, why)

    def _unreadable(self, claim: Claim) -> Delivery:
        """A turn whose message does not open here: failed if it was altered or moved (no
        worker can ever open it), handed back if this worker lacks its key."""
        unreadable = claim.turn.unreadable
        tampered = next((u for u in unreadable if u.reason == "tampered"), None)
        if tampered is not None:
            return self._fail(claim, tampered.detail)
        return self._wait_for_key(claim, unreadable[0].detail)

    def _fail(self, claim: Claim, tampered: str) -> Delivery:
        """End a turn a stored value of which does not open (PayloadTampered): one line
        naming the row and field, no traceback; sending it again could not help."""
        turn = claim.turn
        reason = f"a stored value does not open: {tampered}"
        log.error("turn %s failed: %s", turn.turn_id, reason)
        ended = self.leases.fail(turn.turn_id, claim.epoch, reason)
        return Delivery(
            turn.turn_id, Outcome.FAILED, reason, follow_up=ended.next_turn if ended else None
        )

    def _wait_for_key(self, claim: Claim, missing: str) -> Delivery:
        """A row of the turn is sealed with a key this worker does not hold (KeyUnavailable):
        the turn is given back, not failed and not counted as a crash, to be sent again
        after ``missing_key_delay`` for a worker that holds the key. It waits visibly
        (queued, the reason in its error) until one does, or someone cancels it."""
        turn = claim.turn
        delay = missing_key_delay(turn.attempts)
        why = f"waits for a worker that holds its key: {missing}"
        log.warning("turn %s handed back: %s; sent again in %.0fs", turn.turn_id, why, delay)
        self.leases.release(turn.turn_id, claim.epoch, delay, why)
        return Delivery(turn.turn_id, Outcome.DEFERRED, why)

    def _note_agent(self, claim: Claim, agent: BoundAgent) -> None:
        """Record the agent's digest the first time; report a changed agent after."""
        turn = claim.turn
        digest = agent.digest
        if turn.agent_digest == digest and turn.agent_changes is None:
            return
        changed = None
        if turn.agent_digest is not None and turn.agent_digest != digest:
            changed = "; ".join(changes(turn.agent_spec or {}, agent.spec())) or "digest changed"
            log.warning(
                "turn %s resumes under a changed agent %r (digest %s -> %s): %s",
                turn.turn_id,
                agent.name,
                turn.agent_digest[:12],
                digest[:12],
                changed,
            )
        self.store.record_turn_agent(turn.turn_id, claim.epoch, digest, agent.spec(), changed)
        if changed is not None:
            self.operator_store.audit(
                "agent_changed",
                claim.owner,
                turn_id=turn.turn_id,
                before={"agent": agent.name, "digest": turn.agent_digest},
                after={"agent": agent.name, "digest": digest, "changes": changed},
                interface="worker",
            )

    def _run(self, claim: Claim, agent: BoundAgent) -> Delivery:
        turn = claim.turn
        settings = self.settings
        delivery = Delivery(turn.turn_id, Outcome.DONE)
        runner: StepRunner | None = None
        parking: Parking | None = None
        # the first claim of a turn finds no journal: none is read then
        # the outcome of a never call that ran is kept through a Postgres outage
        journal = self.store.for_claim(
            turn.turn_id,
            claim.epoch,
            empty=claim.epoch == 1,
            wait_for_postgres=self._wait_for_postgres,
        )
        with Heartbeat(self.leases, turn.turn_id, claim.epoch, settings.lease_seconds) as beat:
            try:
                if turn.attempts > 1:  # resuming: a cancel asked meanwhile stops it here
                    stop_if_cancelled(self.operator_store, turn.turn_id)
                self._note_agent(claim, agent)
                parking = Parking(
                    self.waits,
                    self.store,
                    self.operator_store,
                    turn.turn_id,
                    claim.epoch,
                    self._agent_queue,
                    settings.max_child_depth,
                    journal.flush,
                )
                runner = StepRunner(
                    journal,
                    tools=agent.tools,
                    guard=beat,
                    faults=self.faults,
                    max_steps=agent.max_steps,
                    approval_gate=approval_gate(
                        self.operator_store,
                        settings.approval_tools,
                        agent.tools,
                        claim,
                        journal.flush,
                    ),
                    parking=parking,
                    observer=self.observe_steps(claim) if self.observe_steps else None,
                )
                # the first turn of a session has no history: none is read then
                history = self.store.session_history(turn.session_id, turn.seq) if turn.seq else []
                sink = self.tokens.for_claim(turn.turn_id, claim.epoch) if self.tokens else None
                ctx = agent.context(runner, self.model, turn, history, sink, self.budgets)
                reply = run_loop(agent.loop, ctx)
                beat.check()
                # the last model call's outcome, held back, is written with the end
                ended = self.leases.finish(turn.turn_id, claim.epoch, reply, journal.take_held())
                if ended is None:
                    raise self.store.lost(turn.turn_id, claim.epoch, "the reply")
                delivery.detail, delivery.follow_up = reply, ended.next_turn
                if ended.status == "cancelled":  # asked before the end committed
                    log.warning(
                        "turn %s cancelled at its end; the reply stays in the journal", turn.turn_id
                    )
                    delivery.outcome = Outcome.CANCELLED
                    delivery.detail = f"cancelled at the end of the turn (reply: {reply[:200]})"
            except TurnCancelled as error:  # operate/cancel.py
                _flush_quietly(journal)  # a call that ran before the cancel keeps its outcome
                ended = end_cancelled(self.operator_store, turn.turn_id, claim.epoch)
                delivery.outcome, delivery.detail = Outcome.CANCELLED, str(error)
                delivery.follow_up = ended.next_turn if ended else None
            except TurnParked as error:  # approvals.py, parking.py
                delivery.outcome, delivery.detail = Outcome.PARKED, str(error)
                delivery.follow_up = parking.to_send if parking else None  # a child it started
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
            except BudgetExhausted as error:  # waits for room without its worker; no failure
                delay = error.retry_after + random.uniform(0, 0.2)
                log.info("turn %s: %s; waits %.1fs", turn.turn_id, error, delay)
                _flush_quietly(journal)
                self.leases.release(turn.turn_id, claim.epoch, delay, f"waiting: {error}")
                delivery.outcome, delivery.detail = Outcome.DEFERRED, str(error)
                return delivery
            except ModelUnavailable as error:
                delay = min(settings.retry_backoff_max_seconds, 2.0 ** min(turn.attempts, 10))
                log.warning("turn %s: %s; retrying in %.0fs", turn.turn_id, error, delay)
                self.store.note_failed_call(turn.turn_id, claim.epoch)  # the spend ledger's
                _flush_quietly(journal)
                self.leases.release(turn.turn_id, claim.epoch, delay, f"{error} (will retry)")
                delivery.outcome, delivery.detail = Outcome.DEFERRED, str(error)
                return delivery
            except ServiceUnavailable as error:
                delivery.outcome, delivery.detail = Outcome.INTERRUPTED, str(error)
                return delivery
            except KeyUnavailable as error:  # a row this worker cannot open: not its to run
                _flush_quietly(journal)
                return self._wait_for_key(claim, str(error))
            except PayloadTampered as error:  # a row no worker can open: the turn ends
                _flush_quietly(journal)
                failed = self._fail(claim, str(error))
                delivery.outcome, delivery.detail = failed.outcome, failed.detail
                delivery.follow_up = failed.follow_up
            except Exception as error:  # TurnFailed, or a bug: end the turn with the reason
                if not isinstance(error, TurnFailed):
                    log.exception("turn %s: unexpected error", turn.turn_id)
                reason = (
                    str(error)
                    if isinstance(error, TurnFailed)
                    else redact(f"unexpected error: {type(error).__name__}: {error}")
                )
                log.error("turn %s failed: %s", turn.turn_id, reason)
                _flush_quietly(journal)
                ended = self.leases.fail(turn.turn_id, claim.epoch, reason)
                delivery.outcome, delivery.detail = Outcome.FAILED, reason
                delivery.follow_up = ended.next_turn if ended else None
            finally:
                if runner is not None:
                    delivery.read_back, delivery.executed = runner.read_back, runner.executed
        return delivery

    def _agent_queue(self, name: str) -> str | None:
        agent = self.agents.get(name)
        return agent.queue if agent is not None else None

    def _wait_for_postgres(self, error: ServiceUnavailable) -> None:
        self.outage.report(error)
        self.outage.wait()

    def _give_up(self, claim: Claim) -> Delivery:
        turn = claim.turn
        steps = self.store.load_journal(turn.turn_id, marked=True)  # kind and name only
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


def _flush_quietly(journal: ClaimedJournal) -> None:
    """Write what the journal held back before the turn is given back or failed; a claim
    lost by now has nothing more to write, and the turn ends or is released regardless."""
    with contextlib.suppress(LeaseLost):
        journal.flush()
