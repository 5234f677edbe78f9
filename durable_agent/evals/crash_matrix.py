"""The crash matrix: crash a real worker at every step of a scenario's turn, twice, and count.

A clean turn of the scenario (:class:`~durable_agent.testing.Scenario`: an agent, a message,
a model, the side-effect counters of its ``never`` tools) runs first. Then, for every step
of it and both crash points (``before_run``: intent committed, call not run; ``after_run``:
call returned, outcome not recorded), a worker started with ``CRASH_AT`` dies at exactly
that point and a fresh worker finishes the turn through the system's own recovery path: the
sweeper finds the expired claim in Postgres and re-enqueues the turn, the new worker claims
it and replays the journal. Per crash point it records the three numbers of the pattern's
exercise (model calls repeated for finished steps, each ``never`` tool's effects, same reply
as the clean run) and the time from the crash to the finished turn. A wait step (a sleep,
an event, a child agent) is crashed by its name, before it parks and right after.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigurationError, TurnFailed
from ..journal import Step
from ..settings import Settings
from ..step.faults import POINTS
from ..testing.scenario import Scenario
from .preflight import check_before_running, check_points_reached
from .stack import EvalStack, crash_and_recover


@dataclass
class PointResult:
    step: int
    point: str
    call: str
    turn_id: str
    crashed: bool
    model_requests: int | None
    repeated_finished: int
    repeated_interrupted: int
    effects: dict[str, int]
    expected: dict[str, int]
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
            and self.effects == self.expected
            and self.same_reply
        )


@dataclass
class MatrixReport:
    scenario: str
    agent: str
    message: str
    clean_reply: str
    clean_steps: list[str]
    clean_model_requests: int | None
    clean_effects: dict[str, int]
    relabel: dict[str, str]
    lease_seconds: float
    sweep_interval_seconds: float
    scripted: bool = True
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
            "effects": "each never tool's effects as in one clean run (1 unless expected says)",
            "same_reply": True,
            "note": "an interrupted model call (after_run at a model step) may run once more",
        }
        return data


def describe(step: Step) -> str:
    return f"{step.kind} {step.name}" + (f" ({step.replay})" if step.kind == "tool" else "")


@contextlib.contextmanager
def scenario_services(stack: EvalStack, scenario: Scenario) -> Iterator[None]:
    """The scenario's services running, and its environment given to the stack's workers."""
    with contextlib.ExitStack() as services:
        for service in scenario.services:
            services.enter_context(service)
        # the workers import the scenario's modules as this process does (cwd first)
        path = os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))
        stack.worker_extra_env = {"PYTHONPATH": path, **scenario.worker_env()}
        yield


def run_scenario(
    settings: Settings,
    scenario: Scenario,
    *,
    work_dir: Path,
    relabel: dict[str, str] | None = None,
    only: list[tuple[int | str, str]] | None = None,
    lease_seconds: float = 2.0,
    sweep_interval_seconds: float = 0.5,
    pool: str = "solo",
    data_dir: Path | None = None,
    services_from_settings: bool = False,
    progress: Callable[[str, int, int], None] = lambda text, done, total: None,
    timeout: float = 60.0,
) -> MatrixReport:
    """The whole crash matrix of a scenario: its stack (Postgres, Redis, its model, fresh
    queue), its services, the clean run and every crash point."""
    labels = relabel or {}
    check_before_running(settings, scenario, relabel=labels, only=only)
    policy = scenario.resolved_policy()
    stack = EvalStack(
        settings,
        work_dir=work_dir,
        policy=policy if policy is not None else "email",
        real_model=policy is None,
        tools=",".join(scenario.modules),
        lease_seconds=lease_seconds,
        sweep_interval_seconds=sweep_interval_seconds,
        data_dir=data_dir,
        extra={"tool_labels": ",".join(f"{k}={v}" for k, v in labels.items())},
        pool=pool,
        services_from_settings=services_from_settings,
    )
    with stack, scenario_services(stack, scenario):
        return run_crash_matrix(
            stack, scenario, relabel=labels, only=only, progress=progress, timeout=timeout
        )


def run_crash_matrix(
    stack: EvalStack,
    scenario: Scenario,
    *,
    relabel: dict[str, str] | None = None,
    only: list[tuple[int | str, str]] | None = None,
    progress: Callable[[str, int, int], None] = lambda text, done, total: None,
    timeout: float = 60.0,
) -> MatrixReport:
    """Run the clean turn, then every (step, point), or only the points named in ``only``
    (a step number or a tool name, and a crash point). The stack runs the scenario's model;
    its services must be running (:func:`scenario_services`)."""
    settings, runtime, model = stack.settings, stack.runtime, stack.model
    store = runtime.journal
    run_id = uuid.uuid4().hex[:8]
    progress("clean run", 0, 1)
    _reset(stack, scenario)
    worker = stack.start_worker(f"clean-{run_id}")
    clean_id = runtime.start_turn(
        f"crash-matrix-{run_id}-clean", scenario.message, agent=scenario.agent
    )
    clean = runtime.wait_for_turn(clean_id, timeout)
    worker.stop()
    if clean.status != "done":
        raise TurnFailed(f"the clean turn of scenario {scenario.name!r} failed: {clean.error}")
    steps = store.load_journal(clean_id)
    check_points_reached(steps, only)
    report = MatrixReport(
        scenario=scenario.name,
        agent=clean.agent,
        message=scenario.message,
        clean_reply=clean.reply or "",
        clean_steps=[describe(s) for s in steps],
        clean_model_requests=model.request_count if model is not None else None,
        clean_effects=scenario.counts(),
        relabel=relabel or {},
        lease_seconds=settings.lease_seconds,
        sweep_interval_seconds=settings.sweep_interval_seconds,
        scripted=model is not None,
        notes=list(stack.notes),
    )
    chosen = [
        (s, p)
        for s in steps
        for p in POINTS
        if only is None or any(target in (s.step, s.name) and p == at for target, at in only)
    ]
    if not chosen:
        raise ConfigurationError(f"no step of the clean turn matches {only}")
    total = len(chosen)
    for index, (step, point) in enumerate(chosen):
        progress(f"step {step.step} {point}", index, total)
        report.points.append(
            _crash_once(stack, scenario, step, point, clean.reply or "", run_id, timeout)
        )
    progress("done", total, total)
    return report


def _reset(stack: EvalStack, scenario: Scenario) -> None:
    if stack.model is not None:
        stack.model.reset_counts()
    if scenario.reset is not None:
        scenario.reset()


def _crash_once(
    stack: EvalStack,
    scenario: Scenario,
    step: Step,
    point: str,
    clean_reply: str,
    run_id: str,
    timeout: float,
) -> PointResult:
    model = stack.model
    _reset(stack, scenario)
    session = f"crash-matrix-{step.step}-{point}-{run_id}"
    # a wait step by its name: a child turn the worker runs numbers its own steps from 0
    target = step.name if step.kind == "wait" else step.step
    run = crash_and_recover(
        stack, session, scenario.message, f"{target}:{point}", timeout, agent=scenario.agent
    )
    interrupted_model_call = step.kind == "model" and point == "after_run"
    repeated = model.repeated_requests() if model is not None else 0
    allowed = 1 if interrupted_model_call else 0
    effects = scenario.counts()
    spend = stack.runtime.get_turn(run.turn.turn_id).spend
    assert spend is not None
    waste, saved = spend.crash_waste, spend.journal_saved
    return PointResult(
        step=step.step,
        point=point,
        call=describe(step),
        turn_id=run.turn.turn_id,
        crashed=run.crashed,
        model_requests=model.request_count if model is not None else None,
        repeated_finished=max(0, repeated - allowed),
        repeated_interrupted=min(repeated, allowed),
        effects=effects,
        expected={tool: scenario.expected_count(tool) for tool in effects},
        # a real model need not answer twice alike: only a scripted one is held to the reply
        same_reply=run.turn.reply == clean_reply or (model is None and run.turn.status == "done"),
        recovery_seconds=run.recovery_seconds,
        status=run.turn.status,
        reply=run.turn.reply,
        wasted_calls=waste.calls,
        wasted_tokens=waste.prompt_tokens + waste.completion_tokens,
        saved_calls=saved.calls,
        saved_tokens=saved.prompt_tokens + saved.completion_tokens,
    )


def why(point: PointResult) -> str:
    """What failed at a crash point, in words."""
    reasons = []
    if not point.crashed:
        reasons.append("the worker did not crash there")
    if point.status != "done":
        reasons.append(f"turn {point.status}")
    if point.repeated_finished:
        reasons.append(f"{point.repeated_finished} finished model call(s) repeated")
    for tool, count in point.effects.items():
        if count != point.expected.get(tool):
            reasons.append(
                f"{tool} took effect {count} times (expected {point.expected.get(tool)})"
            )
    if not point.same_reply:
        reasons.append("a different reply")
    return ", ".join(reasons)
