"""DBOS side by side with durable-agent: ``python -m bench.peers [--reps N] [--json PATH]``.

DBOS (``dbos`` on PyPI) is the durable-execution library users would pick instead. It is
not a dependency of durable-agent: ``make bench-peers`` installs it, pinned, in its own
virtual environment (``.venv-peers``) and runs this module there. Both sides run in one
process against the same Postgres server, each in its own scratch database, in alternating
repetitions:

* Per step. DBOS: a workflow whose steps (``@DBOS.step()`` functions returning the same
  small dicts our model and tool steps record) run in sequence; a step costs DBOS one read
  transaction (the workflow's status and the step's recorded output) and one write
  transaction (an owner check and the output's INSERT). Ours: ``ClaimedJournal`` of a
  claimed turn, ``insert_intent`` + ``record_outcome`` of model/``safe`` steps, as
  ``bench.journal_io`` measures it. Floor: the same intent and outcome as a plain INSERT and
  UPDATE in autocommit (``RawJournal``). The three are interleaved step by step: DBOS's
  workflow body writes step i of our turn and of the raw turn between its own steps, in
  rotating order, timing each call on its own.
* Replay of a 1,001-step recording. DBOS: a subprocess starts workflows of 1,001 steps,
  lets every step be recorded and is killed with SIGKILL before the workflows return; this
  process then recovers one pending workflow per repetition with DBOS's recovery
  (``dbos._recovery._recover_workflow``, what its startup recovery runs per pending
  workflow: back to ENQUEUED on its internal queue, dequeued by the queue thread, executed
  with every step read back). Ours: what ``bench.resume`` times, a redelivered worker's
  ``load_journal`` and the agent loop reading all 1,001 steps back with the model switched
  off. Floor: one raw ordered SELECT of our 1,001 rows.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

try:
    from dbos import DBOS
    from dbos._dbos import _get_dbos_instance
    from dbos._recovery import _recover_workflow
    from dbos._sys_db import GetPendingWorkflowsOutput
except ImportError:
    print(
        "error: dbos is not installed in this environment; run `make bench-peers`",
        file=sys.stderr,
    )
    raise SystemExit(2) from None

import psycopg
from rich.table import Table

from durable_agent.cli.console import out
from durable_agent.journal import Database, JournalStore, Leases

from . import machine, scratch_database, spread
from .journal_io import RawJournal, _check_journal, _claimed_turn, turn_calls
from .resume import _walk, model_switched_off, record_turn

APP_VERSION = "bench-peers"
CRASHED_EXECUTOR = "bench-peers-crashed"
MAIN_EXECUTOR = "bench-peers-main"
WRITE_STEPS = 300
RECOVERY_STEPS = 1001
REPO = Path(__file__).resolve().parent.parent

# The outputs DBOS's steps return: the payloads bench.journal_io records for our steps.
OUTPUTS = [call.output for call in turn_calls(RECOVERY_STEPS)]

# -- the DBOS application ------------------------------------------------------------------

_executed = [0]  # bodies of peer_step run in this process (a replayed step does not run)
_crash_here = threading.Event()  # set only in the subprocess that is killed
_arrivals = threading.Semaphore(0)  # workflows of that subprocess with all steps recorded
_marks: dict[str, tuple[float, float]] = {}  # workflow id -> (body entered, body returned)
_sides: list[Callable[[int], None]] = []  # per-step: our writer and the raw one, for step i


@DBOS.step(name="bench_peers.step")
def peer_step(index: int) -> dict[str, Any]:
    _executed[0] += 1
    return OUTPUTS[index % len(OUTPUTS)]


@DBOS.workflow(name="bench_peers.recovered")
def recovered_workflow(steps: int) -> int:
    """``steps`` steps in sequence; in the crash subprocess it never returns."""
    entered = time.perf_counter()
    for index in range(steps):
        peer_step(index)
    if _crash_here.is_set():
        _arrivals.release()
        threading.Event().wait()  # until the SIGKILL
    workflow_id = DBOS.workflow_id
    assert workflow_id is not None
    _marks[workflow_id] = (entered, time.perf_counter())
    return steps


ORDERS = ((0, 1, 2), (1, 2, 0), (2, 0, 1))
RAW, OURS, PEER = 0, 1, 2


@DBOS.workflow(name="bench_peers.steps")
def steps_workflow(steps: int) -> list[float]:
    """DBOS's steps, with ours and the raw ones between them: seconds spent by each side."""
    spent = [0.0, 0.0, 0.0]
    for index in range(steps):
        for side in ORDERS[index % 3]:
            started = time.perf_counter()
            if side == PEER:
                peer_step(index)
            else:
                _sides[side](index)
            spent[side] += time.perf_counter() - started
    return spent


def _config(url: str, executor_id: str) -> Any:
    return {
        "name": "bench-peers",
        "system_database_url": url,
        "executor_id": executor_id,
        "application_version": APP_VERSION,
        "log_level": "WARNING",
    }


def crash_child(url: str, workflows: int, steps: int) -> None:
    """In a subprocess: start ``workflows`` workflows, wait until each has recorded its
    ``steps`` steps, then die by SIGKILL, leaving them PENDING for the parent to recover."""
    DBOS(config=_config(url, CRASHED_EXECUTOR))
    DBOS.launch()
    _crash_here.set()
    for _ in range(workflows):
        DBOS.start_workflow(recovered_workflow, steps)
    deadline = time.monotonic() + 300
    for _ in range(workflows):
        if not _arrivals.acquire(timeout=max(0.0, deadline - time.monotonic())):
            print("error: the crash subprocess's workflows did not finish", file=sys.stderr)
            os._exit(3)
    os.kill(os.getpid(), signal.SIGKILL)


def make_pending(url: str, *, workflows: int, steps: int) -> list[str]:
    """Run crash_child in a subprocess; the ids of the workflows it left PENDING."""
    code = (
        "import sys; from bench.peers import crash_child; "
        "crash_child(sys.argv[1], *map(int, sys.argv[2:]))"
    )
    child = subprocess.run(
        [sys.executable, "-c", code, url, str(workflows), str(steps)],
        cwd=REPO,
        timeout=600,
        check=False,
    )
    if child.returncode != -signal.SIGKILL:
        raise RuntimeError(f"the crash subprocess exited with {child.returncode}, not SIGKILL")
    pending = DBOS.list_workflows(
        status="PENDING", executor_id=CRASHED_EXECUTOR, load_input=False, load_output=False
    )
    ids = [status.workflow_id for status in pending]
    if len(ids) != workflows:
        raise RuntimeError(f"expected {workflows} pending workflows, found {len(ids)}")
    for workflow_id in ids:
        recorded = DBOS.list_workflow_steps(workflow_id, load_output=False)
        if len(recorded) != steps:
            raise RuntimeError(f"{workflow_id} recorded {len(recorded)} steps, not {steps}")
    return ids


# -- the measures --------------------------------------------------------------------------


@dataclass(frozen=True)
class Measure:
    """Samples of ours, DBOS and the floor, taken in the same repetitions."""

    name: str
    unit: str
    ours: list[float]
    dbos: list[float]
    floor: list[float]

    def as_json(self) -> dict[str, Any]:
        medians = {
            side: statistics.median(samples)
            for side, samples in (("ours", self.ours), ("dbos", self.dbos), ("floor", self.floor))
        }
        return {
            "unit": self.unit,
            **{
                side: {"median": medians[side], "samples": samples}
                for side, samples in (
                    ("ours", self.ours),
                    ("dbos", self.dbos),
                    ("floor", self.floor),
                )
            },
            "dbos_over_ours": medians["dbos"] / medians["ours"],
            "ours_over_floor": medians["ours"] / medians["floor"],
            "dbos_over_floor": medians["dbos"] / medians["floor"],
        }


def bench_steps(url: str, *, steps: int, reps: int) -> Measure:
    """µs per step: DBOS step, our model/safe step (intent + outcome), raw INSERT + UPDATE."""
    db = Database(url)
    store = JournalStore(db)
    leases = Leases(db)
    raw = RawJournal(url)
    calls = turn_calls(steps)

    def repetition(n_steps: int) -> tuple[float, float, float]:
        (raw_turn, raw_epoch), (our_turn, our_epoch) = (
            _claimed_turn(store, leases),
            _claimed_turn(store, leases),
        )
        journal = store.for_claim(our_turn, our_epoch, empty=True)

        def raw_step(step: int) -> None:
            call = calls[step]
            raw.insert_intent(
                raw_turn, raw_epoch, step, call.kind, call.name, call.input, call.replay
            )
            raw.record_outcome(raw_turn, raw_epoch, step, call.output)

        def our_step(step: int) -> None:
            call = calls[step]
            journal.insert_intent(step, call.kind, call.name, call.input, call.replay)
            journal.record_outcome(step, call.output)

        _sides[:] = [raw_step, our_step]
        executed = _executed[0]
        handle = DBOS.start_workflow(steps_workflow, n_steps)
        spent = handle.get_result()
        started = time.perf_counter()
        journal.flush()
        spent[OURS] += time.perf_counter() - started
        if _executed[0] - executed != n_steps:
            raise RuntimeError("DBOS did not run every step of the workflow")
        recorded = DBOS.list_workflow_steps(handle.get_workflow_id(), load_output=False)
        if len(recorded) != n_steps:
            raise RuntimeError(f"DBOS recorded {len(recorded)} steps, not {n_steps}")
        _check_journal(store, raw_turn, raw_epoch, n_steps)
        _check_journal(store, our_turn, our_epoch, n_steps)
        return spent[RAW] * 1e6 / n_steps, spent[OURS] * 1e6 / n_steps, spent[PEER] * 1e6 / n_steps

    floor: list[float] = []
    ours: list[float] = []
    peer: list[float] = []
    try:
        repetition(20)  # warm-up: connections, prepared plans
        for _ in range(reps):
            f, o, p = repetition(steps)
            floor.append(f)
            ours.append(o)
            peer.append(p)
    finally:
        _sides.clear()
        raw.close()
        db.close()
    return Measure("step", "µs", ours=ours, dbos=peer, floor=floor)


@dataclass(frozen=True)
class Recovery:
    replay: Measure
    dbos_to_return_ms: list[float]  # from the recovery call to the workflow's return

    def as_json(self) -> dict[str, Any]:
        return {
            "steps": RECOVERY_STEPS,
            **self.replay.as_json(),
            "dbos_recover_to_return_ms": {
                "median": statistics.median(self.dbos_to_return_ms),
                "samples": self.dbos_to_return_ms,
            },
        }


def bench_recovery(url: str, pending: list[str], *, steps: int, reps: int) -> Recovery:
    """ms to replay ``steps`` recorded steps: DBOS recovering a pending workflow, our
    resume of a recorded turn, one raw SELECT of our rows; rotating order per repetition."""
    db = Database(url)
    store = JournalStore(db)
    leases = Leases(db)
    conn = psycopg.connect(url, autocommit=True)
    dbos = _get_dbos_instance()
    to_return: list[float] = []
    try:
        turn_id, epoch = record_turn(url, store, leases, steps)

        def ours() -> float:
            started = time.perf_counter()
            reply, runner = _walk(store.for_claim(turn_id, epoch), steps, model_switched_off)
            elapsed = time.perf_counter() - started
            if runner.executed or len(runner.read_back) != steps or not reply:
                raise RuntimeError(f"the resume of {steps} steps ran calls: {runner.executed}")
            return elapsed * 1e3

        def floor() -> float:
            started = time.perf_counter()
            rows = conn.execute(
                "SELECT turn_id, step, kind, name, input, replay, status, output, epoch, "
                "created_at, finished_at, output_blob FROM journal WHERE turn_id = %s "
                "ORDER BY step",
                (turn_id,),
            ).fetchall()
            elapsed = time.perf_counter() - started
            if len(rows) != steps:
                raise RuntimeError(f"expected {steps} rows, read {len(rows)}")
            return elapsed * 1e3

        def peer() -> float:
            workflow_id = pending.pop()
            executed = _executed[0]
            started = time.perf_counter()
            handle = _recover_workflow(
                dbos, GetPendingWorkflowsOutput(workflow_id=workflow_id), [CRASHED_EXECUTOR]
            )
            status = DBOS.get_workflow_status(workflow_id)
            if status is None or (
                status.status == "PENDING" and status.executor_id == CRASHED_EXECUTOR
            ):
                # not re-enqueued: get_result would wait forever
                raise RuntimeError(f"DBOS did not recover {workflow_id}: {status}")
            result = handle.get_result()
            entered, returned = _marks.pop(workflow_id)
            if result != steps or _executed[0] != executed:
                raise RuntimeError(f"DBOS's recovery of {workflow_id} ran a step again")
            to_return.append((returned - started) * 1e3)
            return (returned - entered) * 1e3

        sides = (floor, ours, peer)
        samples: list[list[float]] = [[], [], []]
        for rep in range(reps + 1):  # the first round warms up and is discarded
            for side in ORDERS[rep % 3]:
                value = sides[side]()
                if rep:
                    samples[side].append(value)
        del to_return[0]
    finally:
        conn.close()
        db.close()
    replay = Measure(
        f"replay {steps:,} steps", "ms", ours=samples[OURS], dbos=samples[PEER], floor=samples[RAW]
    )
    return Recovery(replay=replay, dbos_to_return_ms=to_return)


# -- running and reporting -----------------------------------------------------------------


def versions() -> dict[str, str]:
    found = {}
    for package in ("durable-agent", "dbos", "psycopg", "SQLAlchemy"):
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            found[package] = "?"
    return found


def _median(samples: list[float], unit: str, fmt: str) -> str:
    return f"{fmt.format(statistics.median(samples))} {unit}"


def report(steps: Measure, recovery: Recovery, reps: int, recovery_reps: int) -> None:
    table = Table(title="Against DBOS, side by side (medians; min-max below each)")
    for column in ("measure", "ours", "DBOS", "floor", "DBOS/ours", "ours/floor", "DBOS/floor"):
        table.add_column(column, justify="left" if column == "measure" else "right", no_wrap=True)
    for measure, fmt, reps_of in (
        (steps, "{:.0f}", reps),
        (recovery.replay, "{:.1f}", recovery_reps),
    ):
        ours = statistics.median(measure.ours)
        dbos = statistics.median(measure.dbos)
        floor = statistics.median(measure.floor)
        table.add_row(
            f"{measure.name} ({reps_of} reps)",
            _median(measure.ours, measure.unit, fmt),
            _median(measure.dbos, measure.unit, fmt),
            _median(measure.floor, measure.unit, fmt),
            f"{dbos / ours:.2f}x",
            f"{ours / floor:.2f}x",
            f"{dbos / floor:.2f}x",
        )
        table.add_row(
            "  min-max",
            spread(measure.ours, fmt),
            spread(measure.dbos, fmt),
            spread(measure.floor, fmt),
            style="dim",
        )
    table.add_row(
        "DBOS: recovery call to return", "", _median(recovery.dbos_to_return_ms, "ms", "{:.0f}")
    )
    table.add_row("  min-max", "", spread(recovery.dbos_to_return_ms), style="dim")
    out.print(table)
    out.print(
        "  step:   ours = ClaimedJournal insert_intent + record_outcome of a model/safe step\n"
        "          (the outcome rides with the next statement, flushed at the end);\n"
        "          DBOS = one @DBOS.step() call in a workflow: a read transaction (workflow\n"
        "          status, recorded output) and a write transaction (owner check, INSERT);\n"
        "          floor = plain INSERT + UPDATE with psycopg in autocommit.\n"
        "          Interleaved step by step inside DBOS's workflow body; workflow and turn\n"
        "          creation are outside the timing on both sides.\n"
        f"  replay: {RECOVERY_STEPS:,} recorded steps, none run again.\n"
        "          ours = load_journal + the agent loop reading every step back, model off;\n"
        "          DBOS = a workflow left PENDING by a SIGKILLed process, recovered here:\n"
        "          from its body's entry to its return, one read transaction per step;\n"
        "          floor = one raw ordered SELECT of our rows.\n"
        "          'recovery call to return' adds DBOS's re-enqueue and the wait for its\n"
        "          internal queue's poll (every 1 s): our analogue is the sweeper, measured\n"
        "          by `python -m bench recovery`, not here."
    )


def run(*, reps: int = 7, recovery_reps: int = 5) -> dict[str, Any]:
    """Both measures, each side in its own scratch database; print and return them."""
    found = versions()
    out.print(
        "versions: " + " · ".join(f"{package} {version}" for package, version in found.items())
    )
    with scratch_database() as url, scratch_database() as dbos_url:
        DBOS(config=_config(dbos_url, MAIN_EXECUTOR))
        DBOS.launch()
        try:
            pending = make_pending(dbos_url, workflows=recovery_reps + 1, steps=RECOVERY_STEPS)
            steps = bench_steps(url, steps=WRITE_STEPS, reps=reps)
            recovery = bench_recovery(url, pending, steps=RECOVERY_STEPS, reps=recovery_reps)
        finally:
            DBOS.destroy()
    report(steps, recovery, reps, recovery_reps)
    return {
        "versions": found,
        "step": {"steps": WRITE_STEPS, "reps": reps, **steps.as_json()},
        "recovery": {"reps": recovery_reps, **recovery.as_json()},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.peers", description=__doc__)
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write results as JSON")
    parser.add_argument("--reps", type=int, default=7, help="repetitions of the per-step measure")
    parser.add_argument(
        "--recovery-reps", type=int, default=5, help="recovered workflows (and our resumes)"
    )
    args = parser.parse_args(argv)
    if args.reps < 1 or args.recovery_reps < 1:
        parser.error("--reps and --recovery-reps must be at least 1")
    info = machine()
    out.print(info.line())
    started = time.monotonic()
    results = {"machine": info.as_json(), **run(reps=args.reps, recovery_reps=args.recovery_reps)}
    out.print(f"[dim]finished in {time.monotonic() - started:.0f} s[/dim]")
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2, default=str) + "\n")
        out.print(f"results written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
