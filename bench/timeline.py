"""Where the milliseconds of one delivery go: a wall-clock timeline, ours beside the bare task.

The turn of the throughput benchmark (model -> lookup_note -> model -> send_email -> model,
zero-latency scripted model, SMTP inbox) runs one at a time on one solo worker of each side,
alternately (bare, ours, bare, ours ...). Both workers and this process run with the probes
of ``bench/timeline_probe.py``, so every statement, HTTP request, tool call, Redis command,
Celery message, task body and ack is an interval on one clock. Each delivery is then cut
into phases:

* **submit**: ``start_turn`` (ours: INSERT and publish) or ``send_task`` (bare), in the app;
* **broker to worker**: from the publish (the submit's last Redis command) to the worker's
  consumer taking the message;
* **Celery before the task**: the consumer's handling up to ``task_prerun`` (ours: the note
  of the message's receipt);
* **the task**: its statements by name, its model requests, its tools, its Redis commands,
  and the Python around them (the rest of the task's time);
* **Celery after the task**: the ack (sent from the consumer's event loop once the handler
  has returned) and what Celery does up to it.

Times are medians over the turns, per phase, so the sum of the medians need not be the
median of the totals. A second table lays out one delivery of each side (the one of median
total) in order, on one line: the message received, the receipt noted, the claim, the
heartbeat's start, each step's statements and the call between them, the end, the
announcements, the heartbeat's stop and the ack, each with its start and its length, and
the Python between them as its own rows. The intervals of other threads of the worker
(the heartbeat, the sweeper) are counted beside: they run concurrently and cost the turn
only through the GIL and the database.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.table import Table

from durable_agent.cli.console import out
from durable_agent.testing import ScriptedModelServer, SmtpInbox, email_policy
from durable_agent.testing.harness import WorkerProcess, wait_until

from . import scratch_database, timeline_probe
from .throughput import MESSAGE, BareWorker, Bench

Interval = tuple[str, str, str, int, int]


class _Probed:
    """A worker started through ``bench.timeline_probe``, its intervals in ``self.out``."""

    side = "ours"
    out: Path

    def probed(self, command: list[str]) -> list[str]:
        return [sys.executable, "-m", "bench.timeline_probe", str(self.out), self.side, "--",
                *command[3:]]  # fmt: skip

    def intervals(self) -> list[Interval]:
        import json

        lines = self.out.read_text().splitlines() if self.out.exists() else []
        return [tuple(json.loads(line)) for line in lines]  # type: ignore[misc]


class ProbedWorker(_Probed, WorkerProcess):
    def command(self) -> list[str]:
        return self.probed(super().command())


class ProbedBareWorker(_Probed, BareWorker):
    side = "bare"

    def command(self) -> list[str]:
        return self.probed(super().command())


@dataclass
class Delivery:
    """One turn's phases, in ms."""

    phases: dict[str, float] = field(default_factory=dict)
    statements: dict[str, float] = field(default_factory=dict)
    statement_count: int = 0
    sequence: list[tuple[float, float, str]] = field(default_factory=list)  # at, ms, what
    other_threads: dict[str, float] = field(default_factory=dict)

    def add(self, phase: str, ms: float) -> None:
        self.phases[phase] = self.phases.get(phase, 0.0) + ms


def exclusive(intervals: list[Interval]) -> list[tuple[Interval, int]]:
    """Each interval of one thread with its own time: its length less its direct children's."""
    ordered = sorted(intervals, key=lambda i: (i[3], -i[4]))
    own = {id(i): i[4] - i[3] for i in ordered}
    stack: list[Interval] = []
    for i in ordered:
        while stack and stack[-1][4] <= i[3]:
            stack.pop()
        if stack and i[4] <= stack[-1][4]:
            own[id(stack[-1])] -= i[4] - i[3]
        stack.append(i)
    return [(i, own[id(i)]) for i in ordered]


def _within(intervals: Iterable[Interval], start: int, end: int) -> list[Interval]:
    return [i for i in intervals if i[3] >= start and i[4] <= end]


def cut(submit: Interval, worker: list[Interval], app: list[Interval]) -> Delivery:
    """The phases of the delivery whose submit is ``submit``."""
    ms = 1e-6
    d = Delivery()
    _, _, _, s0, s1 = submit
    for i, own in exclusive(_within(app, s0, s1)):
        d.add("submit: " + ("Python" if i[1] == "submit" else _label(i)), own * ms)
    # the worker may take the message before the submit has returned
    messages = [i for i in worker if i[1] == "message" and i[3] >= s0]
    if not messages:
        raise RuntimeError("the worker recorded no delivery after a submit (did it stop early?)")
    message = min(messages, key=lambda i: i[3])
    _, _, _, m0, m1 = message
    published = max((i[4] for i in _within(app, s0, s1) if i[1] == "redis"), default=s1)
    d.add("broker to worker", (m0 - published) * ms)
    thread = message[0]
    task = next(i for i in _within(worker, m0, m1) if i[0] == thread and i[1] == "task")
    # Celery acks a late-acked message from its event loop, after the handler has returned
    ack = min(
        (i for i in worker if i[0] == thread and i[1] == "ack" and i[3] >= task[4]),
        key=lambda i: i[3],
        default=None,
    )
    if ack is not None and ack[4] > m1:
        m1 = ack[4]
    mine = [i for i in _within(worker, m0, m1) if i[0] == thread]
    for i, own in exclusive(mine):
        where = "before" if i[4] <= task[3] else "after" if i[3] >= task[4] else "task"
        label = "Python" if i[1] in ("message", "task") else _label(i)
        if where == "task" and i[1] == "sql":
            d.statements[i[2]] = d.statements.get(i[2], 0.0) + own * ms
            d.statement_count += 1
        if i[1] == "message":
            # the consumer's own time, before and after the task
            before = sum(o for j, o in exclusive(mine) if j[4] <= task[3] and j[1] != "message")
            after = sum(o for j, o in exclusive(mine) if j[3] >= task[4] and j[1] != "message")
            d.add("Celery before the task: Python", (task[3] - m0 - before) * ms)
            # to the ack: the consumer's return to its event loop included
            d.add("Celery after the task: Python", (m1 - task[4] - after) * ms)
            continue
        phase = {"before": "Celery before the task", "after": "Celery after the task"}.get(
            where, "the task"
        )
        d.add(f"{phase}: {label}", own * ms)
    d.add("total, submit to the end of the delivery", (m1 - s0) * ms)
    d.sequence = _sequence(submit, m0, task, mine, app)
    for i in _within(worker, m0, m1):
        if i[0] != thread and i[1] == "sql":
            d.other_threads[i[0]] = d.other_threads.get(i[0], 0.0) + (i[4] - i[3]) * ms
    return d


def _sequence(
    submit: Interval, m0: int, task: Interval, mine: list[Interval], app: list[Interval]
) -> list[tuple[float, float, str]]:
    """The delivery in order: (ms from the submit, ms, what), the outermost calls of the
    worker's thread (a tool's own Redis or HTTP is inside the tool), and the Python between."""
    ms = 1e-6
    s0 = submit[3]
    rows: list[tuple[float, float, str]] = []
    for i in _within(app, s0, submit[4]):
        if i[1] != "submit":
            rows.append(((i[3] - s0) * ms, (i[4] - i[3]) * ms, f"submit: {_named(i)}"))
    rows.append(((m0 - s0) * ms, 0.0, "the worker's consumer takes the message"))
    calls = sorted(
        (i for i in mine if i[1] not in ("message", "task")), key=lambda i: (i[3], -i[4])
    )
    outer: list[Interval] = []
    for i in calls:
        if outer and i[4] <= outer[-1][4]:
            continue  # inside the call before it
        outer.append(i)
    cursor, end = m0, max([task[4], *(i[4] for i in outer)])
    marks = [(task[3], "the task starts (task_prerun)"), (task[4], "the task returns")]
    for i in outer:
        for at, what in [m for m in marks if m[0] <= i[3]]:
            rows.append(((at - s0) * ms, 0.0, what))
            marks.remove((at, what))
        if i[3] - cursor > 20_000:  # 20 us: the Python between two calls
            rows.append(((cursor - s0) * ms, (i[3] - cursor) * ms, "Python"))
        rows.append(((i[3] - s0) * ms, (i[4] - i[3]) * ms, _named(i)))
        cursor = max(cursor, i[4])
    for at, what in marks:
        if at - cursor > 20_000 and at <= end:
            rows.append(((cursor - s0) * ms, (at - cursor) * ms, "Python"))
            cursor = at
        rows.append(((at - s0) * ms, 0.0, what))
    return sorted(rows, key=lambda r: r[0])


def _named(i: Interval) -> str:
    kind, name = i[1], i[2]
    if kind == "sql":
        return f"SQL {name}"
    if kind == "http":
        return f"model HTTP {name}"
    if kind == "tool":
        return f"tool {name}"
    if kind == "heartbeat":
        return f"heartbeat {name}"
    if kind == "ack":
        return "ack"
    return f"Redis {name}"


def _label(i: Interval) -> str:
    kind = i[1]
    if kind == "sql":
        return "SQL"
    if kind == "http":
        return "model (HTTP)"
    if kind == "tool":
        return "tools"
    if kind == "ack":
        return "ack"
    if kind == "heartbeat":
        return "heartbeat (thread start, stop)"
    return "Redis"


def run(*, turns: int = 30, warmup: int = 5) -> dict[str, Any]:
    timeline_probe.install()  # the submits, and what they send, in this process
    with (
        scratch_database() as url,
        tempfile.TemporaryDirectory(prefix="bench-timeline-") as logs,
        ScriptedModelServer(email_policy) as model,
        SmtpInbox() as inbox,
    ):
        bench = Bench(url, Path(logs), model, inbox, stream=False)  # as the throughput's
        workers: dict[str, ProbedWorker | ProbedBareWorker] = {}
        try:
            for side, kind in (("bare", ProbedBareWorker), ("ours", ProbedWorker)):
                settings = bench.ours if side == "ours" else bench.bare
                from durable_agent.testing.harness import settings_env

                from .throughput import ROOT

                env = {**settings_env(settings), **bench.servers, "PYTHONPATH": str(ROOT)}
                worker = kind(env, Path(logs) / f"{side}.log", pool="solo", concurrency=1,
                              name=f"timeline-{side}")  # fmt: skip
                worker.out = Path(logs) / f"{side}.jsonl"
                workers[side] = worker.start()
            for worker in workers.values():
                worker.wait_ready(60)
            submits: dict[str, list[Interval]] = {"ours": [], "bare": []}
            for n in range(warmup + turns):
                for side in ("bare", "ours"):
                    submit = _one_turn(bench, side)
                    if n >= warmup:
                        submits[side].append(submit)
        finally:
            for worker in workers.values():
                worker.stop(timeout=20)
            bench.close()
        app = [i for i in timeline_probe.intervals if i[0] == "MainThread"]
        deliveries = {
            side: [cut(s, workers[side].intervals(), app) for s in submits[side]]
            for side in ("ours", "bare")
        }
    return _report(deliveries, turns)


def _one_turn(bench: Bench, side: str) -> Interval:
    run = uuid.uuid4().hex[:8]
    if side == "ours":
        with timeline_probe.interval("submit", side):
            turn_id = bench.runtime.start_turn(f"timeline-{run}", MESSAGE)
        submit = timeline_probe.intervals[-1]
        wait_until(lambda: bench.runtime.get_turn(turn_id).finished, 60, "the turn", 0.002)
    else:
        app = bench.bare_app()
        with timeline_probe.interval("submit", side):
            app.send_task("bench.bare_turn", args=(f"timeline-{run}", MESSAGE, run))
        submit = timeline_probe.intervals[-1]
        wait_until(lambda: bench.redis.get(f"bench:bare:{run}:last"), 60, "the turn", 0.002)
    time.sleep(0.05)  # the delivery's ack and the consumer's return, before the next submit
    return submit


def _median(deliveries: list[Delivery], key: str, where: str = "phases") -> float:
    return statistics.median(getattr(d, where).get(key, 0.0) for d in deliveries)


def _report(deliveries: dict[str, list[Delivery]], turns: int) -> dict[str, Any]:
    ours, bare = deliveries["ours"], deliveries["bare"]
    phases: list[str] = []
    for d in ours + bare:
        phases += [p for p in d.phases if p not in phases]
    order = ["submit", "broker", "Celery before", "the task", "Celery after", "total"]
    phases.sort(key=lambda p: next(n for n, o in enumerate(order) if p.startswith(o)))
    table = Table(title=f"One delivery, phase by phase: median ms over {turns} turns")
    for column in ("phase", "durable-agent", "bare Celery task", "difference"):
        table.add_column(column, justify="left" if column == "phase" else "right")
    rows = []
    for phase in phases:
        o, b = _median(ours, phase), _median(bare, phase)
        rows.append({"phase": phase, "ours_ms": o, "bare_ms": b})
        table.add_row(phase, f"{o:.2f}", f"{b:.2f}", f"{o - b:+.2f}")
    out.print(table)
    names: dict[str, list[float]] = defaultdict(list)
    for d in ours:
        for name in {n for d2 in ours for n in d2.statements}:
            names[name].append(d.statements.get(name, 0.0))
    statements = sorted(
        ({"statement": n, "ms": statistics.median(v)} for n, v in names.items()),
        key=lambda s: -s["ms"],
    )
    table = Table(title="durable-agent: the task's statements (median ms per turn)")
    table.add_column("statement")
    table.add_column("ms", justify="right")
    for s in statements:
        table.add_row(s["statement"], f"{s['ms']:.2f}")
    out.print(table)
    count = statistics.median(d.statement_count for d in ours)
    others = sorted({t for d in ours for t in d.other_threads})
    beside = {t: _median(ours, t, "other_threads") for t in others}
    out.print(
        f"statements in the task: {count:.0f} per turn; beside it, on other threads of the "
        "worker: " + (", ".join(f"{t} {ms:.2f} ms" for t, ms in beside.items()) or "none")
    )
    sequences = {}
    for side, ds in deliveries.items():
        total = "total, submit to the end of the delivery"
        middle = sorted(ds, key=lambda d: d.phases.get(total, 0.0))[len(ds) // 2]
        sequences[side] = [{"at_ms": at, "ms": length, "what": what}
                           for at, length, what in middle.sequence]  # fmt: skip
        table = Table(title=f"{'durable-agent' if side == 'ours' else 'bare Celery task'}: "
                      "the delivery of median total, in order (ms from the submit)")  # fmt: skip
        for column in ("at", "ms", "what"):
            table.add_column(column, justify="left" if column == "what" else "right")
        for at, length, what in middle.sequence:
            table.add_row(f"{at:.2f}", f"{length:.2f}" if length else "", what)
        out.print(table)
    return {
        "turns": turns,
        "phases": rows,
        "sequences": sequences,
        "statements": statements,
        "statements_per_turn": count,
        "other_threads_ms": beside,
    }
