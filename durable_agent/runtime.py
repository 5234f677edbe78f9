"""The runtime: one deployment's wiring, built once from :class:`Settings`.

A :class:`Runtime` is the composition root: it holds the database, the journal, the claims,
the operators' store, the Celery app, the tools, the agents and the model client, built on
first use, and hands each lower module the parts it uses (a store, an ``enqueue``, a
publish function), never itself. The entry points above it (the client functions, the
operator's API, ``durable_agent.tasks``, the command line and the evals) start from one.
The Celery tasks are registered on the runtime's own app, so ``run_turn.delay()`` and
``start_turn()`` of one runtime always reach the same broker and queue.

Nothing that holds a connection, a lock or a thread crosses a fork: in a child process (a
prefork pool's worker) the runtime starts again with no connection, no model client and
fresh locks, and builds its own on first use.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import weakref
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from .errors import ConfigurationError, InvalidArgument, ServiceUnavailable
from .inputs import check_count, check_id, check_message
from .journal import (
    AgentSeen,
    Database,
    JournalStore,
    Leases,
    OperatorStore,
    Spend,
    Turn,
    TurnFilter,
    TurnStatus,
    WorkerSeen,
    require_current,
)
from .operate.budgets import Budgets
from .operate.live import Announcements
from .operate.reads import LiveReads
from .operate.spend import check_grouping, spend_of_turns, spend_report
from .operate.tokens import TokenStreams
from .redact import remember_secrets
from .settings import Settings, load_settings
from .step.tools import ToolRegistry, import_module, load_tools
from .telemetry import TelemetryParts

if TYPE_CHECKING:
    from celery import Celery

    from .delivery.outage import Outage
    from .delivery.sweeper import Sweeper
    from .delivery.turn_worker import TurnWorker
    from .operate.paging import Hook
    from .step.agents import AgentBook
    from .step.faults import Faults
    from .step.model import ModelClient

log = logging.getLogger(__name__)

T = TypeVar("T")
MAX_LIST = 10_000


class Runtime(LiveReads, TelemetryParts):
    """Everything a durable-agent process needs, built from one Settings object."""

    def __init__(self, settings: Settings | None = None, *, tools: ToolRegistry | None = None):
        self.settings = settings if settings is not None else load_settings()
        remember_secrets(self.settings.secrets())  # redacted wherever they appear
        self._given_tools = tools
        self._parts: dict[str, Any] = {}
        self._lock = threading.RLock()
        _live.add(self)

    def __repr__(self) -> str:
        return f"Runtime(queue={self.settings.queue!r})"

    def _part(self, name: str, build: Callable[[], T]) -> T:
        with self._lock:
            if name not in self._parts:
                self._parts[name] = build()
            value: T = self._parts[name]
            return value

    def _after_fork_in_child(self) -> None:
        # The database resets itself; the model client's HTTP pool and the turn worker
        # that holds it are the parent's: build new ones here on first use.
        self._lock = threading.RLock()
        for name in ("model", "turn_worker"):
            self._parts.pop(name, None)
        for name in ("announcements", "token_streams", "budgets"):
            part = self._parts.get(name)
            if part is not None:
                part.after_fork_in_child()

    # -- the parts ------------------------------------------------------------------------

    @property
    def database(self) -> Database:
        url, sealer = self.settings.database_url, self.settings.sealer
        return self._part("database", lambda: Database(url, sealer=sealer()))

    @property
    def journal(self) -> JournalStore:
        return self._part(
            "journal",
            lambda: JournalStore(self.database, blob_threshold=self.settings.blob_threshold_bytes),
        )

    @property
    def leases(self) -> Leases:
        return self._part(
            "leases",
            lambda: Leases(
                self.database,
                end_dead_local_claims=self.settings.end_dead_local_claims,
                key_limit=self.settings.concurrency_per_key or None,
            ),
        )

    @property
    def operator_store(self) -> OperatorStore:
        """The operators' records: cancellations, approvals, resolutions, pruning."""
        return self._part("operator_store", lambda: OperatorStore(self.database))

    @property
    def announcements(self) -> Announcements:
        """This process's LISTEN connection for live turns (see ``live.py``)."""
        return self._part("announcements", lambda: Announcements(self.database.conninfo))

    @property
    def token_streams(self) -> TokenStreams | None:
        """The Redis streams of streamed answers' tokens (None without a Redis)."""
        return self._part("token_streams", lambda: TokenStreams.from_settings(self.settings))

    @property
    def budgets(self) -> Budgets | None:
        """The fleet's model budgets (``DURABLE_AGENT_MODEL_LIMITS``; None without any)."""
        s = self.settings
        return self._part("budgets", lambda: Budgets(s) if s.limits and s.budgets_url else None)

    @property
    def tools(self) -> ToolRegistry:
        """The tools of ``DURABLE_AGENT_TOOLS`` (imported on first use), or those given."""
        return self._part("tools", self._load_tools)

    def _load_tools(self) -> ToolRegistry:
        if self._given_tools is not None:
            return self._given_tools
        labels = self.settings.label_overrides
        registry = load_tools(self._modules(), labels)
        for name, label in labels.items():
            log.warning("tool %s relabelled %r by DURABLE_AGENT_TOOL_LABELS", name, label)
        return registry

    def _modules(self) -> list[str]:
        """The user's modules: the tools modules, then the agents modules."""
        names = self.settings.tool_modules + self.settings.agent_modules
        return list(dict.fromkeys(names))

    @property
    def agents(self) -> AgentBook:
        """The agents of the user's modules plus ``default`` (the environment's), and the
        ones this process's workers serve (``DURABLE_AGENT_SERVE_AGENTS``)."""
        return self._part("agents", self._load_agents)

    def _load_agents(self) -> AgentBook:
        from .step.agents import DEFAULT_AGENT, Agent, AgentBook, bind, find_agents
        from .step.chat import chat_completions

        registry = self.tools
        defined = find_agents(import_module(name) for name in self._modules())
        if not any(a.name == DEFAULT_AGENT for a in defined):
            defined.append(Agent(DEFAULT_AGENT))
        bound = [bind(a, self.settings, registry, chat_completions) for a in defined]
        for agent in bound:
            if agent.name == DEFAULT_AGENT and agent.queue != self.settings.queue:
                raise ConfigurationError(
                    f"the agent named {DEFAULT_AGENT!r} uses the queue of DURABLE_AGENT_QUEUE "
                    f"({self.settings.queue!r}), not {agent.queue!r}"
                )
        return AgentBook(bound, serve=self.settings.served_agents)

    @property
    def model(self) -> ModelClient:
        from .step.model import ModelClient

        return self._part("model", lambda: ModelClient(self.settings))

    @property
    def celery(self) -> Celery:
        """The Celery app of this runtime, with durable-agent's tasks registered on it."""
        from .delivery.celery_app import create_app

        return self._part("celery", lambda: create_app(self))

    @property
    def outage(self) -> Outage:
        """This process's view of Postgres outages (one log line as one starts and ends)."""
        from .delivery.outage import Outage

        return self._part("outage", lambda: Outage(lambda: self.database.value("ping")))

    def turn_worker(self) -> TurnWorker:
        """What runs deliveries in this process (tools imported, model client built)."""
        return self._part("turn_worker", self.build_turn_worker)

    def build_turn_worker(self, *, faults: Faults | None = None) -> TurnWorker:
        """A new turn worker on this runtime's parts (``faults``: armed crash points, for
        tests; by default those of ``DURABLE_AGENT_CRASH_AT``)."""
        from .delivery.turn_worker import TurnWorker

        return TurnWorker(
            self.settings,
            store=self.journal,
            leases=self.leases,
            operator_store=self.operator_store,
            agents=self.agents,
            model=self.model,
            outage=self.outage,
            faults=faults,
            tokens=self.token_streams,
            budgets=self.budgets,
            observe_steps=self.tracing.steps if self.tracing is not None else None,
        )

    def sweeper(self) -> Sweeper:
        from .delivery.sweeper import Sweeper

        return self._part(
            "sweeper",
            lambda: Sweeper(
                self.settings, self.leases, self.outage, self.publish, self.notify_uncertain
            ).counted_by(self.counters),
        )

    # -- wiring for the lower modules ---------------------------------------------------

    def publish(self, session_id: str, turn_id: str, **message: Any) -> None:
        """``doorbell.send`` with this runtime's app (``queue``, ``message_id``, ``trace``)."""
        from .delivery.doorbell import send

        send(self.celery, session_id, turn_id, **message)

    def store_end(self, turn_id: str) -> None:
        """Keep the end of the turn in Celery's result backend, if one is set, for
        ``agent_turn.delay(...).get()`` (see ``delivery/results.py``)."""
        from .delivery.results import store_end

        store_end(self, turn_id)

    def uncertain_hooks(self) -> dict[str, Hook]:
        """The hooks told of new uncertain effects, by name (``DURABLE_AGENT_UNCERTAIN_*``)."""
        from .operate.paging import hooks

        return hooks(self.settings, lambda *args, **kwargs: self.celery.send_task(*args, **kwargs))

    def notify_uncertain(self) -> int:
        """Tell the hooks of new uncertain effects, once each (a sweeper pass calls this)."""
        from .operate.paging import notify_new

        return notify_new(self.operator_store, self.journal, self.settings, self.uncertain_hooks)

    # -- checks ---------------------------------------------------------------------------

    def require_schema(self) -> None:
        """Postgres is reachable and migrated to this code's version; else a one-line error."""
        require_current(self.database)

    def database_now(self) -> datetime:
        """Postgres's clock (``durable_agent_now()``), by which every recorded time is taken."""
        return self.journal.now()

    def check_worker_start(self) -> None:
        """Everything a worker needs before it takes a turn; raises with one line if not.

        Postgres reachable and migrated, the tools module importable and defining tools,
        the model endpoint configured.
        """
        from .delivery.start_checks import check_tool_names

        self.require_schema()
        # a DURABLE_AGENT_UNCERTAIN_CALLBACK that cannot be imported stops here
        self.uncertain_hooks()
        worker = self.turn_worker()
        self.agents  # noqa: B018 (a bad agent definition fails the start)
        check_tool_names(self.settings.approval_tools, worker.faults.armed, self.tools, self.agents)
        if not len(self.tools):
            where = ", ".join(self.settings.tool_modules) or "(DURABLE_AGENT_TOOLS is empty)"
            raise ConfigurationError(
                f"no tools: the tools module(s) {where} define no @tool; "
                "set DURABLE_AGENT_TOOLS to the module(s) that define your tools"
            )

    # -- the client -----------------------------------------------------------------------

    @property
    def queues(self) -> list[str]:
        """The queues of the agents this runtime's workers serve (others are handed back)."""
        return self.agents.queues

    def enqueue(self, session_id: str, turn_id: str, queue: str = "", trace: str = "") -> None:
        """Send ``run_turn(session_id, turn_id)`` to the turn's queue (``""``: this
        runtime's), having noted first which message is the turn's latest."""
        from .delivery.doorbell import new_message_id

        message_id = new_message_id()
        self.journal.mark_sent([turn_id], [message_id])
        try:
            self.publish(session_id, turn_id, queue=queue, message_id=message_id, trace=trace)
        except ServiceUnavailable:
            self.journal.unmark_sent(turn_id, message_id)
            raise

    def start_turn(
        self,
        session_id: str,
        message: str,
        *,
        turn_id: str | None = None,
        agent: str | None = None,
        connection: object | None = None,
        concurrency_key: str | None = None,
    ) -> str:
        """Record a turn of ``agent`` (``default`` when None) in Postgres, then enqueue it
        on the agent's queue; returns the turn id (see :func:`durable_agent.start_turn`:
        ``turn_id`` makes a retry idempotent, ``connection`` records it in your transaction,
        ``concurrency_key`` limits the turns of one key running at once)."""
        check_id("session_id", session_id)
        check_message(message, self.settings.max_message_bytes)
        if turn_id is not None:
            check_id("turn_id", turn_id)
        if concurrency_key is None and agent is not None and agent != "default":
            from .step.agents import check_agent_name

            concurrency_key = self.agents[check_agent_name(agent)].key_for(session_id)
        if concurrency_key is not None:
            check_id("concurrency_key", concurrency_key)
        if connection is not None:
            from .app.transaction import start_in_transaction

            return start_in_transaction(
                self,
                connection,
                session_id,
                message,
                turn_id=turn_id,
                agent=agent,
                concurrency_key=concurrency_key,
            )
        name, queue = self.agent_queue(agent)
        trace = self.trace_context()  # the caller's span, when tracing is on
        turn = self.journal.create_turn(
            session_id,
            message,
            turn_id=turn_id,
            queue=queue,
            agent=name,
            concurrency_key=concurrency_key,
            trace_context=trace,
        )
        keyed = concurrency_key is not None and self.leases.key_limit and turn.attempts == 0
        if keyed and not self.leases.admit_new_keyed(turn.turn_id):
            return turn.turn_id  # its key is full: sent when a turn of the key ends
        if turn.status in (TurnStatus.QUEUED, TurnStatus.RUNNING):
            try:
                self.enqueue(session_id, turn.turn_id, turn.queue, trace or "")
            except ServiceUnavailable as error:
                log.warning(
                    "turn %s is recorded; %s; the sweeper will enqueue it", turn.turn_id, error
                )
        return turn.turn_id

    def agent_queue(self, agent: str | None) -> tuple[str, str]:
        """(name, queue) of the agent a new turn belongs to; ``default`` (None) needs no
        module loaded: its queue is ``DURABLE_AGENT_QUEUE``."""
        from .step.agents import DEFAULT_AGENT, check_agent_name

        if agent is None or agent == DEFAULT_AGENT:
            return DEFAULT_AGENT, self.settings.queue
        return agent, self.agents[check_agent_name(agent)].queue

    def get_turn(self, turn_id: str) -> Turn:
        """The turn as recorded now, with its spend ledger; raises TurnNotFound for an
        unknown id."""
        return self.with_spend([self.journal.get_turn(check_id("turn_id", turn_id))])[0]

    def list_turns(self, session_id: str | None = None, limit: int = 100) -> list[Turn]:
        """One session's turns in order, or the newest turns first (at most ``limit``),
        each with its spend ledger."""
        if session_id is not None:
            check_id("session_id", session_id)
        check_count("limit", limit, MAX_LIST)
        return self.with_spend(self.journal.list_turns(session_id, limit=limit))

    def find_turns(
        self,
        turn_filter: TurnFilter | None = None,
        *,
        before: tuple[datetime, str] | None = None,
        limit: int = 50,
    ) -> list[Turn]:
        """The turns that match ``turn_filter``, newest first, at most ``limit``, without
        their spend; the next page starts ``before`` the last one's (created_at, turn_id)."""
        check_count("limit", limit, MAX_LIST)
        return self.journal.find_turns(turn_filter or TurnFilter(), before=before, limit=limit)

    def workers(self, window_seconds: float = 3600.0) -> list[WorkerSeen]:
        """The worker processes Postgres knows of: claims they hold, their furthest lease,
        messages received within ``window_seconds``."""
        return self.journal.workers(window_seconds)

    def agents_seen(self) -> list[AgentSeen]:
        """Each agent and digest the recorded turns ran with."""
        return self.journal.agents_seen()

    def with_spend(self, turns: list[Turn]) -> list[Turn]:
        """The turns with their spend ledgers (one query)."""
        ledgers = spend_of_turns(
            self.journal, self.settings.price_table, [t.turn_id for t in turns]
        )
        return [dataclasses.replace(t, spend=ledgers[t.turn_id]) for t in turns]

    def spend(
        self, by: str = "turn", limit: int = 50, since: datetime | None = None
    ) -> list[Spend]:
        """The spend ledger per turn (newest first), per agent, or per day (latest first),
        of the turns created since ``since`` if given: model calls and tokens, crash waste
        and what the journal saved (``by``: ``"turn"``, ``"agent"`` or ``"day"``)."""
        check_grouping(by)
        check_count("limit", limit, MAX_LIST)
        if since is not None and (not isinstance(since, datetime) or since.tzinfo is None):
            raise InvalidArgument("since must be a datetime with a time zone")
        return spend_report(
            self.journal, self.settings.price_table, by=by, limit=limit, since=since
        )

    def close(self) -> None:
        """Close the database connections (a new use opens them again)."""
        for name in ("announcements", "token_streams", "budgets"):
            part = self._parts.get(name)
            if part is not None:
                part.close()
        database = self._parts.get("database")
        if database is not None:
            database.close()


_live: weakref.WeakSet[Runtime] = weakref.WeakSet()


def _reset_after_fork() -> None:
    for runtime in list(_live):
        runtime._after_fork_in_child()


os.register_at_fork(after_in_child=_reset_after_fork)


_runtimes: dict[Settings, Runtime] = {}
_runtimes_lock = threading.Lock()


def runtime_for(settings: Settings | None = None) -> Runtime:
    """The process's runtime for these settings (read from the environment when None).

    Equal settings give the same runtime, so ``start_turn()`` and ``run_turn.delay()`` of
    ``celery -A durable_agent.tasks`` share one Celery app.
    """
    if settings is None:
        settings = load_settings()
    with _runtimes_lock:
        runtime = _runtimes.get(settings)
        if runtime is None:
            runtime = _runtimes[settings] = Runtime(settings)
        return runtime


def close_runtimes() -> None:
    """Close and forget every runtime ``runtime_for`` made (at shutdown, or after a test)."""
    with _runtimes_lock:
        runtimes = list(_runtimes.values())
        _runtimes.clear()
    for runtime in runtimes:
        runtime.close()


def _reset_registry_after_fork() -> None:
    global _runtimes_lock
    _runtimes_lock = threading.Lock()


os.register_at_fork(after_in_child=_reset_registry_after_fork)
