"""Everything an eval or the demo runs against, started and stopped as one.

Postgres and Redis come from the settings when they are reachable; when they are not and
the user did not name them explicitly, embedded servers start under a data directory the
user can see and delete. The scripted model (unless a real endpoint is configured), the
SMTP test inbox and the payments sandbox run in this process; workers are real processes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

import openai
import redis
from kombu.utils.url import maybe_sanitize_url

from ..errors import ConfigurationError, DurableAgentError, ServiceUnavailable
from ..journal import Database, Turn, migrate
from ..journal.db import describe_url
from ..runtime import Runtime
from ..settings import Settings
from ..testing import POLICIES, PaymentsSandbox, ScriptedModelServer, SmtpInbox
from ..testing.harness import WorkerProcess, forget_queue, settings_env, wait_until
from ..testing.model_server import Policy

log = logging.getLogger(__name__)


def postgres_reachable(url: str) -> bool:
    db = Database(url)
    try:
        db.value("ping")
        return True
    except DurableAgentError:
        return False
    finally:
        db.close()


def redis_reachable(url: str) -> bool:
    client = redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=2)
    try:
        return bool(client.ping())
    except (redis.RedisError, OSError):
        return False
    finally:
        client.close()


def _check_model_api(settings: Settings) -> None:
    """Fail fast with one line when a configured model endpoint cannot be reached."""
    client = openai.OpenAI(
        base_url=settings.openai_base_url,
        api_key=settings.openai_api_key or "unused",
        max_retries=0,
        timeout=10,
    )
    where = settings.openai_base_url or "the OpenAI API"
    try:
        client.models.list()
    except openai.APIConnectionError as error:
        raise ServiceUnavailable(f"cannot reach the model API at {where}: {error}") from error
    except openai.AuthenticationError as error:
        raise ConfigurationError(f"the model API at {where} refused the key: {error}") from error
    except openai.APIStatusError:
        pass  # some compatible servers have no /models; the chat endpoint may still work
    finally:
        client.close()


class EvalStack:
    """Database, broker, model, inbox and payments for one eval run, plus its workers."""

    def __init__(
        self,
        base: Settings,
        *,
        work_dir: Path,
        policy: str | Policy = "email",
        tools: str = "durable_agent_examples.email_tools",
        lease_seconds: float = 2.0,
        sweep_interval_seconds: float = 0.5,
        real_model: bool = False,
        data_dir: Path | None = None,
        extra: dict[str, Any] | None = None,
        pool: str = "solo",
        services_from_settings: bool = False,
    ) -> None:
        self.base = base
        self.work_dir = work_dir
        self.policy = policy
        self.tools = tools
        self.lease_seconds = lease_seconds
        self.sweep_interval_seconds = sweep_interval_seconds
        self.real_model = real_model
        self.data_dir = data_dir or Path.cwd() / ".durable-agent"
        self.pool = pool
        self.extra = extra or {}
        self.services_from_settings = services_from_settings
        self.worker_extra_env: dict[str, str] = {}
        self.embedded: Any = None
        self.model: ScriptedModelServer | None = None
        self.inbox = SmtpInbox()
        self.payments = PaymentsSandbox()
        self.workers: list[WorkerProcess] = []
        self.settings = base
        self.runtime = Runtime(base)
        self.notes: list[str] = []
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> Self:
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _start(self) -> None:
        database_url, broker_url = self._services()
        db = Database(database_url)
        try:
            migrate(db)
        finally:
            db.close()
        self._stack.enter_context(self.inbox)
        self._stack.enter_context(self.payments)
        update: dict[str, Any] = {
            "database_url": database_url,
            "broker_url": broker_url,
            "queue": f"eval-{uuid.uuid4().hex[:10]}",
            "tools": self.tools,
            "lease_seconds": self.lease_seconds,
            "sweep_interval_seconds": self.sweep_interval_seconds,
            **self.extra,
        }
        if self.real_model:
            _check_model_api(self.base)
        else:
            policy = POLICIES[self.policy] if isinstance(self.policy, str) else self.policy
            self.model = ScriptedModelServer(policy)
            self._stack.enter_context(self.model)
            update["openai_base_url"] = self.model.base_url
            update["openai_api_key"] = "unused"  # too short to be redacted as a secret
            update["model"] = "scripted-model"
        self.settings = self.base.model_copy(update=update)
        self.runtime = Runtime(self.settings)

    def _services(self) -> tuple[str, str]:
        """Postgres and Redis: the configured ones (``DURABLE_AGENT_DATABASE_URL``,
        ``DURABLE_AGENT_BROKER_URL``), or embedded servers where none is configured."""
        database_url, broker_url = self.base.database_url, self.base.broker_url
        given = self.services_from_settings
        need_pg = not given and "DURABLE_AGENT_DATABASE_URL" not in os.environ
        need_redis = not given and "DURABLE_AGENT_BROKER_URL" not in os.environ
        if not need_pg and not postgres_reachable(database_url):
            raise ServiceUnavailable(f"cannot reach Postgres at {describe_url(database_url)}")
        if not need_redis and not redis_reachable(broker_url):
            raise ServiceUnavailable(f"cannot reach Redis at {maybe_sanitize_url(broker_url)}")
        if need_pg or need_redis:
            from ..embedded import EmbeddedServiceError, EmbeddedServices

            self.embedded = EmbeddedServices(self.data_dir, postgres=need_pg, redis=need_redis)
            try:
                self.embedded.start()
            except EmbeddedServiceError as error:
                raise ConfigurationError(str(error)) from error
            self._stack.callback(self.embedded.stop)
            if need_pg:
                database_url = self.embedded.database_url
                self.notes.append(f"embedded Postgres in {self.data_dir}")
            if need_redis:
                broker_url = self.embedded.broker_url
                self.notes.append(f"embedded Redis in {self.data_dir}")
        return database_url, broker_url

    def worker_env(self, **extra: str) -> dict[str, str]:
        env = settings_env(self.settings)
        env.update(
            SMTP_URL=self.inbox.smtp_url,
            INBOX_URL=self.inbox.api_url,
            PAYMENTS_URL=self.payments.url,
        )
        env.update(self.worker_extra_env)
        env.update(extra)
        return env

    def start_worker(self, name: str, *, wait: bool = True, **env: str) -> WorkerProcess:
        """A worker process with the stack's pool (a prefork worker gets one child, so the
        turn runs where a crash point fires)."""
        worker = WorkerProcess(
            self.worker_env(**env),
            self.work_dir / f"{name}.log",
            name=name,
            pool=self.pool,
            concurrency=1,
            die_with_parent=True,
        )
        self.workers.append(worker)
        worker.start()
        if wait:
            try:
                worker.wait_ready(timeout=60)
            except RuntimeError:  # it exited: its own one-line reason, not its log
                said = [line for line in worker.log_text().splitlines() if "error:" in line]
                reason = said[-1].partition("error:")[2].strip() if said else worker.log_tail(1)
                raise ConfigurationError(f"worker {name} did not start: {reason}") from None
        return worker

    def close(self) -> None:
        for worker in self.workers:
            worker.stop(timeout=5)
        self.runtime.close()
        if self.settings is not self.base and redis_reachable(self.settings.broker_url):
            client = redis.Redis.from_url(self.settings.broker_url)
            try:
                forget_queue(client, self.settings.queue)
            finally:
                client.close()
        self._stack.close()


@dataclass
class Recovery:
    """A turn whose first worker died at a crash point and a fresh worker finished."""

    turn: Turn
    crashed: bool
    recovery_seconds: float | None


def crash_and_recover(
    stack: EvalStack,
    session_id: str,
    message: str,
    crash_at: str,
    timeout: float = 60.0,
    agent: str | None = None,
) -> Recovery:
    """Start a worker armed with ``CRASH_AT``, submit the turn and let the crash happen; then
    let the turn finish through the system's own recovery. Solo pool: the worker process
    dies and a fresh worker takes the turn through the sweeper and the claim. Prefork pool:
    the pool child dies, Celery gives the message back and a new child of the same worker
    takes the turn (the crash point does not fire again: that step is read back now)."""
    runtime = stack.runtime
    tag = session_id.replace(":", "-")
    doomed = stack.start_worker(f"crash-{tag}", CRASH_AT=crash_at)
    turn_id = runtime.start_turn(session_id, message, agent=agent)
    if stack.pool == "solo":
        try:
            code: int | None = doomed.wait_exit(timeout)
        except TimeoutError:
            code = None
        crashed = code == 1 and "CRASH_AT" in doomed.log_text()
        crashed_at = time.monotonic()
        doomed.stop()
        finisher = stack.start_worker(f"rescue-{tag}", wait=False)
    else:
        try:
            wait_until(lambda: "CRASH_AT" in doomed.log_text(), timeout, "the crash point")
            crashed = doomed.alive()
        except TimeoutError:
            crashed = False
        crashed_at = time.monotonic()
        finisher = doomed
    try:
        turn = runtime.wait_for_turn(turn_id, timeout)
        recovery: float | None = round(time.monotonic() - crashed_at, 2)
    except TimeoutError:
        turn, recovery = runtime.get_turn(turn_id), None
    finally:
        finisher.stop()
        doomed.stop()
    return Recovery(turn=turn, crashed=crashed, recovery_seconds=recovery)
