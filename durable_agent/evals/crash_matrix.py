"""The crash matrix: crash a real worker at every step of a turn, twice, and count.

A clean turn that uses both kinds of tool runs first. Then, for every step of it and both
crash points (``before_run``: intent committed, call not run; ``after_run``: call returned,
outcome not recorded), a worker started with ``CRASH_AT`` dies at exactly that point and a
fresh worker finishes the turn through the system's own recovery path: the sweeper finds
the expired claim in Postgres and re-enqueues the turn, the new worker claims it and replays
the journal. Per crash point it records the three numbers of the pattern's exercise (model
calls repeated for finished steps, emails received, same reply as the clean run) and the
time from the crash to the finished turn.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from ..faults import POINTS
from ..journal import JournalStore, Step
from .stack import EvalStack, crash_and_recover

MESSAGE = "Email the note 'launch' to ada@example.com"


@dataclass
class PointResult:
    step: int
    point: str
    call: str
    turn_id: str
    crashed: bool
    model_requests: int
    repeated_finished: int
    repeated_interrupted: int
    emails: int
    same_reply: bool
    recovery_seconds: float | None
    status: str
    reply: str | None
    wasted_calls: int = 0  # the spend ledger's crash waste of the turn
    wasted_tokens: int = 0  # prompt tokens, and completion tokens estimated
    saved_calls: int = 0  # finished model calls the journal gave back instead
    saved_tokens: int = 0

    @property
    def ok(self) -> bool:
        return (
            self.crashed
            and self.status == "done"
            and self.repeated_finished == 0
            and self.emails == 1
            and self.same_reply
        )


@dataclass
class MatrixReport:
    message: str
    clean_reply: str
    clean_steps: list[str]
    clean_model_requests: int
    relabel: dict[str, str]
    lease_seconds: float
    sweep_interval_seconds: float
    points: list[PointResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return bool(self.points) and all(p.ok for p in self.points)

    @property
    def failures(self) -> list[PointResult]:
        return [p for p in self.points if not p.ok]

    def ledger_line(self) -> str:
        """What the crashes cost and what the journal saved, by the spend ledger."""
        wasted = sum(p.wasted_calls for p in self.points)
        tokens = sum(p.wasted_tokens for p in self.points)
        saved = sum(p.saved_calls for p in self.points)
        saved_tokens = sum(p.saved_tokens for p in self.points)
        return (
            f"spend ledger: the crashes wasted {wasted} model call(s), ~{tokens} tokens "
            f"(completions estimated); the journal saved {saved} call(s), {saved_tokens} tokens"
        )

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        for point, result in zip(data["points"], self.points, strict=True):
            point["ok"] = result.ok
        data["passed"] = self.passed
        data["targets"] = {
            "repeated_finished": 0,
            "emails": 1,
            "same_reply": True,
            "note": "an interrupted model call (after_run at a model step) may run once more",
        }
        return data


def describe(step: Step) -> str:
    return f"{step.kind} {step.name}" + (f" ({step.replay})" if step.kind == "tool" else "")


def run_crash_matrix(
    stack: EvalStack,
    *,
    message: str = MESSAGE,
    relabel: dict[str, str] | None = None,
    only: list[tuple[int | str, str]] | None = None,
    progress: Callable[[str, int, int], None] = lambda text, done, total: None,
    timeout: float = 60.0,
) -> MatrixReport:
    """Run the clean turn, then every (step, point), or only the points named in ``only``
    (a step number or a tool name, and a crash point); the stack must use the email policy."""
    settings, runtime = stack.settings, stack.runtime
    model, inbox = stack.model, stack.inbox
    assert model is not None, "the crash matrix needs the scripted model (it counts requests)"
    store = runtime.journal
    run_id = uuid.uuid4().hex[:8]
    progress("clean run", 0, 1)
    worker = stack.start_worker(f"clean-{run_id}")
    model.reset_counts()
    inbox.clear()
    clean_id = runtime.start_turn(f"crash-matrix-{run_id}-clean", message)
    clean = runtime.wait_for_turn(clean_id, timeout)
    worker.stop()
    if clean.status != "done":
        raise RuntimeError(f"the clean turn failed: {clean.error}")
    steps = store.load_journal(clean_id)
    report = MatrixReport(
        message=message,
        clean_reply=clean.reply or "",
        clean_steps=[describe(s) for s in steps],
        clean_model_requests=model.request_count,
        relabel=relabel or {},
        lease_seconds=settings.lease_seconds,
        sweep_interval_seconds=settings.sweep_interval_seconds,
        notes=list(stack.notes),
    )
    chosen = [
        (s, p)
        for s in steps
        for p in POINTS
        if only is None or any(target in (s.step, s.name) and p == at for target, at in only)
    ]
    if not chosen:
        raise ValueError(f"no step of the clean turn matches {only}")
    total = len(chosen)
    for index, (step, point) in enumerate(chosen):
        progress(f"step {step.step} {point}", index, total)
        report.points.append(
            _crash_once(stack, store, step, point, message, clean.reply or "", run_id, timeout)
        )
    progress("done", total, total)
    return report


def _crash_once(
    stack: EvalStack,
    store: JournalStore,
    step: Step,
    point: str,
    message: str,
    clean_reply: str,
    run_id: str,
    timeout: float,
) -> PointResult:
    model, inbox = stack.model, stack.inbox
    assert model is not None
    model.reset_counts()
    inbox.clear()
    session = f"crash-matrix-{step.step}-{point}-{run_id}"
    run = crash_and_recover(stack, session, message, f"{step.step}:{point}", timeout)
    interrupted_model_call = step.kind == "model" and point == "after_run"
    repeated = model.repeated_requests()
    allowed = 1 if interrupted_model_call else 0
    spend = stack.runtime.get_turn(run.turn.turn_id).spend
    assert spend is not None
    waste, saved = spend.crash_waste, spend.journal_saved
    return PointResult(
        step=step.step,
        point=point,
        call=describe(step),
        turn_id=run.turn.turn_id,
        crashed=run.crashed,
        model_requests=model.request_count,
        repeated_finished=max(0, repeated - allowed),
        repeated_interrupted=min(repeated, allowed),
        emails=inbox.count,
        same_reply=run.turn.reply == clean_reply,
        recovery_seconds=run.recovery_seconds,
        status=run.turn.status,
        reply=run.turn.reply,
        wasted_calls=waste.calls,
        wasted_tokens=waste.prompt_tokens + waste.completion_tokens,
        saved_calls=saved.calls,
        saved_tokens=saved.prompt_tokens + saved.completion_tokens,
    )
