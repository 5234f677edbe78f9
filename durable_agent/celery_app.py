"""The Celery app of a runtime: its configuration, its tasks and its worker hooks.

Redis is only the doorbell: messages carry ids, Postgres holds the truth. Delivery is
at-least-once and duplicates are routine, so every delivery claims the turn first.

The worker hooks find their runtime through the app they are called for
(``app.durable_agent_runtime``): the start checks run in the worker's main process before it
consumes, and the sweeper thread runs there too, never in a pool child.
"""

from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING, Any

from celery import Celery, Task, signals

from .broker import transport_for
from .errors import (
    ConfigurationError,
    DurableAgentError,
    InvalidArgument,
    ServiceUnavailable,
    TurnNotFound,
)
from .inputs import check_id
from .journal.holders import worker_identity
from .settings import Settings

if TYPE_CHECKING:
    from .runtime import Runtime
    from .sweeper import SweeperThread

log = logging.getLogger("durable_agent.tasks")

TASK_NAME = "durable_agent.run_turn"
SWEEP_TASK_NAME = "durable_agent.sweep"


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
        "task_ignore_result": True,
        "result_backend": None,
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,
        # A broker blip must not cut a running turn (a turn inside send_email would become
        # "may or may not have happened"): Postgres holds the truth, and the late or lost
        # ack only brings a duplicate delivery, which the claim refuses.
        "worker_cancel_long_running_tasks_on_connection_loss": False,
        # Malformed messages are logged once and dead-lettered (see durable_agent.poison).
        "worker_consumer": "durable_agent.poison:GuardedConsumer",
        "worker_send_task_events": True,
        "task_send_sent_event": True,
        "worker_hijack_root_logger": False,
        "broker_channel_error_retry": True,
        "beat_schedule": {
            "durable-agent-sweep": {
                "task": SWEEP_TASK_NAME,
                "schedule": settings.sweep_interval_seconds,
            }
        },
    }


def create_app(runtime: Runtime) -> Celery:
    """A Celery app for this runtime's broker and queue, with the tasks registered."""
    app = Celery("durable_agent", set_as_current=False)
    app.conf.update(celery_config(runtime.settings))
    app.durable_agent_runtime = runtime

    def run_turn(self: Task, session_id: str, turn_id: str) -> str:
        """Claim the turn in Postgres and run it; step aside if someone else holds it."""
        return handle_delivery(runtime, turn_id)

    def sweep() -> int:
        """One sweep pass, for those who schedule it with ``celery beat`` instead."""
        return len(runtime.sweeper().sweep_once())

    def received(args: list[Any], kwargs: dict[str, Any], message_id: str) -> None:
        """In the worker's main process, as a run_turn message arrives: note who has it, so
        that the sweeper sends the turn again if this worker dies before it claims it."""
        try:
            runtime.journal.record_receipt(args[1], message_id, worker_identity())
        except ServiceUnavailable as error:
            runtime.outage.report(error)  # the claim will wait for Postgres anyway
        except DurableAgentError as error:
            log.warning("could not note the receipt of %s: %s", args[1], error)

    # shared=False: Celery would otherwise add these closures, bound to this runtime, to
    # every app created later in the process. Strategy: messages are checked before they
    # reach Celery's own strategy (see durable_agent.poison).
    guarded = {"shared": False, "Strategy": "durable_agent.poison:guarded_strategy"}
    app.task(
        name=TASK_NAME,
        bind=True,
        acks_late=True,
        ignore_result=True,
        check_arguments=staticmethod(_check_run_turn),
        on_receipt=staticmethod(received),
        **guarded,
    )(run_turn)
    app.task(
        name=SWEEP_TASK_NAME,
        ignore_result=True,
        check_arguments=staticmethod(_check_sweep),
        **guarded,
    )(sweep)
    return app


def _check_run_turn(args: list[Any], kwargs: dict[str, Any]) -> None:
    if kwargs or len(args) != 2:
        raise ValueError(
            f"run_turn takes (session_id, turn_id), got {len(args)} argument(s) and "
            f"keywords {sorted(kwargs)[:5]}"
        )
    for name, value in zip(("session_id", "turn_id"), args, strict=True):
        try:
            check_id(name, value)
        except InvalidArgument as error:
            raise ValueError(str(error)) from None


def _check_sweep(args: list[Any], kwargs: dict[str, Any]) -> None:
    if args or kwargs:
        raise ValueError("sweep takes no arguments")


def handle_delivery(runtime: Runtime, turn_id: str) -> str:
    """One delivery of ``run_turn``: what became of it, as the task's result.

    No delivery schedules a later one with a countdown: a turn that must be looked at again
    (a live claim of another worker, a deferral after a model outage) is re-sent by the
    sweeper from Postgres when it is due. Celery's countdown messages wait unacked in a
    worker's memory, and with kombu 5.7 on Redis such a worker dies when the broker
    connection drops.
    """
    from .worker import Delivery, Outcome

    worker = runtime.turn_worker()
    while True:
        try:
            delivery = worker.handle(turn_id)
        except TurnNotFound:
            log.error("delivery for unknown turn %s dropped", turn_id)
            return "unknown turn"
        except ServiceUnavailable as error:
            delivery = Delivery(turn_id, Outcome.INTERRUPTED, str(error))
        if delivery.outcome != Outcome.INTERRUPTED:
            runtime.outage.recovered()
            break
        # Postgres is unreachable: keep the message, wait for Postgres, then handle the turn
        # again here; the claim is this worker's own, so nothing counts as a crash.
        runtime.outage.wait()
    if delivery.follow_up is not None:
        try:
            runtime.enqueue(*delivery.follow_up)
        except DurableAgentError as error:
            log.warning("could not enqueue %s (the sweeper will): %s", delivery.follow_up, error)
    log.info("turn %s: %s %s", turn_id, delivery.outcome, delivery.detail[:200])
    return delivery.outcome


# -- worker hooks: module-level, so they stay connected; each finds its runtime -----------


def _runtime_of(sender: Any) -> Runtime | None:
    app = getattr(sender, "app", None)
    return getattr(app, "durable_agent_runtime", None)


def _check_before_start(sender: Any = None, **_: Any) -> None:
    """Fail at start, with one line, when the worker could not run a turn."""
    runtime = _runtime_of(sender)
    if runtime is None:
        return
    try:
        runtime.check_worker_start()
    except DurableAgentError as error:
        print(f"error: {error}", file=sys.stderr, flush=True)
        # 2: fix the configuration; 1: a service is down, a supervisor's restart may do
        raise SystemExit(2 if isinstance(error, ConfigurationError) else 1) from error


_sweepers: dict[int, SweeperThread] = {}


def _start_sweeper(sender: Any = None, **_: Any) -> None:
    """The sweeper runs in the worker's main process (never in a pool child)."""
    runtime = _runtime_of(sender)
    if runtime is None or not runtime.settings.run_sweeper or id(runtime) in _sweepers:
        return
    from .sweeper import SweeperThread

    thread = _sweepers[id(runtime)] = SweeperThread(runtime.sweeper())
    thread.start()


def _stop_sweeper(sender: Any = None, **_: Any) -> None:
    runtime = _runtime_of(sender)
    if runtime is not None and id(runtime) in _sweepers:
        _sweepers.pop(id(runtime)).stop()


signals.worker_init.connect(_check_before_start)
signals.worker_ready.connect(_start_sweeper)
signals.worker_shutdown.connect(_stop_sweeper)
