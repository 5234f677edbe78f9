"""Replay a finished turn from its journal with the model client switched off.

The turn is recomputed exactly as a redelivered worker would compute it, except that the
model may not be called, no tool may run and nothing may be written. It must produce the
recorded reply with zero model calls; otherwise the report names the step where the replay
diverged and why (a changed system prompt, a changed tool, a journal missing an outcome).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import DurableAgentError, TurnFailed
from ..journal.records import Kind, Replay, Step
from ..step.loop import run_loop
from ..step.model import ModelSwitchedOff
from ..step.runner import StepRunner
from ..step.tools import ToolRegistry

if TYPE_CHECKING:
    from ..runtime import Runtime


class ReplayWrite(TurnFailed):
    """The replay needed to write: the journal has no outcome for a step."""


class ReadOnlyJournal:
    """A turn's recorded steps, for a replay: any write means the journal was incomplete."""

    def __init__(self, turn_id: str, epoch: int, steps: list[Step]) -> None:
        self.turn_id = turn_id
        self.epoch = epoch
        self._steps = steps

    def steps(self) -> list[Step]:
        return self._steps

    def insert_intent(
        self, step: int, kind: Kind, name: str, input: dict[str, Any], replay: Replay | None
    ) -> None:
        raise ReplayWrite(
            f"step {step} ({kind} {name}) is not in the journal: the replay needed to run it"
        )

    def insert_done(
        self,
        step: int,
        kind: Kind,
        name: str,
        input: dict[str, Any],
        replay: Replay | None,
        output: Any,
    ) -> None:
        raise ReplayWrite(f"step {step} ({kind} {name}) is not in the journal")

    def record_outcome(self, step: int, output: Any) -> None:
        raise ReplayWrite(f"step {step} has an intent but no outcome in the journal")

    def flush(self) -> None:
        """Nothing is ever held: every write is refused."""


class _Unfenced:
    def check(self) -> None:
        return None

    def still_claimed(self) -> bool:
        return False


@dataclass
class ReplayReport:
    turn_id: str
    recorded_reply: str | None
    replayed_reply: str | None
    model_calls: int
    steps_in_journal: int
    steps_replayed: int
    diverged_at: int | None
    reason: str | None

    @property
    def ok(self) -> bool:
        return (
            self.reason is None
            and self.model_calls == 0
            and self.replayed_reply == self.recorded_reply
            and self.steps_replayed == self.steps_in_journal
        )

    def to_json(self) -> dict[str, Any]:
        return {**self.__dict__, "ok": self.ok}

    def describe(self) -> str:
        """What the replay found, in words."""
        if self.ok:
            return (
                f"replayed {self.turn_id}: {self.steps_replayed} steps read back, "
                f"{self.model_calls} model calls, same reply:\n{self.replayed_reply}"
            )
        return (
            f"diverged {self.turn_id} at step {self.diverged_at}: {self.reason} "
            f"({self.model_calls} model calls attempted, "
            f"{self.steps_replayed}/{self.steps_in_journal} steps)"
        )


def replay_turn(runtime: Runtime, turn_id: str) -> ReplayReport:
    """Recompute a finished turn from its journal alone."""
    store, settings = runtime.journal, runtime.settings
    turn = runtime.get_turn(turn_id)
    if turn.status != "done":
        raise DurableAgentError(
            f"turn {turn_id} is {turn.status}: only a done turn has a reply to replay"
        )
    journal = store.load_journal(turn_id)
    agent = runtime.agents.get(turn.agent)
    if agent is None:
        raise DurableAgentError(
            f"turn {turn_id} belongs to agent {turn.agent!r}, which no module here defines"
        )
    inert = ToolRegistry()  # no tool can run: every tool step must be read back
    model = ModelSwitchedOff()
    runner = StepRunner(
        ReadOnlyJournal(turn_id, turn.lease_epoch, journal),
        tools=inert,
        guard=_Unfenced(),
        max_steps=max(settings.max_steps, len(journal) + 1),
        strict=True,
    )
    history = store.session_history(turn.session_id, turn.seq)
    # the agent's tool schemas (its requests must be the recorded ones), none of its tools
    ctx = agent.context(runner, model, turn, history)
    reply: str | None = None
    reason: str | None = None
    try:
        reply = run_loop(agent.loop, ctx)
    except TurnFailed as error:
        reason = str(error)
    diverged_at = None if reason is None else max(runner.next_step - 1, 0)
    if reason is None and reply != turn.reply:
        reason, diverged_at = "the replayed reply differs from the recorded one", runner.next_step
    if reason is None and runner.next_step != len(journal):
        diverged_at = runner.next_step
        reason = f"the replay ended after {runner.next_step} of {len(journal)} recorded steps"
    return ReplayReport(
        turn_id=turn_id,
        recorded_reply=turn.reply,
        replayed_reply=reply,
        model_calls=model.calls,
        steps_in_journal=len(journal),
        steps_replayed=runner.next_step,
        diverged_at=diverged_at,
        reason=reason,
    )
