"""The journal: everything durable-agent keeps in Postgres, and the only way to it.

Turns, their steps and blobs (``store``: ``JournalStore``, ``ClaimedJournal``), claims
(``leases``), what operators record (``operator_store``: cancellations, approvals,
resolutions, pruning), announcements (``notify``), fleet-wide passes under an advisory lock
(``passes``), the spend ledger's records (``ledger``), migrations, and the SQL itself
(``sql/``, read by ``queries`` alone). Every query is one method of a store; the modules
above import what they need from here, not from the submodules.
"""

from .codec import MAX_DEPTH, ListDigest, digest, dumps, jsonb_order, storable
from .db import Database, Row, conninfo_for, describe_url, on_connection
from .holders import holder_is_dead, worker_identity
from .leases import Leases
from .ledger import Price, Spend, Tokens, parse_prices
from .lent import record_turn
from .migrations import (
    apply_missing,
    current_version,
    latest_version,
    migrate,
    require_current,
)
from .notify import announce, listen
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
from .sealing import (
    NO_SEALING,
    KeyProvider,
    Sealer,
    StaticKeys,
    Where,
    new_key,
    sealer_for,
)
from .store import ClaimedJournal, JournalStore

__all__ = [
    "MAX_DEPTH",
    "NO_SEALING",
    "AgentSeen",
    "Approval",
    "Cancellation",
    "Claim",
    "ClaimedJournal",
    "Database",
    "Ended",
    "JournalStore",
    "KeyProvider",
    "Kind",
    "Leases",
    "ListDigest",
    "Migration",
    "OperatorStore",
    "Price",
    "PruneCount",
    "Query",
    "Refusal",
    "Replay",
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
    "Where",
    "WorkerSeen",
    "announce",
    "apply_missing",
    "conninfo_for",
    "current_version",
    "describe_url",
    "digest",
    "dumps",
    "holder_is_dead",
    "jsonb_order",
    "latest_version",
    "listen",
    "migrate",
    "new_key",
    "on_connection",
    "parse_prices",
    "parse_queries",
    "record_turn",
    "require_current",
    "sealer_for",
    "storable",
    "worker_identity",
]
