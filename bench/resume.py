"""Resume: what a redelivered turn costs before it makes its next call, by journal length.

A turn of N steps (model, tool, model, tool, ..., the model's reply) is recorded in Postgres
by the real loop; then, as a redelivered worker does, the benchmark loads its journal and
walks the loop over it with the model switched off (every step is read back, none runs).
Beside it, the floor: one raw ordered SELECT of the same rows with psycopg. The goals:
linear in N, 10,000 steps in under a second, 1,000 steps within 2x the raw SELECT.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

import psycopg
from rich.table import Table

from durable_agent.cli.console import out
from durable_agent.journal import Claim, Database, JournalStore, Leases
from durable_agent.step.chat import initial_messages, run_agent
from durable_agent.step.runner import StepRunner
from durable_agent.step.tools import ToolRegistry, tool
from durable_agent.testing import ClaimHeld, MemoryJournal

from . import Stopwatch, interleaved, scratch_database, spread

SIZES = (11, 101, 1001, 10001)
SYSTEM = "You look notes up until you know enough, then answer."
MESSAGE = "What do the notes say?"
OWNER = "bench:resume"


@tool(replay="safe")
def lookup_note(name: str) -> str:
    """Read a note."""
    return f"The note {name} says the launch is on Friday at 10:00 in room 4."


TOOLS = ToolRegistry([lookup_note])


def scripted_model(steps: int) -> Any:
    """A model that calls lookup_note until the turn has ``steps`` steps, then answers."""

    def call(request: dict[str, Any]) -> dict[str, Any]:
        done = len(request["messages"]) - 2  # system + user, then one message per step
        if done + 1 >= steps:
            message: dict[str, Any] = {"role": "assistant", "content": "Friday at 10:00."}
            reason = "stop"
        else:
            message = {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"call_{done}",
                        "type": "function",
                        "function": {"name": "lookup_note", "arguments": '{"name":"launch"}'},
                    }
                ],
            }
            reason = "tool_calls"
        tokens = 20 * len(request["messages"])
        return {
            "message": message,
            "finish_reason": reason,
            "model": "bench-model",
            "usage": {"prompt_tokens": tokens, "completion_tokens": 12},
        }

    return call


def model_switched_off(request: dict[str, Any]) -> dict[str, Any]:
    raise AssertionError("a resume of a finished journal called the model")


def _walk(journal: Any, steps: int, call_model: Any) -> tuple[str, StepRunner]:
    runner = StepRunner(journal, tools=TOOLS, guard=ClaimHeld(), max_steps=steps + 1)
    reply = run_agent(
        runner,
        model="bench-model",
        tools=TOOLS,
        messages=initial_messages(SYSTEM, [], MESSAGE),
        call_model=call_model,
    )
    return reply, runner


def record_turn(url: str, store: JournalStore, leases: Leases, steps: int) -> tuple[str, int]:
    """A claimed turn whose journal holds ``steps`` finished steps, the last one the reply."""
    memory = MemoryJournal()
    _walk(memory, steps, scripted_model(steps))
    turn = store.create_turn(f"bench-resume-{uuid.uuid4().hex[:10]}", MESSAGE)
    claim = leases.claim(turn.turn_id, OWNER, 3600.0)
    if not isinstance(claim, Claim):
        raise RuntimeError(f"could not claim the benchmark turn: {claim}")
    with psycopg.connect(url, autocommit=True) as conn, conn.cursor() as cursor:
        columns = "turn_id, step, kind, name, input, replay, status, output, epoch"
        with cursor.copy(f"COPY journal ({columns}) FROM STDIN") as copy:
            for row in memory.steps():
                copy.write_row(
                    (
                        turn.turn_id,
                        row.step,
                        row.kind,
                        row.name,
                        json.dumps(row.input),
                        row.replay,
                        row.status,
                        json.dumps(row.output),
                        claim.epoch,
                    )
                )
        cursor.execute("ANALYZE journal")
    return turn.turn_id, claim.epoch


@dataclass(frozen=True)
class Resume:
    steps: int
    resume_ms: list[float]  # load + walk the loop over the journal
    load_ms: list[float]  # load_journal alone
    raw_ms: list[float]  # one raw ordered SELECT

    def as_json(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "resume_ms": self.resume_ms,
            "load_ms": self.load_ms,
            "raw_select_ms": self.raw_ms,
            "resume_over_raw": _median(self.resume_ms) / _median(self.raw_ms),
        }


def _median(samples: list[float]) -> float:
    ordered = sorted(samples)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def bench_resume(url: str, steps: int, reps: int) -> Resume:
    db = Database(url)
    store = JournalStore(db)
    leases = Leases(db)
    raw = psycopg.connect(url, autocommit=True)
    try:
        turn_id, epoch = record_turn(url, store, leases, steps)

        def resume() -> float:
            with Stopwatch() as sw:
                reply, runner = _walk(store.for_claim(turn_id, epoch), steps, model_switched_off)
            if runner.executed or len(runner.read_back) != steps or not reply:
                raise RuntimeError(f"the resume of {steps} steps ran calls: {runner.executed}")
            return sw.seconds * 1e3

        def load() -> float:
            with Stopwatch() as sw:
                store.load_journal(turn_id)
            return sw.seconds * 1e3

        def raw_select() -> float:
            with Stopwatch() as sw:
                rows = raw.execute(
                    "SELECT turn_id, step, kind, name, input, replay, status, output, epoch, "
                    "created_at, finished_at, output_blob FROM journal WHERE turn_id = %s "
                    "ORDER BY step",
                    (turn_id,),
                ).fetchall()
            if len(rows) != steps:
                raise RuntimeError(f"expected {steps} rows, read {len(rows)}")
            return sw.seconds * 1e3

        raw_ms, resume_ms = interleaved(raw_select, resume, reps=reps)
        _, load_ms = interleaved(raw_select, load, reps=reps)
    finally:
        raw.close()
        db.close()
    return Resume(steps, resume_ms, load_ms, raw_ms)


def run(*, reps: int = 5, sizes: tuple[int, ...] = SIZES) -> list[dict[str, Any]]:
    results = []
    with scratch_database() as url:
        for steps in sizes:
            results.append(bench_resume(url, steps, reps))
    table = Table(title=f"Resume a finished journal, model switched off ({reps} reps, medians)")
    for column in ("steps", "resume", "µs/step", "load_journal", "raw SELECT", "resume/raw"):
        table.add_column(column, justify="right")
    for r in results:
        resume = _median(r.resume_ms)
        table.add_row(
            f"{r.steps:,}",
            f"{resume:.1f} ms ({spread(r.resume_ms, '{:.1f}')})",
            f"{resume * 1e3 / r.steps:.0f}",
            f"{_median(r.load_ms):.1f} ms",
            f"{_median(r.raw_ms):.1f} ms",
            f"{resume / _median(r.raw_ms):.1f}x",
        )
    out.print(table)
    out.print(
        "  resume = load_journal + the agent loop reading every step back (what a redelivered\n"
        "  worker does before its next call); raw SELECT = the same rows with psycopg."
    )
    return [r.as_json() for r in results]
