"""Journal I/O: what a step costs to write, what a resume costs to read, claim and renew.

* Writes: our JournalStore (fenced intent insert, fenced outcome update, on the process's
  autocommit connection) against the floor: the same two writes as plain psycopg INSERT and
  UPDATE in autocommit, with no fence and no encoding of ours.
* Reads: a 1,000-step journal loaded by ``JournalStore.load_journal`` (one ordered SELECT,
  rows turned into Steps) against the floor: one raw ordered SELECT of the same rows.
* Claim and renew: the cost of ``Leases.claim`` on a queued turn and of ``Leases.renew``.
"""

from __future__ import annotations

import hashlib
import json
import statistics
import time
import uuid
from dataclasses import dataclass
from typing import Any

import psycopg
from rich.table import Table

from durable_agent.cli.console import out
from durable_agent.journal import Claim, Database, JournalStore, Leases

from . import Comparison, Stopwatch, interleaved, scratch_database, spread

OWNER = "bench:0:0"
LEASE_OPS = 200
LONG_LEASE = 600.0  # nobody else claims these turns: the lease must not run out mid-run

# -- what a turn writes ------------------------------------------------------------------


@dataclass(frozen=True)
class Call:
    kind: str
    name: str
    input: dict[str, Any]
    replay: str
    output: Any


def _sha(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def turn_calls(steps: int) -> list[Call]:
    """Alternating model and tool calls with payloads the size of a real email turn."""
    calls = []
    for step in range(steps):
        if step % 2 == 0:
            calls.append(
                Call(
                    kind="model",
                    name="llm",
                    input={
                        "model": "gpt-4o-mini",
                        "messages": step + 2,
                        "messages_sha256": _sha(f"messages {step}"),
                        "tools_sha256": _sha("tools"),
                    },
                    replay="safe",
                    output={
                        "message": {
                            "role": "assistant",
                            "content": None,
                            "tool_calls": [
                                {
                                    "id": f"call_{step}_0",
                                    "type": "function",
                                    "function": {
                                        "name": "lookup_note",
                                        "arguments": '{"name":"launch"}',
                                    },
                                }
                            ],
                        },
                        "finish_reason": "tool_calls",
                        "model": "gpt-4o-mini",
                        "usage": {
                            "prompt_tokens": 180 + step,
                            "completion_tokens": 12,
                            "total_tokens": 192 + step,
                        },
                    },
                )
            )
        else:
            calls.append(
                Call(
                    kind="tool",
                    name="lookup_note",
                    input={"arguments": {"name": "launch"}, "tool_call_id": f"call_{step - 1}_0"},
                    replay="safe",
                    output={
                        "content": "The launch is on Friday at 10:00 in room 4. "
                        "Bring the demo laptop."
                    },
                )
            )
    return calls


# -- the floor: plain statements with psycopg ----------------------------------------------


class RawJournal:
    """The same two writes per step as plain INSERT and UPDATE in autocommit: no fence."""

    def __init__(self, url: str) -> None:
        self.conn = psycopg.connect(url, autocommit=True)

    def insert_intent(
        self,
        turn_id: str,
        epoch: int,
        step: int,
        kind: str,
        name: str,
        input: dict[str, Any],
        replay: str | None,
    ) -> None:
        self.conn.execute(
            "INSERT INTO journal (turn_id, step, kind, name, input, replay, status, epoch) "
            "VALUES (%s, %s, %s, %s, %s, %s, 'intent', %s)",
            (turn_id, step, kind, name, json.dumps(input), replay, epoch),
        )

    def record_outcome(self, turn_id: str, epoch: int, step: int, output: Any) -> None:
        self.conn.execute(
            "UPDATE journal SET status = 'done', output = %s, finished_at = now() "
            "WHERE turn_id = %s AND step = %s",
            (json.dumps(output), turn_id, step),
        )

    def load(self, turn_id: str) -> list[tuple[Any, ...]]:
        return self.conn.execute(
            "SELECT turn_id, step, kind, name, input, replay, status, output, epoch, "
            "created_at, finished_at, output_blob FROM journal WHERE turn_id = %s ORDER BY step",
            (turn_id,),
        ).fetchall()

    def close(self) -> None:
        self.conn.close()


# -- the benchmarks ------------------------------------------------------------------------


def _claimed_turn(store: JournalStore, leases: Leases) -> tuple[str, int]:
    turn = store.create_turn(f"bench-{uuid.uuid4().hex[:12]}", "benchmark turn")
    claim = leases.claim(turn.turn_id, OWNER, LONG_LEASE)
    if not isinstance(claim, Claim):
        raise RuntimeError(f"could not claim a fresh turn: {claim}")
    return turn.turn_id, claim.epoch


def _check_journal(store: JournalStore, turn_id: str, epoch: int, steps: int) -> None:
    rows = store.load_journal(turn_id)
    if len(rows) != steps or any(r.status != "done" or r.epoch != epoch for r in rows):
        raise RuntimeError(f"turn {turn_id}: expected {steps} done rows at epoch {epoch}")


def bench_writes(url: str, *, steps: int, reps: int, replay: str) -> Comparison:
    """µs per journal step (its intent and its outcome), ours vs the raw floor.

    Ours is the worker's path: ``ClaimedJournal`` of a claimed turn, so model and ``safe``
    outcomes go with the next step's statement and only ``never`` steps wait for the WAL
    flush. ``replay="never"`` makes every call a ``never`` tool. The floor is two plain
    autocommit statements per step, each waiting for the flush. A repetition writes one
    ``steps``-step turn with each writer, interleaved step by step (A B B A ...), so both
    sides see the same moments of a noisy machine.
    """
    db = Database(url)
    store = JournalStore(db)
    leases = Leases(db)
    raw = RawJournal(url)
    calls = [
        call if replay == "safe" else Call("tool", "send_email", call.input, "never", call.output)
        for call in turn_calls(steps)
    ]

    def repetition(n_steps: int) -> tuple[float, float]:
        (raw_turn, raw_epoch), (our_turn, our_epoch) = (
            _claimed_turn(store, leases),
            _claimed_turn(store, leases),
        )
        journal = store.for_claim(our_turn, our_epoch, empty=True)
        spent = [0.0, 0.0]
        for step, call in enumerate(calls[:n_steps]):
            for side in (0, 1) if step % 2 == 0 else (1, 0):
                started = time.perf_counter()
                if side == 0:
                    raw.insert_intent(
                        raw_turn, raw_epoch, step, call.kind, call.name, call.input, call.replay
                    )
                    raw.record_outcome(raw_turn, raw_epoch, step, call.output)
                else:
                    journal.insert_intent(step, call.kind, call.name, call.input, call.replay)
                    journal.record_outcome(step, call.output)
                spent[side] += time.perf_counter() - started
        started = time.perf_counter()
        journal.flush()
        spent[1] += time.perf_counter() - started
        _check_journal(store, raw_turn, raw_epoch, n_steps)
        _check_journal(store, our_turn, our_epoch, n_steps)
        return spent[0] * 1e6 / n_steps, spent[1] * 1e6 / n_steps

    base: list[float] = []
    ours: list[float] = []
    try:
        repetition(20)  # warm-up: connections, prepared plans
        for _ in range(reps):
            b, o = repetition(steps)
            base.append(b)
            ours.append(o)
    finally:
        raw.close()
        db.close()
    return Comparison(f"{replay} step", "µs", ours=ours, baseline=base)


def bench_reads(url: str, *, steps: int, reps: int) -> Comparison:
    """ms to load a ``steps``-step journal: load_journal vs one raw ordered SELECT."""
    db = Database(url)
    store = JournalStore(db)
    leases = Leases(db)
    raw = RawJournal(url)
    try:
        turn_id, epoch = _claimed_turn(store, leases)
        for step, call in enumerate(turn_calls(steps)):
            store.insert_intent(turn_id, epoch, step, call.kind, call.name, call.input, call.replay)
            store.record_outcome(turn_id, epoch, step, call.output)
        raw.conn.execute("ANALYZE journal")
        if len(raw.load(turn_id)) != len(store.load_journal(turn_id)):
            raise RuntimeError("the raw load differs from load_journal")
        _check_journal(store, turn_id, epoch, steps)

        def ours() -> float:
            with Stopwatch() as sw:
                store.load_journal(turn_id)
            return sw.seconds * 1e3

        def baseline() -> float:
            with Stopwatch() as sw:
                raw.load(turn_id)
            return sw.seconds * 1e3

        base, mine = interleaved(baseline, ours, reps=reps)
    finally:
        raw.close()
        db.close()
    return Comparison("load on resume", "ms", ours=mine, baseline=base)


@dataclass(frozen=True)
class LeaseCosts:
    ops: int
    claim_us: list[float]
    renew_us: list[float]

    def as_json(self) -> dict[str, Any]:
        return {
            "ops_per_sample": self.ops,
            "claim_us": {"median": statistics.median(self.claim_us), "samples": self.claim_us},
            "renew_us": {"median": statistics.median(self.renew_us), "samples": self.renew_us},
        }


def bench_leases(url: str, *, ops: int, reps: int) -> LeaseCosts:
    """µs per Leases.claim (of a queued turn) and per Leases.renew (of a held claim)."""
    db = Database(url)
    store = JournalStore(db)
    leases = Leases(db)
    try:
        held, epoch = _claimed_turn(store, leases)

        def claims() -> float:
            turn_ids = [
                store.create_turn(f"bench-{uuid.uuid4().hex[:12]}", "claim me").turn_id
                for _ in range(ops)
            ]
            with Stopwatch() as sw:
                results = [leases.claim(turn_id, OWNER, LONG_LEASE) for turn_id in turn_ids]
            if not all(isinstance(r, Claim) for r in results):
                raise RuntimeError("a claim of a queued turn was refused")
            return sw.seconds * 1e6 / ops

        def renews() -> float:
            with Stopwatch() as sw:
                renewed = [leases.renew(held, epoch, LONG_LEASE) for _ in range(ops)]
            if not all(renewed):
                raise RuntimeError("a renewal of a held claim failed")
            return sw.seconds * 1e6 / ops

        claim_us, renew_us = interleaved(claims, renews, reps=reps)
    finally:
        db.close()
    return LeaseCosts(ops=ops, claim_us=claim_us, renew_us=renew_us)


# -- running and reporting -----------------------------------------------------------------


def run(*, reps: int = 7, write_steps: int = 300, read_steps: int = 1000) -> dict[str, Any]:
    """Run the journal benchmarks in their own scratch database; print and return them."""
    lease_reps = max(3, reps // 2)
    with scratch_database() as url:
        writes = bench_writes(url, steps=write_steps, reps=reps, replay="safe")
        never_writes = bench_writes(url, steps=write_steps, reps=reps, replay="never")
        reads = bench_reads(url, steps=read_steps, reps=reps)
        lease_costs = bench_leases(url, ops=LEASE_OPS, reps=lease_reps)

    table = Table(title=f"Journal I/O against the floor ({reps} interleaved reps, medians)")
    for column in (
        "measure",
        "ours",
        "floor",
        "ours/floor",
        "ours min-max",
        "floor min-max",
    ):
        table.add_column(column, justify="left" if column == "measure" else "right", no_wrap=True)
    for label, writes_of in (("model/safe", writes), ("never", never_writes)):
        table.add_row(
            f"{label} step (intent+outcome)",
            f"{writes_of.ours_median:.0f} µs",
            f"{writes_of.baseline_median:.0f} µs",
            f"{1 / writes_of.ratio:.2f}x",
            spread(writes_of.ours),
            spread(writes_of.baseline),
        )
    table.add_row(
        f"load a {read_steps:,}-step journal",
        f"{reads.ours_median:.1f} ms",
        f"{reads.baseline_median:.1f} ms",
        f"{1 / reads.ratio:.2f}x",
        spread(reads.ours, "{:.1f}"),
        spread(reads.baseline, "{:.1f}"),
    )
    out.print(table)
    out.print(
        "  write: ours = the worker's ClaimedJournal (fenced; model/safe outcomes ride with\n"
        "         the next step, only never steps wait for the WAL flush);\n"
        "         floor = plain INSERT + UPDATE with psycopg, autocommit, each flushed.\n"
        "  load:  ours = JournalStore.load_journal; floor = one raw ordered SELECT."
    )

    leases_table = Table(
        title=f"Claims and heartbeats: µs per call ({lease_reps} samples of {LEASE_OPS} calls)"
    )
    for column in ("call", "median", "min-max"):
        leases_table.add_column(column, justify="left" if column == "call" else "right")
    leases_table.add_row(
        "Leases.claim (a queued turn)",
        f"{statistics.median(lease_costs.claim_us):.0f} µs",
        f"{spread(lease_costs.claim_us)} µs",
    )
    leases_table.add_row(
        "Leases.renew (heartbeat)",
        f"{statistics.median(lease_costs.renew_us):.0f} µs",
        f"{spread(lease_costs.renew_us)} µs",
    )
    out.print(leases_table)

    return {
        "write_safe_step": {"steps": write_steps, "reps": reps, **writes.as_json()},
        "write_never_step": {"steps": write_steps, "reps": reps, **never_writes.as_json()},
        "load": {"steps": read_steps, "reps": reps, **reads.as_json()},
        "leases": lease_costs.as_json(),
    }
