"""What an operator calls: cancel a turn, prune old ones, the uncertain-effects inbox and
approvals, rekey and the audit trail. The same as the command line (``durable-agent cancel /
prune / uncertain / resolve / approvals / approve / deny / rekey / audit``), on the runtime
of the settings given (the environment's when none). ``by`` says who acts (default
``user@host``); every action is recorded with it and the time in the audit trail (as taken
through ``python``).
"""

from __future__ import annotations

from datetime import datetime

from ..journal import Approval, AuditEntry, PruneCount, RekeyCount
from ..operate import approvals, protection, retention, uncertain
from ..operate import cancel as control
from ..operate.approvals import Decision
from ..operate.cancel import CancelResult
from ..operate.uncertain import UncertainEffect, Verdict
from ..runtime import Runtime, runtime_for
from ..settings import Settings


def cancel_turn(
    turn_id: str,
    reason: str | None = None,
    *,
    by: str | None = None,
    settings: Settings | None = None,
) -> CancelResult:
    """Stop the turn at its next step boundary (at once when no worker holds it); it ends
    ``cancelled`` with who and why, and its session goes on. Never cuts a call in half."""
    runtime = runtime_for(settings)
    return control.cancel(
        runtime.operator_store,
        runtime.enqueue,
        turn_id,
        reason,
        by=by,
        store_end=runtime.store_end,
    )


def prune(
    older_than: float | str,
    *,
    dry_run: bool = False,
    batch: int = 500,
    by: str | None = None,
    settings: Settings | None = None,
) -> PruneCount:
    """Delete finished turns that ended longer ago than ``older_than`` (seconds, or an age
    such as ``"30d"``), with their journal and the blobs nothing refers to any more; keeps
    turns with unresolved uncertain effects and sessions that still have an open turn."""
    store = runtime_for(settings).operator_store
    return retention.prune(store, older_than, dry_run=dry_run, batch=batch, by=by)


def list_uncertain(
    *,
    since: datetime | None = None,
    include_resolved: bool = False,
    turn_id: str | None = None,
    agent: str | None = None,
    settings: Settings | None = None,
) -> list[UncertainEffect]:
    """Calls of ``never`` tools whose outcome is unknown, oldest first (unresolved ones by
    default), of one turn or one agent's turns if asked."""
    runtime = runtime_for(settings)
    return uncertain.list_uncertain(
        runtime.operator_store,
        runtime.journal,
        since=since,
        include_resolved=include_resolved,
        turn_id=turn_id,
        agent=agent,
    )


def resolve_uncertain(
    turn_id: str,
    step: int,
    verdict: Verdict,
    *,
    note: str | None = None,
    by: str | None = None,
    replace: bool = False,
    settings: Settings | None = None,
) -> UncertainEffect:
    """Record whether the effect happened (``happened``, ``not_happened``, ``ignored``); an
    effect with a verdict keeps it (InvalidArgument naming it) unless ``replace``."""
    runtime = runtime_for(settings)
    return uncertain.resolve(
        runtime.operator_store,
        runtime.journal,
        turn_id,
        step,
        verdict,
        note=note,
        by=by,
        replace=replace,
    )


def list_approvals(
    *,
    turn_id: str | None = None,
    include_decided: bool = False,
    settings: Settings | None = None,
) -> list[Approval]:
    """Tool calls waiting for a decision, oldest first."""
    runtime = runtime_for(settings)
    return approvals.list_approvals(
        runtime.operator_store, turn_id=turn_id, include_decided=include_decided
    )


def approve(
    turn_id: str,
    step: int,
    *,
    note: str | None = None,
    by: str | None = None,
    settings: Settings | None = None,
    connection: object | None = None,
) -> Approval:
    """Let the waiting call at (turn, step) run; any worker resumes the turn.

    ``connection``: take the decision (and its audit entry) in your own transaction, on a
    SQLAlchemy ``Session`` or ``Connection`` (psycopg 3 driver) or a psycopg 3 connection;
    the turn is sent only after that transaction commits, and a rollback leaves the call
    undecided and the turn waiting (see ``start_turn(connection=...)``). The returned
    approval is as your transaction sees it."""
    runtime = runtime_for(settings)
    if connection is not None:
        return _decide_in_transaction(runtime, connection, turn_id, step, "approved", note, by)
    return approvals.approve(
        runtime.operator_store, runtime.get_turn, runtime.enqueue, turn_id, step, note=note, by=by
    )


def deny(
    turn_id: str,
    step: int,
    reason: str,
    *,
    by: str | None = None,
    settings: Settings | None = None,
    connection: object | None = None,
) -> Approval:
    """Refuse the waiting call: it never runs; the model reads the reason as its result.
    ``connection``: in your own transaction, as for :func:`approve`."""
    runtime = runtime_for(settings)
    if connection is not None:
        return _decide_in_transaction(runtime, connection, turn_id, step, "denied", reason, by)
    return approvals.deny(
        runtime.operator_store, runtime.get_turn, runtime.enqueue, turn_id, step, reason, by=by
    )


def _decide_in_transaction(
    runtime: Runtime,
    connection: object,
    turn_id: str,
    step: int,
    decision: Decision,
    reason: str | None,
    by: str | None,
) -> Approval:
    from .wakes import decide_in_transaction

    return decide_in_transaction(
        runtime, runtime.get_turn, connection, turn_id, step, decision, reason=reason, by=by
    )


def rekey(
    *, batch: int = 500, by: str | None = None, settings: Settings | None = None
) -> RekeyCount:
    """Seal every payload not yet under the newest key (``DURABLE_AGENT_KEYS``' first) with
    it, in batches, while turns run; clear rows written before a key was configured too."""
    runtime = runtime_for(settings)
    return protection.rekey_payloads(runtime.database, runtime.operator_store, batch=batch, by=by)


def audit_trail(
    *,
    turn_id: str | None = None,
    action: str | None = None,
    since: datetime | None = None,
    limit: int = 100,
    settings: Settings | None = None,
) -> list[AuditEntry]:
    """The operators' actions, newest first: who, when, what, through which interface, the
    state before and after."""
    store = runtime_for(settings).operator_store
    return protection.audit_entries(store, turn_id=turn_id, action=action, since=since, limit=limit)
