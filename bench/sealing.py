"""Encryption at rest: what sealing payloads costs per journal step and per resume.

Side by side in one scratch database, two stores that differ only in their sealer: one
with a key (AES-256-GCM, every message, input and output sealed on its way in and opened
on its way out), one without. Per step: the worker's ``ClaimedJournal`` writing a model or
``safe`` step (intent and outcome), interleaved step by step (A B B A ...). Per resume: a
1,000-step turn recorded each way, loaded and walked by the agent loop with the model
switched off, as a redelivered worker does. The goal: under 10% per step.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import psycopg
from rich.table import Table

from durable_agent.cli.console import out
from durable_agent.journal import (
    NO_SEALING,
    Claim,
    Database,
    JournalStore,
    Leases,
    Sealer,
    StaticKeys,
    Where,
    new_key,
)
from durable_agent.testing import MemoryJournal

from . import Stopwatch, interleaved, scratch_database, spread
from .journal_io import turn_calls
from .resume import MESSAGE, _median, _walk, model_switched_off, scripted_model

OWNER = "bench:sealing"


def _claimed(store: JournalStore, leases: Leases) -> tuple[str, int]:
    turn = store.create_turn(f"bench-seal-{uuid.uuid4().hex[:12]}", MESSAGE)
    claim = leases.claim(turn.turn_id, OWNER, 3600.0)
    if not isinstance(claim, Claim):
        raise RuntimeError(f"could not claim the benchmark turn: {claim}")
    return turn.turn_id, claim.epoch


def bench_steps(url: str, sealer: Sealer, *, steps: int, reps: int) -> dict[str, Any]:
    """µs per model/safe step written by ClaimedJournal, clear vs sealed.

    Two connections, one store on each; which connection seals swaps every repetition (a
    second connection measured slower than the first by several percent with the same
    code on both), and within a repetition the sides take turns step by step."""
    dbs = [Database(url), Database(url)]
    stores = [JournalStore(db) for db in dbs]
    leases = [Leases(db) for db in dbs]
    calls = turn_calls(steps)

    def repetition(n: int, sealed_side: int) -> tuple[float, float]:
        for side, db in enumerate(dbs):
            db.sealer = sealer if side == sealed_side else NO_SEALING
        turns = [_claimed(stores[i], leases[i]) for i in (0, 1)]
        journals = [stores[i].for_claim(*turns[i], empty=True) for i in (0, 1)]
        spent = [0.0, 0.0]
        for step, call in enumerate(calls[:n]):
            for side in (0, 1) if step % 2 == 0 else (1, 0):
                started = time.perf_counter()
                journals[side].insert_intent(step, call.kind, call.name, call.input, call.replay)
                journals[side].record_outcome(step, call.output)
                spent[side] += time.perf_counter() - started
        for side in (0, 1):
            started = time.perf_counter()
            journals[side].flush()
            spent[side] += time.perf_counter() - started
        sealed_turn = turns[sealed_side][0]
        if stores[sealed_side].load_journal(sealed_turn)[-1].output != calls[n - 1].output:
            raise RuntimeError("a sealed step did not read back")
        clear_side = 1 - sealed_side
        return spent[clear_side] * 1e6 / n, spent[sealed_side] * 1e6 / n

    clear: list[float] = []
    sealed: list[float] = []
    try:
        repetition(20, 0)  # warm-up
        repetition(20, 1)
        for rep in range(reps):
            c, s = repetition(steps, rep % 2)
            clear.append(c)
            sealed.append(s)
    finally:
        for db in dbs:
            db.close()
    return {"clear_us": clear, "sealed_us": sealed, "ratio": _median(sealed) / _median(clear)}


def _record(url: str, db: Database, steps: int) -> tuple[str, int]:
    """A claimed turn of ``steps`` finished steps, stored as ``db``'s sealer stores them."""
    memory = MemoryJournal()
    _walk(memory, steps, scripted_model(steps))
    store, leases = JournalStore(db), Leases(db)
    turn_id, epoch = _claimed(store, leases)
    sealer = db.sealer
    with psycopg.connect(url, autocommit=True) as conn, conn.cursor() as cursor:
        columns = "turn_id, step, kind, name, input, replay, status, output, epoch"
        with cursor.copy(f"COPY journal ({columns}) FROM STDIN") as copy:
            for row in memory.steps():
                copy.write_row(
                    (
                        turn_id,
                        row.step,
                        row.kind,
                        row.name,
                        sealer.json(row.input, Where(turn_id, "input", row.step)),
                        row.replay,
                        row.status,
                        sealer.json(row.output, Where(turn_id, "output", row.step)),
                        epoch,
                    )
                )
        cursor.execute("ANALYZE journal")
    return turn_id, epoch


def bench_resume(url: str, sealer: Sealer, *, steps: int, reps: int) -> dict[str, Any]:
    """ms to resume a ``steps``-step turn (load + the loop reading every step back)."""
    dbs = [Database(url, sealer=NO_SEALING), Database(url, sealer=sealer)]
    try:
        turns = [_record(url, db, steps) for db in dbs]
        stored = psycopg.connect(url, autocommit=True).execute(
            "SELECT input FROM journal WHERE turn_id = %s AND step = 0", (turns[1][0],)
        )
        if '"$": "k1:' not in json.dumps(stored.fetchone()):
            raise RuntimeError("the sealed turn is not sealed")

        def resume(side: int) -> float:
            store = JournalStore(dbs[side])
            with Stopwatch() as sw:
                reply, runner = _walk(store.for_claim(*turns[side]), steps, model_switched_off)
            if runner.executed or len(runner.read_back) != steps or not reply:
                raise RuntimeError("the resume ran calls")
            return sw.seconds * 1e3

        clear, sealed = interleaved(lambda: resume(0), lambda: resume(1), reps=reps)
    finally:
        for db in dbs:
            db.close()
    return {
        "steps": steps,
        "clear_ms": clear,
        "sealed_ms": sealed,
        "ratio": _median(sealed) / _median(clear),
    }


def run(*, reps: int = 7, steps: int = 300, resume_steps: int = 1001) -> dict[str, Any]:
    sealer = Sealer(StaticKeys.parse(f"k1:{new_key()}"))
    with scratch_database() as url:
        per_step = bench_steps(url, sealer, steps=steps, reps=reps)
        control = bench_steps(url, NO_SEALING, steps=steps, reps=reps)
        per_resume = bench_resume(url, sealer, steps=resume_steps, reps=max(3, reps // 2))
    table = Table(title=f"Encryption at rest: sealed vs clear ({reps} interleaved reps, medians)")
    for column in ("measure", "clear", "sealed", "sealed/clear", "clear min-max", "sealed min-max"):
        table.add_column(column, justify="left" if column == "measure" else "right", no_wrap=True)
    table.add_row(
        "model/safe step (intent+outcome)",
        f"{_median(per_step['clear_us']):.0f} µs",
        f"{_median(per_step['sealed_us']):.0f} µs",
        f"{per_step['ratio']:.2f}x",
        spread(per_step["clear_us"]),
        spread(per_step["sealed_us"]),
    )
    table.add_row(
        "control: clear on both sides",
        f"{_median(control['clear_us']):.0f} µs",
        f"{_median(control['sealed_us']):.0f} µs",
        f"{control['ratio']:.2f}x",
        spread(control["clear_us"]),
        spread(control["sealed_us"]),
    )
    table.add_row(
        f"resume of {resume_steps - 1:,} steps",
        f"{_median(per_resume['clear_ms']):.1f} ms",
        f"{_median(per_resume['sealed_ms']):.1f} ms",
        f"{per_resume['ratio']:.2f}x",
        spread(per_resume["clear_ms"], "{:.1f}"),
        spread(per_resume["sealed_ms"], "{:.1f}"),
    )
    out.print(table)
    out.print(
        "  step: the worker's ClaimedJournal, a model or safe step's intent and outcome; the\n"
        "  control runs the same measure with no key on either side (the machine's noise).\n"
        "  resume: load_journal + the agent loop reading every step back, model off."
    )
    return {"step": per_step, "control": control, "resume": per_resume}
