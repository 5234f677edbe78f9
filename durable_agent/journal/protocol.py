"""What the runner needs of a journal: one turn's steps, written under one claim.

The runner depends on this protocol only. :class:`~durable_agent.journal.store.ClaimedJournal`
is the Postgres one (every write fenced by the claim's epoch);
:class:`durable_agent.testing.MemoryJournal` keeps the steps in memory for unit tests of your
own tools and loops; a replay uses one that refuses every write.
"""

from __future__ import annotations

from typing import Any, Protocol

from .records import Kind, Replay, Step


class TurnJournal(Protocol):
    """The journal of one turn, bound to the claim (``turn_id``, ``epoch``) that writes it.

    Each write raises :class:`~durable_agent.errors.LeaseLost` once the claim is no longer
    the turn's, or when the step is already recorded by another writer.
    """

    @property
    def turn_id(self) -> str: ...

    @property
    def epoch(self) -> int: ...

    def steps(self) -> list[Step]:
        """The steps recorded when the claim was taken, in order."""
        ...

    def insert_intent(
        self, step: int, kind: Kind, name: str, input: dict[str, Any], replay: Replay | None
    ) -> None:
        """Commit the intent of a call before it runs."""
        ...

    def insert_done(
        self,
        step: int,
        kind: Kind,
        name: str,
        input: dict[str, Any],
        replay: Replay | None,
        output: Any,
    ) -> None:
        """Record a call that ran nothing (a refused call) as done, in one write."""
        ...

    def record_outcome(self, step: int, output: Any) -> None:
        """Mark an intent done with its outcome. The outcome of a model call or a ``safe``
        tool may be held back until the next write or :meth:`flush` (re-running either
        call is allowed); the outcome of a ``never`` tool is written at once."""
        ...

    def flush(self) -> None:
        """Write whatever :meth:`record_outcome` held back (before the turn ends)."""
        ...
