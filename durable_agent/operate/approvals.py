"""Approvals: a tool call that waits for a person's yes before it runs.

A tool declared ``@tool(replay="never", approval="required")``, or named in
``DURABLE_AGENT_APPROVAL_REQUIRED``, does not run when the model first calls it. The worker
records the pending call (``approvals``: turn, step, tool, arguments, idempotency key) and
parks the turn in the same statement, on the park mechanism every wait uses (see
``parking.py``): status ``waiting``, no claim, no lease, no message, a ``waits`` row of kind
``approval`` (no due time). Nothing renews anything while it waits, and the sweeper never
sends it.

``approve`` or ``deny`` decides once (a second decision is refused), wakes the turn (its
``waits`` row deleted, queued) and sends it; any worker then resumes it from its journal.
At the same step the runner reads the decision:

* approved: the call goes the usual way of a ``never`` call. Its intent (which names who
  approved and when) is committed before it runs, so a crash or a duplicate delivery after
  that never runs it again: the approval is consumed by that intent, exactly once.
* denied: the call is recorded as done without running, and the model reads "not run:
  denied by ... : reason" as the tool's result.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from ..errors import (
    InvalidArgument,
    LeaseLost,
    ReplayDiverged,
    TurnCancelled,
    TurnNotFound,
    TurnParked,
)
from ..inputs import check_id
from ..journal import Approval, Claim, Ended, OperatorStore
from ..step.tools import Tool, ToolRegistry
from .cancel import Enqueue, GetTurn, check_by, check_note, send_next

log = logging.getLogger(__name__)

Decision = Literal["approved", "denied"]


class Decisions(Protocol):
    """Where a decision is taken: ``OperatorStore`` (its own transaction), or
    ``LentApprovals`` (the application's transaction, ``approve(connection=...)``)."""

    def decide_approval(
        self, turn_id: str, step: int, decision: str, reason: str | None, decided_by: str
    ) -> tuple[str, str, str] | None: ...

    def find_approval(self, turn_id: str, step: int) -> Approval | None: ...


@dataclass
class Gate:
    """The approval gate of one claim (see ``runner.ApprovalGate``)."""

    store: OperatorStore
    turn_id: str
    epoch: int
    required: frozenset[str]
    # writes what the journal held back (the model step that asked for this call): a
    # parked turn writes nothing more until it is resumed
    before_park: Callable[[], None] = lambda: None

    def __call__(self, step: int, tool: Tool, intent: dict[str, Any]) -> dict[str, Any] | None:
        if tool.approval != "required" and tool.name not in self.required:
            return None
        found = self.store.find_approval(self.turn_id, step)
        if found is None or found.decision is None:
            self._park(step, tool, intent)
        assert found is not None and found.decision is not None
        if found.tool != tool.name or found.arguments != intent["arguments"]:
            raise ReplayDiverged(
                self.turn_id,
                step,
                f"the decision recorded for step {step} is about {found.tool}"
                f"({found.arguments}), but this run calls {tool.name}({intent['arguments']})",
                recorded=found.tool,
                current=tool.name,
            )
        who = f"{found.decision} by {found.decided_by}" + (
            f": {found.reason}" if found.reason else ""
        )
        if found.decision == "denied":
            log.info("turn %s step %d: %s %s, not run", self.turn_id, step, tool.name, who)
            return {
                "content": f"Error: {tool.name} was not run: the call was {who}.",
                "error": True,
                "denied": True,
            }
        assert found.decided_at is not None
        intent["approval"] = {
            "decided_by": found.decided_by,
            "decided_at": found.decided_at.isoformat(),
        }
        return None

    def _park(self, step: int, tool: Tool, intent: dict[str, Any]) -> None:
        self.before_park()
        parked = self.store.park_for_approval(
            self.turn_id,
            self.epoch,
            step,
            tool.name,
            intent["arguments"],
            intent.get("idempotency_key"),
        )
        if parked:
            log.warning(
                "turn %s parked at step %d: %s waits for approval", self.turn_id, step, tool.name
            )
            raise TurnParked(
                f"turn {self.turn_id} waits for approval of step {step} ({tool.name}): "
                f"durable-agent approve {self.turn_id} {step}"
            )
        cancel = self.store.find_cancellation(self.turn_id)
        if cancel is not None:
            raise TurnCancelled(f"turn {self.turn_id} cancelled by {cancel.requested_by}")
        raise LeaseLost(f"turn {self.turn_id}: not parked at step {step}, the epoch moved on")


def approval_gate(
    store: OperatorStore,
    required: frozenset[str],
    tools: ToolRegistry,
    claim: Claim,
    before_park: Callable[[], None] = lambda: None,
) -> Gate | None:
    """The gate of this claim, or None when no tool needs approval (nothing is read).
    ``required``: the tools named in ``DURABLE_AGENT_APPROVAL_REQUIRED``; ``before_park``:
    the journal's flush, called before the turn parks."""
    if not required and not any(t.approval == "required" for t in tools):
        return None
    return Gate(store, claim.turn.turn_id, claim.epoch, required, before_park)


def list_approvals(
    store: OperatorStore,
    *,
    turn_id: str | None = None,
    include_decided: bool = False,
) -> list[Approval]:
    """Calls waiting for a decision (``include_decided``: decided ones too), oldest first.
    Raises TurnNotFound for an unknown ``turn_id`` (its payloads are not opened for that)."""
    if turn_id is not None:
        check_id("turn_id", turn_id)
        if store.find_turn(turn_id) is None:  # an unknown turn is not an empty list
            raise TurnNotFound(turn_id)
    return store.list_approvals(turn_id=turn_id, include_decided=include_decided)


def decide(
    store: Decisions,
    get_turn: GetTurn,
    enqueue: Enqueue,
    turn_id: str,
    step: int,
    decision: Decision,
    *,
    reason: str | None = None,
    by: str | None = None,
) -> Approval:
    """Approve or deny the pending call at (turn, step) and send the turn on; raises
    TurnNotFound for an unknown turn, InvalidArgument when nothing is pending there."""
    check_id("turn_id", turn_id)
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise InvalidArgument(f"step must be a whole number, 0 or more, got {step!r}")
    if decision not in ("approved", "denied"):
        raise InvalidArgument(f"decision must be 'approved' or 'denied', got {decision!r}")
    reason = check_note("reason", reason, required=decision == "denied")
    who = check_by(by)
    turn = get_turn(turn_id)
    woken = store.decide_approval(turn_id, step, decision, reason, who)
    found = store.find_approval(turn_id, step)
    if woken is None:
        if found is None:
            raise InvalidArgument(f"turn {turn_id} has no call waiting for approval at step {step}")
        if found.decision is not None:
            raise InvalidArgument(
                f"step {step} of turn {turn_id} was already {found.decision} by "
                f"{found.decided_by} at {found.decided_at}"
            )
        raise InvalidArgument(f"turn {turn_id} is {turn.status}, not waiting for a decision")
    assert found is not None
    log.info("turn %s step %d %s by %s", turn_id, step, decision, who)
    send_next(enqueue, Ended(woken[0], turn.seq, woken))
    return found


def approve(
    store: Decisions,
    get_turn: GetTurn,
    enqueue: Enqueue,
    turn_id: str,
    step: int,
    *,
    note: str | None = None,
    by: str | None = None,
) -> Approval:
    """Let the pending call at (turn, step) run; the turn is sent to a worker."""
    return decide(store, get_turn, enqueue, turn_id, step, "approved", reason=note, by=by)


def deny(
    store: Decisions,
    get_turn: GetTurn,
    enqueue: Enqueue,
    turn_id: str,
    step: int,
    reason: str,
    *,
    by: str | None = None,
) -> Approval:
    """Refuse the pending call: it never runs, and the model reads the reason as its result."""
    return decide(store, get_turn, enqueue, turn_id, step, "denied", reason=reason, by=by)
