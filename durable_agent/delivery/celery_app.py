"""The Celery app of a runtime: its configuration and its worker hooks (the tasks are in
:mod:`durable_agent.delivery.celery_tasks`).

Redis is only the doorbell: messages carry ids, Postgres holds the truth. Delivery is
at-least-once and duplicates are routine, so every delivery claims the turn first.

The worker hooks find their runtime through the app they are called for
(``app.durable_agent_runtime``): the start checks run in the worker's main process before it
consumes, and the sweeper thread runs there too, never in a pool child.
"""

from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING, Any, Protocol

from celery import Celery, signals
from kombu.utils.url import maybe_sanitize_url

from ..errors import ConfigurationError, DurableAgentError, ServiceUnavailable
from ..redact import escape_log_lines
from ..settings import Settings
from ..step.agents import AgentBook
from .broker import transport_for
from .celery_tasks import TaskParts, register_tasks
from .task_names import SWEEP

if TYPE_CHECKING:
    from ..journal import Database
    from ..telemetry.counters import WorkerCounters
    from .sweeper import SweeperThread
    from .waker import WakerThread

log = logging.getLogger("durable_agent.tasks")


def celery_config(settings: Settings) -> dict[str, Any]:
    return {
        "broker_url": settings.broker_url,
        "broker_transport": transport_for(settings.broker_url),
        "broker_connection_retry_on_startup": True,
        "broker_transport_options": {
            "visibility_timeout": settings.visibility_timeout_seconds,
        },
        "task_default_queue": settings.queue,
        "task_serializer": "json",
        "accept_content": ["json"],
        "result_serializer": "json",
        # No task stores its own return value: the delivery that ends a turn stores the end
        # under the turn id (durable_agent.delivery.results), when a backend is set.
        "task_ignore_result": True,
        "result_backend": settings.result_backend or None,
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,
        # A broker blip must not cut a running turn (a turn inside send_email would become
        # "may or may not have happened"): Postgres holds the truth, and the late or lost
        # ack only brings a duplicate delivery, which the claim refuses.
        "worker_cancel_long_running_tasks_on_connection_loss": False,
        # Malformed messages are logged once and dead-lettered (see durable_agent.delivery.poison).
        "worker_consumer": "durable_agent.delivery.poison:GuardedConsumer",
        "worker_send_task_events": True,
        "task_send_sent_event": True,
        "worker_hijack_root_logger": False,
        "broker_channel_error_retry": True,
        "beat_schedule": {
            "durable-agent-sweep": {
                "task": SWEEP,
                "schedule": settings.sweep_interval_seconds,
            }
        },
    }


class AppParts(TaskParts, Protocol):
    """What the app and its worker hooks use of their runtime: the tasks' parts, and the
    checks a worker passes before it consumes."""

    @property
    def agents(self) -> AgentBook: ...

    @property
    def queues(self) -> list[str]: ...

    @property
    def database(self) -> Database: ...

    def publish(
        self, session_id: str, turn_id: str, *, queue: str = "", message_id: str
    ) -> None: ...

    def check_worker_start(self) -> None: ...

    def start_tracing(self) -> None: ...

    def flush_traces(self) -> None: ...

    @property
    def counters(self) -> WorkerCounters | None: ...


def create_app(runtime: AppParts) -> Celery:
    """A Celery app for this runtime's broker and queue, with the tasks registered."""
    app = Celery("durable_agent", set_as_current=False)
    app.conf.update(celery_config(runtime.settings))
    app.durable_agent_runtime = runtime
    register_tasks(app, runtime)
    return app


# -- worker hooks: module-level, so they stay connected; each finds its runtime -----------


def _runtime_of(sender: Any) -> AppParts | None:
    app = getattr(sender, "app", None)
    return getattr(app, "durable_agent_runtime", None)


def _check_before_start(sender: Any = None, **_: Any) -> None:
    """Fail at start, with one line, when the worker could not run a turn."""
    runtime = _runtime_of(sender)
    if runtime is None:
        return
    try:
        runtime.check_worker_start()
        runtime.start_tracing()  # before the pool forks: each child inherits the exporter
        if runtime.settings.tracing:
            _traced.append(runtime)
        consumed = sorted(sender.app.amqp.queues.consume_from)
        check_consumed_queues(runtime, consumed)
        check_broker_reachable(sender.app, runtime.settings)
    except DurableAgentError as error:
        print(f"error: {error}", file=sys.stderr, flush=True)
        # 2: fix the configuration; 1: a service is down, a supervisor's restart may do
        raise SystemExit(2 if isinstance(error, ConfigurationError) else 1) from error


BROKER_CHECK_SECONDS = 5.0


def check_broker_reachable(app: Celery, settings: Settings) -> None:
    """ServiceUnavailable unless the broker answers now. Celery itself would retry for ever
    (``broker_connection_retry_on_startup``); a worker that cannot start exits 1 at once and
    leaves the retrying to its supervisor. Once started, a lost connection is retried."""
    try:
        with app.connection_for_write() as connection:
            connection.ensure_connection(
                max_retries=1, interval_start=0.2, interval_step=0.2, timeout=BROKER_CHECK_SECONDS
            )
    except Exception as error:  # kombu's OperationalError, redis-py's, OSError
        raise ServiceUnavailable(
            f"cannot reach the broker at {maybe_sanitize_url(settings.broker_url)}: {error}"
        ) from error


def check_consumed_queues(runtime: AppParts, consumed: list[str]) -> None:
    """The queues Celery consumes must belong to the agents this worker serves: a turn taken
    from any other queue would only be handed back to it, and taken again. Then one line
    per queue on stderr: what this worker really consumes, and for which agents."""
    agents = runtime.agents
    served = [a for a in agents if agents.serves(a.name)]
    foreign = [q for q in consumed if q not in runtime.queues]
    if foreign:
        theirs = sorted({a.name for a in agents if a.queue in foreign})
        raise ConfigurationError(
            f"this worker consumes queue(s) {', '.join(foreign)} but serves "
            f"{', '.join(repr(a.name) for a in served)} (queue(s) "
            f"{', '.join(runtime.queues)}); a turn from those queues would be handed back to "
            "them and taken again: "
            + (f"serve {', '.join(theirs)} (--agent) or " if theirs else "")
            + f"consume {', '.join(runtime.queues)} (-Q)"
        )
    for queue in consumed:
        for agent in served:
            if agent.queue == queue:
                labels = ", ".join(f"{t.name} ({t.replay})" for t in agent.tools) or "none"
                print(
                    f"durable-agent worker: consuming queue {queue!r} for agent "
                    f"{agent.name!r}, model {agent.model}, tools: {labels}",
                    file=sys.stderr,
                    flush=True,
                )


_sweepers: dict[int, SweeperThread] = {}
_wakers: dict[int, WakerThread] = {}


def _start_sweeper(sender: Any = None, **_: Any) -> None:
    """The sweeper and the waker run in the worker's main process (never in a pool child)."""
    runtime = _runtime_of(sender)
    if runtime is None:
        return
    if id(runtime) not in _wakers:
        _wakers[id(runtime)] = start_waker(runtime)
    if not runtime.settings.run_sweeper or id(runtime) in _sweepers:
        return
    from .sweeper import SweeperThread

    thread = _sweepers[id(runtime)] = SweeperThread(runtime.sweeper())
    thread.start()


def start_waker(runtime: AppParts) -> WakerThread:
    """A thread that sends each parked turn as it wakes (see ``waker.py``)."""
    from ..journal import WaitStore
    from .waker import WakerThread, send_woken

    waits = WaitStore(runtime.database)
    thread = WakerThread(
        runtime.database.conninfo,
        lambda turn_id: send_woken(waits, runtime.journal, runtime.publish, turn_id),
    )
    thread.start()
    return thread


def _serve_metrics(sender: Any = None, **_: Any) -> None:
    """The worker's counters (``DURABLE_AGENT_METRICS_PORT``) are served from its main
    process, where what they count happens (``telemetry/counters.py``)."""
    runtime = _runtime_of(sender)
    counters = runtime.counters if runtime is not None else None
    if runtime is not None and counters is not None:
        counters.serve(runtime.settings.metrics_host, runtime.settings.metrics_port)


def _flush_traces(sender: Any = None, **_: Any) -> None:
    """A worker process that stops exports the spans it still holds (tracing on)."""
    for runtime in _traced:
        runtime.flush_traces()


_traced: list[AppParts] = []  # the runtimes whose workers started in this process


def _stop_sweeper(sender: Any = None, **_: Any) -> None:
    runtime = _runtime_of(sender)
    if runtime is not None and id(runtime) in _sweepers:
        _sweepers.pop(id(runtime)).stop()
    if runtime is not None and id(runtime) in _wakers:
        _wakers.pop(id(runtime)).stop()


def _escape_log_lines(logger: logging.Logger | None = None, **_: Any) -> None:
    """Every line the worker logs is one line, credentials out (see OneLineLogFilter): a
    reply or a tool's output can neither forge a log line nor leak a configured secret."""
    if logger is not None:
        escape_log_lines(logger.handlers)


signals.after_setup_logger.connect(_escape_log_lines)
signals.after_setup_task_logger.connect(_escape_log_lines)
signals.worker_init.connect(_check_before_start)
signals.worker_ready.connect(_start_sweeper)
signals.worker_ready.connect(_serve_metrics)
signals.worker_shutdown.connect(_stop_sweeper)
signals.worker_shutdown.connect(_flush_traces)
signals.worker_process_shutdown.connect(_flush_traces)  # a prefork child
