"""The journal: everything durable-agent keeps in Postgres, and the only way to it.

Turns, their steps and blobs (``store``: ``JournalStore``, ``ClaimedJournal``), claims
(``leases``), what operators record (``operator_store``: cancellations, approvals,
resolutions, pruning), parked turns, events and child turns (``waits``),
announcements (``notify``), fleet-wide passes under an advisory lock
(``passes``), the spend ledger's records (``ledger``), migrations, and the SQL itself
(``sql/``, read by ``queries`` alone). Every query is one method of a store; the modules
above import what they need from here, not from the submodules.
"""

from .audit import AuditEntry, acting_through, current_interface, set_interface
from .codec import MAX_DEPTH, ListDigest, digest, dumps, jsonb_order, storable
from .db import Database, Row, conninfo_for, describe_url, on_connection
from .holders import holder_is_dead, worker_identity
from .leases import Leases
from .ledger import Price, Spend, Tokens, parse_prices
from .lent import LentApprovals, LentWaits, record_turn
from .migrations import (
    apply_missing,
    current_version,
    latest_version,
    migrate,
    require_current,
)
from .notify import announce, listen, listen_wakes
from .operator_store import Approval, Cancellation, OperatorStore, PruneCount
from .protocol import TurnJournal
from .queries import Migration, Query, parse_queries
from .records import (
    AgentSeen,
    Claim,
    Ended,
    Kind,
    Refusal,
    Replay,
    Step,
    StepStatus,
    Turn,
    TurnFilter,
    TurnStatus,
    WorkerSeen,
)
from .rekey import RekeyCount, rekey
from .roles import DEFAULT_PREFIX, KINDS, RoleNames, create_roles, role_names, roles_sql
from .sealing import (
    MARK,
    NO_SEALING,
    SEALED_KEY,
    KeyProvider,
    Sealer,
    StaticKeys,
    Unreadable,
    Where,
    new_key,
    sealer_for,
)
from .store import ClaimedJournal, JournalStore
from .wait_store import Child, Event, Recorded, Wait, WaitKind, WaitStore

__all__ = [
    "DEFAULT_PREFIX",
    "KINDS",
    "MARK",
    "MAX_DEPTH",
    "NO_SEALING",
    "SEALED_KEY",
    "AgentSeen",
    "Approval",
    "AuditEntry",
    "Cancellation",
    "Child",
    "Claim",
    "ClaimedJournal",
    "Database",
    "Ended",
    "Event",
    "JournalStore",
    "KeyProvider",
    "Kind",
    "Leases",
    "LentApprovals",
    "LentWaits",
    "ListDigest",
    "Migration",
    "OperatorStore",
    "Price",
    "PruneCount",
    "Query",
    "Recorded",
    "Refusal",
    "RekeyCount",
    "Replay",
    "RoleNames",
    "Row",
    "Sealer",
    "Spend",
    "StaticKeys",
    "Step",
    "StepStatus",
    "Tokens",
    "Turn",
    "TurnFilter",
    "TurnJournal",
    "TurnStatus",
    "Unreadable",
    "Wait",
    "WaitKind",
    "WaitStore",
    "Where",
    "WorkerSeen",
    "acting_through",
    "announce",
    "apply_missing",
    "conninfo_for",
    "create_roles",
    "current_interface",
    "current_version",
    "describe_url",
    "digest",
    "dumps",
    "holder_is_dead",
    "jsonb_order",
    "latest_version",
    "listen",
    "listen_wakes",
    "migrate",
    "new_key",
    "on_connection",
    "parse_prices",
    "parse_queries",
    "record_turn",
    "rekey",
    "require_current",
    "role_names",
    "roles_sql",
    "sealer_for",
    "set_interface",
    "storable",
    "worker_identity",
]
