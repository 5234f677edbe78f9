"""What protects the journal, as an operator runs it: rekey (every payload sealed again
under the newest key, recorded in the audit trail) and the audit trail's listing."""

from __future__ import annotations

import logging
from datetime import datetime

from ..errors import InvalidArgument
from ..inputs import check_count
from ..journal import AuditEntry, Database, OperatorStore, RekeyCount, rekey
from .cancel import check_by

log = logging.getLogger(__name__)

ACTIONS = ("approve", "deny", "resolve", "cancel", "prune", "rekey", "agent_changed")


def rekey_payloads(
    db: Database, store: OperatorStore, *, batch: int = 500, by: str | None = None
) -> RekeyCount:
    """Seal every payload not yet under the newest key with it, in batches, while turns
    run; one audit entry with the counts."""
    check_count("batch", batch, 10_000)
    who = check_by(by)
    count = rekey(db, batch=batch)
    log.info("rekey: %s", count.as_json())
    store.audit(
        "rekey",
        who,
        before={"keys": dict(count.from_keys)},
        after={"key": count.newest, "resealed": dict(count.resealed)},
    )
    return count


def audit_entries(
    store: OperatorStore,
    *,
    turn_id: str | None = None,
    action: str | None = None,
    since: datetime | None = None,
    limit: int = 100,
) -> list[AuditEntry]:
    """The audit trail, newest first (one turn's, one action's, since a time)."""
    check_count("limit", limit, 100_000)
    if action is not None and action not in ACTIONS:
        raise InvalidArgument(f"action must be one of {', '.join(ACTIONS)}")
    return store.audit_entries(turn_id=turn_id, action=action, since=since, limit=limit)
