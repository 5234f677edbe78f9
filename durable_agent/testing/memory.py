"""A turn's journal in memory: the :class:`~durable_agent.journal.protocol.TurnJournal` of
unit tests.

Drive your own tools and loops through the real :class:`~durable_agent.step.runner.StepRunner`
with no database: write steps, read them back in a second runner as a redelivered worker
would, take the claim away, or fail a write to act out a crash at exactly that point::

    journal = MemoryJournal()
    first = StepRunner(journal, tools=registry, guard=ClaimHeld())
    ...                                   # run some steps
    again = StepRunner(MemoryJournal(steps=journal.steps()), tools=registry, guard=ClaimHeld())

Rows go through JSON on the way in, as they do through Postgres.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from ..errors import LeaseLost
from ..journal.codec import dumps, jsonb_order
from ..journal.records import Kind, Replay, Step, StepStatus


@dataclass(frozen=True)
class Write:
    """One write the runner made: what, at which step, of which call."""

    op: Literal["intent", "done", "outcome"]
    step: int
    kind: Kind
    name: str


def make_step(
    step: int,
    kind: Kind,
    name: str,
    input: dict[str, Any],
    replay: Replay | None,
    status: StepStatus,
    output: Any = None,
    *,
    turn_id: str = "turn_test",
    epoch: int = 1,
) -> Step:
    """A journal row as Postgres would give it back (JSON round-tripped)."""
    now = datetime.now(UTC)
    return Step(
        turn_id=turn_id,
        step=step,
        kind=kind,
        name=name,
        input=jsonb_order(json.loads(dumps(input))),
        replay=replay,
        status=status,
        output=None if output is None else jsonb_order(json.loads(dumps(output))),
        epoch=epoch,
        created_at=now,
        finished_at=now if status == "done" else None,
    )


class ClaimHeld:
    """A guard whose claim always holds (for tests that do not take it away)."""

    def check(self) -> None:
        return None

    def still_claimed(self) -> bool:
        return True


class MemoryJournal:
    """One turn's steps in memory, written under one claim.

    ``before_write`` is called with each :class:`Write` before it is applied: raise from it
    to act out a crash or a lost claim at that write. ``writes`` lists the writes applied.
    After :meth:`lose_claim`, every write raises LeaseLost, as the epoch fence does.
    """

    def __init__(
        self,
        turn_id: str = "turn_test",
        epoch: int = 1,
        steps: Iterable[Step] = (),
        *,
        before_write: Callable[[Write], None] | None = None,
    ) -> None:
        self.turn_id = turn_id
        self.epoch = epoch
        self.rows: dict[int, Step] = {row.step: row for row in steps}
        self.before_write = before_write
        self.writes: list[Write] = []
        self.claim_lost = False

    def steps(self) -> list[Step]:
        return [self.rows[step] for step in sorted(self.rows)]

    def lose_claim(self) -> None:
        """Another worker took the turn over: every later write is refused."""
        self.claim_lost = True

    def insert_intent(
        self, step: int, kind: Kind, name: str, input: dict[str, Any], replay: Replay | None
    ) -> None:
        self._insert(Write("intent", step, kind, name), input, replay, "intent", None)

    def insert_done(
        self,
        step: int,
        kind: Kind,
        name: str,
        input: dict[str, Any],
        replay: Replay | None,
        output: Any,
    ) -> None:
        self._insert(Write("done", step, kind, name), input, replay, "done", output)

    def record_outcome(self, step: int, output: Any) -> None:
        row = self.rows.get(step)
        if row is None or row.status != "intent":
            raise AssertionError(f"step {step} has no intent waiting for an outcome")
        self._apply(Write("outcome", step, row.kind, row.name))
        self.rows[step] = make_step(
            step,
            row.kind,
            row.name,
            row.input,
            row.replay,
            "done",
            output,
            turn_id=self.turn_id,
            epoch=self.epoch,
        )

    def flush(self) -> None:
        """Nothing to do: every write above is applied when it is made."""

    def _insert(
        self,
        write: Write,
        input: dict[str, Any],
        replay: Replay | None,
        status: StepStatus,
        output: Any,
    ) -> None:
        if write.step in self.rows:
            raise LeaseLost(
                f"turn {self.turn_id}: step {write.step} is already recorded by another writer"
            )
        self._apply(write)
        self.rows[write.step] = make_step(
            write.step,
            write.kind,
            write.name,
            input,
            replay,
            status,
            output,
            turn_id=self.turn_id,
            epoch=self.epoch,
        )

    def _apply(self, write: Write) -> None:
        if self.before_write is not None:
            self.before_write(write)
        if self.claim_lost:
            raise LeaseLost(f"turn {self.turn_id}: {write.op} of step {write.step} rejected")
        self.writes.append(write)
