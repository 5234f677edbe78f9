"""The durable step journal in Postgres: named queries, claims and migrations."""

from .db import Database
from .holders import holder_is_dead, worker_identity
from .leases import Leases
from .migrations import migrate, require_current
from .records import AgentSeen, Claim, Refusal, Step, Turn, TurnFilter, TurnStatus, WorkerSeen
from .store import JournalStore

__all__ = [
    "AgentSeen",
    "Claim",
    "Database",
    "JournalStore",
    "Leases",
    "Refusal",
    "Step",
    "Turn",
    "TurnFilter",
    "TurnStatus",
    "WorkerSeen",
    "holder_is_dead",
    "migrate",
    "require_current",
    "worker_identity",
]
