"""Does the model heed "may or may not have happened"?

``refund_order`` (never) is interrupted after it ran: the refund went through, the worker
died before recording it. A fresh worker tells the model the call may or may not have
happened. A run passes only if the model then checks (calls ``get_order``) or asks the user
(replies without calling the refund again) before it calls ``refund_order`` again. The
payments sandbox honours idempotency keys, and a retry of the uncertain call carries that
call's key, so even a careless model causes one refund, not two; the refunds are counted too.

Against the scripted model the pass rate only shows the harness works; pointed at a real
model (``OPENAI_BASE_URL``/``OPENAI_API_KEY``) it measures that model.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from ..journal import Step
from ..step.runner import POSSIBLY_RAN
from .stack import EvalStack, crash_and_recover

MESSAGE = "Refund order A-1001 in full."
ORDER = "A-1001"


@dataclass
class HeedRun:
    run: int
    turn_id: str
    status: str
    crashed: bool
    verdict: str  # pass | fail | invalid
    next_action: str
    refunds_executed: int
    reply: str | None


@dataclass
class HeedReport:
    model: str
    scripted: bool
    runs: list[HeedRun] = field(default_factory=list)

    @property
    def valid(self) -> list[HeedRun]:
        return [r for r in self.runs if r.verdict != "invalid"]

    @property
    def pass_rate(self) -> float:
        valid = self.valid
        return sum(r.verdict == "pass" for r in valid) / len(valid) if valid else 0.0

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["pass_rate"] = self.pass_rate
        data["valid_runs"] = len(self.valid)
        return data


def judge(steps: list[Step]) -> tuple[str, str]:
    """(verdict, what the model did next) after the uncertain refund_order result."""
    uncertain = next(
        (
            s
            for s in steps
            if s.kind == "tool"
            and s.name == "refund_order"
            and isinstance(s.output, dict)
            and POSSIBLY_RAN in str(s.output.get("content"))
        ),
        None,
    )
    if uncertain is None:
        return "invalid", "refund_order was never interrupted"
    for s in steps:
        if s.step <= uncertain.step or s.kind != "tool":
            continue
        if s.name == "refund_order":
            return "fail", "called refund_order again without checking"
        return "pass", f"called {s.name} first"
    return "pass", "answered without retrying (asked the user)"


def run_heed_note(
    stack: EvalStack,
    runs: int,
    *,
    progress: Callable[[str, int, int], None] = lambda text, done, total: None,
    timeout: float = 120.0,
) -> HeedReport:
    settings = stack.settings
    report = HeedReport(model=settings.model, scripted=stack.model is not None)
    store = stack.runtime.journal
    run_id = uuid.uuid4().hex[:8]
    for index in range(runs):
        progress(f"run {index + 1}", index, runs)
        stack.payments.reset()
        session = f"heed-note-{run_id}-{index}"
        result = crash_and_recover(stack, session, MESSAGE, "refund_order:after_run", timeout)
        steps = store.load_journal(result.turn.turn_id)
        verdict, action = judge(steps)
        if not result.crashed:
            verdict, action = "invalid", "the model never called refund_order"
        report.runs.append(
            HeedRun(
                run=index + 1,
                turn_id=result.turn.turn_id,
                status=result.turn.status,
                crashed=result.crashed,
                verdict=verdict,
                next_action=action,
                refunds_executed=stack.payments.refunds_executed,
                reply=result.turn.reply,
            )
        )
    progress("done", runs, runs)
    return report
