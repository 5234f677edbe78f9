"""Recovery: from SIGKILL of a whole worker mid-turn to the turn's next step, written by
another worker that was already running, with the default lease and sweep interval.

Two real ``durable-agent worker`` processes serve one queue; an in-process scripted model
server (``email_policy``) is held so a turn stops inside its first model call. The worker
holding the claim (the pid in ``turns.lease_owner``) is SIGKILLed with its process group at
t0, the hold is released, and the journal is polled until a row of a later epoch appears
at t1. Its message stays unacked in Redis, so Celery alone would not deliver it again before
the visibility timeout; the sweeper of the surviving worker re-enqueues the turn once the
dead worker's claim ended. A replacement worker is started after each run, so two workers
are running at every kill.

Two series: with ``end_dead_local_claims`` off the claim ends when its lease runs out, as
when the dead worker ran on another machine; with it on (the default) the survivor sees that
the holder's pid is gone from this machine and ends the claim at once.
"""

from __future__ import annotations

import contextlib
import os
import signal
import statistics
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import redis
from rich.table import Table

from durable_agent import start_turn
from durable_agent.cli.console import out
from durable_agent.journal import Database, JournalStore, Turn
from durable_agent.runtime import runtime_for
from durable_agent.settings import Settings
from durable_agent.testing import ScriptedModelServer, SmtpInbox, email_policy
from durable_agent.testing.harness import WorkerProcess, settings_env, wait_until

from . import REDIS_URL, scratch_database

MESSAGE = "Please email the note 'launch' to ada@example.com."
CLEAN_REPLY = "Done: the note 'launch' was sent to ada@example.com."
GOAL_SECONDS = 10.0  # the goal, with default settings


@dataclass(frozen=True)
class Run:
    run: int
    killed: str
    killed_epoch: int
    lease_left_at_kill: float
    recovered_by: str
    recovery_seconds: float


def _owner_pid(turn: Turn) -> int:
    """The pid in ``lease_owner`` (host:pid:thread)."""
    if turn.lease_owner is None:
        raise RuntimeError(f"turn {turn.turn_id} has no lease owner")
    return int(turn.lease_owner.rsplit(":", 2)[1])


def _worker_of(workers: list[WorkerProcess], pid: int) -> WorkerProcess:
    for worker in workers:
        if worker.alive() and (worker.pid == pid or _pgid(pid) == worker.pid):
            return worker
    raise RuntimeError(f"no running worker has pid {pid}")


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def _forget_queue(client: redis.Redis, queue: str) -> None:
    """Remove the queue, its bindings and kombu's unacked copies of its messages from the
    shared Redis."""
    client.delete(queue, *(f"{queue}\x06\x16{priority}" for priority in range(10)))
    client.delete(f"_kombu.binding.{queue}", f"_kombu.binding_permanent.{queue}")
    stale = [tag for tag, payload in client.hscan_iter("unacked") if queue.encode() in payload]
    if stale:
        client.hdel("unacked", *stale)
        client.zrem("unacked_index", *stale)


class _Fleet:
    """The workers of this benchmark, all stopped by PID at the end."""

    def __init__(self, env: dict[str, str], logs: Path) -> None:
        self.env = env
        self.logs = logs
        self.started: list[WorkerProcess] = []

    def start(self) -> WorkerProcess:
        name = f"worker{len(self.started) + 1}"
        worker = WorkerProcess(self.env, self.logs / f"{name}.log", name=name)
        self.started.append(worker)
        return worker.start()

    @property
    def running(self) -> list[WorkerProcess]:
        return [w for w in self.started if w.alive()]

    def tails(self) -> str:
        return "\n".join(f"--- {w.name} (pid {w.pid}) ---\n{w.log_tail()}" for w in self.started)

    def stop(self) -> None:
        for worker in self.started:
            worker.stop(timeout=5)


def _one_run(
    index: int, settings: Settings, store: JournalStore, model: ScriptedModelServer, fleet: _Fleet
) -> Run:
    model.hold()
    turn_id = start_turn(f"bench-recovery-{index}", MESSAGE, settings=settings)
    model.wait_for_waiting(1, timeout=30)
    turn = store.get_turn(turn_id)
    victim = _worker_of(fleet.running, _owner_pid(turn))
    others = [w for w in fleet.running if w is not victim]
    if len(others) != 1:
        raise RuntimeError(f"expected one other running worker, found {len(others)}")

    victim.kill(signal.SIGKILL)
    t0 = time.monotonic()
    refusal = store.db.one("claim_refusal", turn_id=turn_id, key_limit=None)
    assert refusal is not None and refusal["lease_expires_at"] is not None
    lease_left = (refusal["lease_expires_at"] - refusal["now"]).total_seconds()
    model.release()

    def next_step_written() -> bool:
        return any(row.epoch > turn.lease_epoch for row in store.load_journal(turn_id))

    wait_until(next_step_written, 60, f"turn {turn_id} to be resumed", interval=0.01)
    t1 = time.monotonic()

    if victim.wait_exit(10) != -signal.SIGKILL:
        raise RuntimeError(f"{victim.name} did not die of SIGKILL")
    replacement = fleet.start()  # two workers at the next kill
    wait_until(
        lambda: store.get_turn(turn_id).finished, 60, f"turn {turn_id} to finish", interval=0.05
    )
    finished = store.get_turn(turn_id)
    if finished.status != "done" or finished.reply != CLEAN_REPLY or finished.crashes != 1:
        raise RuntimeError(
            f"turn {turn_id} ended {finished.status} crashes={finished.crashes} "
            f"reply={finished.reply!r} error={finished.error!r}"
        )
    replacement.wait_ready(timeout=60)
    return Run(
        run=index,
        killed=f"{victim.name} (epoch {turn.lease_epoch})",
        killed_epoch=turn.lease_epoch,
        lease_left_at_kill=float(lease_left),
        recovered_by=others[0].name,  # the only other worker running before t1
        recovery_seconds=t1 - t0,
    )


def _series(runs: int, *, end_dead_local_claims: bool) -> tuple[list[Run], Settings]:
    """Kill the claim holder ``runs`` times with one setting of the dead-holder fast path."""
    queue = f"bench-{uuid.uuid4().hex[:10]}"
    client = redis.Redis.from_url(REDIS_URL)
    results: list[Run] = []
    with (
        scratch_database() as url,
        ScriptedModelServer(email_policy) as model,
        SmtpInbox() as inbox,
        tempfile.TemporaryDirectory(prefix="bench-recovery-") as logs,
    ):
        settings = Settings(
            database_url=url,
            broker_url=REDIS_URL,
            queue=queue,
            openai_base_url=model.base_url,
            openai_api_key="bench",
            tools="durable_agent_examples.email_tools",
            end_dead_local_claims=end_dead_local_claims,
        )
        env = {
            **settings_env(settings),
            "SMTP_URL": inbox.smtp_url,
            "INBOX_URL": inbox.api_url,
            "DURABLE_AGENT_TOOLS": "durable_agent_examples.email_tools",
        }
        fleet = _Fleet(env, Path(logs))
        db = Database(url)
        store = JournalStore(db)
        try:
            for worker in (fleet.start(), fleet.start()):
                worker.wait_ready(timeout=60)
            for index in range(1, runs + 1):
                results.append(_one_run(index, settings, store, model, fleet))
            if inbox.count != runs:
                raise RuntimeError(f"{inbox.count} emails for {runs} turns")
        except Exception:
            out.print(f"[red]recovery benchmark failed[/red]\n{fleet.tails()}")
            raise
        finally:
            model.release()
            fleet.stop()
            db.close()
            runtime_for(settings).close()  # the connections start_turn opened
            with contextlib.suppress(redis.RedisError):
                _forget_queue(client, queue)
            client.close()

    return results, settings


def run(*, runs: int = 5) -> dict[str, Any]:
    """Kill a worker mid-turn ``runs`` times per path; print and return the recovery times.

    Two series: with the dead-holder fast path off, as when the dead worker ran on another
    machine (recovery waits for its lease), and on, as when it ran on this one.
    """
    fields = Settings.model_fields
    defaults = (fields["lease_seconds"].default, fields["sweep_interval_seconds"].default)
    series = {
        "another machine (lease runs out)": _series(runs, end_dead_local_claims=False),
        "this machine (dead pid seen)": _series(runs, end_dead_local_claims=True),
    }
    settings = next(iter(series.values()))[1]
    lease, sweep = settings.lease_seconds, settings.sweep_interval_seconds
    visibility = settings.visibility_timeout_seconds

    per_run = Table(
        title="Recovery runs: SIGKILL of the claim holder → next step by another worker"
    )
    for column in (
        "dead worker on",
        "run",
        "killed",
        "lease left at kill",
        "resumed by",
        "recovery",
    ):
        per_run.add_column(
            column, justify="left" if column in ("dead worker on", "killed") else "right"
        )
    for where, (results, _) in series.items():
        for r in results:
            per_run.add_row(
                where,
                str(r.run),
                r.killed,
                f"{r.lease_left_at_kill:.2f} s",
                r.recovered_by,
                f"{r.recovery_seconds:.2f} s",
            )
    out.print(per_run)

    summary = Table(title=f"Recovery after SIGKILL mid-turn ({runs} runs each, default settings)")
    for column in ("dead worker on", "lease", "sweep interval", "median", "min", "max"):
        summary.add_column(column, justify="left" if column == "dead worker on" else "right")
    report: dict[str, Any] = {
        "lease_seconds": lease,
        "sweep_interval_seconds": sweep,
        "goal_seconds": GOAL_SECONDS,
        "celery_only_seconds": visibility,
        "series": {},
    }
    for where, (results, _) in series.items():
        seconds = [r.recovery_seconds for r in results]
        median = statistics.median(seconds)
        summary.add_row(
            where,
            f"{lease:g} s",
            f"{sweep:g} s",
            f"{median:.2f} s",
            f"{min(seconds):.2f} s",
            f"{max(seconds):.2f} s",
        )
        report["series"][where] = {
            "runs": [asdict(r) for r in results],
            "median_seconds": median,
            "min_seconds": min(seconds),
            "max_seconds": max(seconds),
            "goal_met": median < GOAL_SECONDS,
        }
    summary.add_row(
        "Celery alone: Redis visibility_timeout (not measured)",
        "-",
        "-",
        f"≈ {visibility:g} s",
        "",
        "",
    )
    out.print(summary)
    worst = max(v["median_seconds"] for v in report["series"].values())
    verdict = "met" if worst < GOAL_SECONDS else "NOT met"
    out.print(
        f"goal: under {GOAL_SECONDS:g} s with default settings: {verdict} "
        f"(worst median {worst:.2f} s)"
    )
    if (lease, sweep) != defaults:
        out.print("[yellow]note: lease or sweep interval overridden by the environment[/yellow]")
    return report
