"""Malformed messages on a turn queue: logged once, dead-lettered, and consumption goes on.

Celery 5.7 treats many malformed messages as unrecoverable: a body that is not ``[args,
kwargs, embed]``, a missing ``id`` header, a ``timelimit`` or ``stamped_headers`` header
of the wrong type, an ``embed`` that is not a dict... The worker logs "Unrecoverable
error" and exits; with ``acks_late`` the message goes back to the queue and kills the next
worker too, so one message stops the fleet. Some shapes make kombu's Redis transport
reconnect forever (it counts ``KeyError`` as a connection error); others run the task with
arguments it never declared.

Two layers, both in the worker's main process and before any task code runs:

* :func:`guarded_strategy`, the Celery ``Strategy`` of our tasks: checks the headers Celery
  reads and the decoded body against what the task takes, and raises ``InvalidTaskError``
  with a short reason; anything Celery's own strategy then raises for a message not yet
  acknowledged is turned into one too.
* :class:`GuardedConsumer` (``worker_consumer``): every bad-message path of the consumer
  (invalid, undecodable, unknown message, unknown task, or any non-broker error while a
  message is handed over) logs one line without a traceback, with fields truncated, puts
  the message unchanged on ``<queue>.dead`` and rejects it without requeueing.

A dead letter is the original message (body, headers, properties) plus ``x-death-*``
headers saying why, where and when; nothing consumes ``<queue>.dead``. If it cannot be
published (the broker is down) the error goes up as a broker error, and the message is
restored rather than lost.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from celery.exceptions import InvalidTaskError
from celery.utils.time import maybe_iso8601
from celery.worker.consumer import Consumer
from celery.worker.strategy import default as default_strategy
from kombu.entity import Queue
from kombu.exceptions import ContentDisallowed, DecodeError

log = logging.getLogger("durable_agent.delivery.poison")

SHOWN = 300  # characters of a field shown in the log line
DEAD_SUFFIX = ".dead"
ETA_HORIZON = timedelta(days=7)
_STRING_HEADERS = ("shadow", "root_id", "parent_id", "group", "argsrepr", "kwargsrepr", "origin")
_CANVAS = ("callbacks", "errbacks", "chain", "chord")

ArgumentCheck = Callable[[list[Any], dict[str, Any]], None]
"""A task's check of its arguments: raises ValueError saying what is wrong."""
Receipt = Callable[[list[Any], dict[str, Any], str], None]
"""A task's note that a well-formed message (args, kwargs, message id) was received."""


def shorten(value: Any, limit: int = SHOWN) -> str:
    text = value if isinstance(value, str) else repr(value)
    text = text.encode("unicode_escape", "backslashreplace").decode("ascii", "replace")
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} chars)"


# -- checking one message ---------------------------------------------------------------


def check_headers(headers: Any) -> None:
    if not isinstance(headers, Mapping):
        raise InvalidTaskError(f"headers are a {type(headers).__name__}, not a mapping")
    if not isinstance(headers.get("task"), str):
        raise InvalidTaskError("header 'task' is missing or not a string")
    task_id = headers.get("id")
    if not isinstance(task_id, str) or not 0 < len(task_id) <= 255:
        raise InvalidTaskError("header 'id' is missing or not a short string")
    for name in _STRING_HEADERS:
        if headers.get(name) is not None and not isinstance(headers[name], str):
            raise InvalidTaskError(f"header {name!r} is not a string")
    retries = headers.get("retries", 0)
    if retries is not None and (type(retries) is not int or retries < 0):
        raise InvalidTaskError("header 'retries' is not a count")
    limits = headers.get("timelimit")
    if limits is not None and (
        not isinstance(limits, list | tuple)
        or len(limits) != 2
        or any(x is not None and (type(x) not in (int, float) or x <= 0) for x in limits)
    ):
        raise InvalidTaskError("header 'timelimit' is not [hard, soft] seconds")
    stamped = headers.get("stamped_headers")
    if stamped is not None and not (
        isinstance(stamped, list) and all(isinstance(x, str) for x in stamped)
    ):
        raise InvalidTaskError("header 'stamped_headers' is not a list of names")
    if headers.get("stamps") is not None and not isinstance(headers["stamps"], dict):
        raise InvalidTaskError("header 'stamps' is not a mapping")
    for name in ("eta", "expires"):
        if headers.get(name) is None:
            continue
        try:
            when = maybe_iso8601(headers[name])
        except Exception as error:
            raise InvalidTaskError(f"header {name!r} is not a date: {error}") from None
        if not isinstance(when, datetime):
            raise InvalidTaskError(f"header {name!r} is not a date")
        if (
            name == "eta"
            and (when if when.tzinfo else when.replace(tzinfo=UTC))
            > datetime.now(UTC) + ETA_HORIZON
        ):
            raise InvalidTaskError("header 'eta' is more than 7 days ahead")


def check_body(body: Any, check_arguments: ArgumentCheck | None) -> None:
    if isinstance(body, dict):
        raise InvalidTaskError("the body is a mapping (protocol 1), not [args, kwargs, embed]")
    if not isinstance(body, list | tuple) or len(body) != 3:
        raise InvalidTaskError("the body is not [args, kwargs, embed]")
    args, kwargs, embed = body
    if not isinstance(args, list | tuple):
        raise InvalidTaskError("args is not a list")
    if not isinstance(kwargs, dict):
        raise InvalidTaskError("kwargs is not a mapping")
    if embed is not None and not isinstance(embed, dict):
        raise InvalidTaskError("embed is not a mapping")
    unexpected = sorted(set(embed or {}) - set(_CANVAS))
    if unexpected:  # embed is merged into the task's request: 'id', 'args'... would replace it
        raise InvalidTaskError(f"embed has keys Celery does not send: {unexpected[:5]}")
    if any((embed or {}).get(name) for name in _CANVAS):
        raise InvalidTaskError("callbacks, errbacks, chains and chords are not taken here")
    if check_arguments is not None:
        try:
            check_arguments(list(args), dict(kwargs))
        except ValueError as error:
            raise InvalidTaskError(str(error)) from None


def check_message(message: Any, check_arguments: ArgumentCheck | None) -> None:
    """Raise InvalidTaskError unless this is a well-formed message for the task."""
    check_headers(message.headers)
    try:
        body = message.decode()  # kept by kombu: Celery's strategy does not decode it again
    except (DecodeError, ContentDisallowed) as error:
        raise InvalidTaskError(f"the body cannot be decoded: {error}") from None
    except Exception as error:
        raise InvalidTaskError(f"the body cannot be decoded: {type(error).__name__}") from None
    check_body(body, check_arguments)


def _broker_errors(consumer: Any) -> tuple[type[BaseException], ...]:
    # kombu's Redis transport lists KeyError among its connection errors: a KeyError from a
    # bad message would make the consumer reconnect and restore the message, forever.
    errors = tuple(consumer.connection_errors) + tuple(consumer.channel_errors)
    return tuple(e for e in errors if not issubclass(e, LookupError))


def guarded_strategy(task: Any, app: Any, consumer: Any, **options: Any) -> Callable[..., Any]:
    """The Celery strategy of durable-agent's tasks: Celery's, after the message is checked."""
    handle = default_strategy(task, app, consumer, **options)
    check_arguments = getattr(task, "check_arguments", None)
    on_receipt: Receipt | None = getattr(task, "on_receipt", None)
    broker_errors = _broker_errors(consumer)

    def task_message_handler(message: Any, body: Any, *args: Any, **kwargs: Any) -> Any:
        check_message(message, check_arguments)
        if on_receipt is not None:
            task_args, task_kwargs, _ = message.decode()
            on_receipt(list(task_args), dict(task_kwargs), message.headers["id"])
        try:
            return handle(message, body, *args, **kwargs)
        except InvalidTaskError:
            raise
        except Exception as error:
            if isinstance(error, broker_errors) or message.acknowledged:
                raise
            raise InvalidTaskError(f"{type(error).__name__}: {error}") from None

    return task_message_handler


# -- the consumer ------------------------------------------------------------------------


class GuardedConsumer(Consumer):  # type: ignore[misc]
    """Celery's consumer, with every bad-message path logging once and dead-lettering."""

    def create_task_handler(self, *args: Any, **kwargs: Any) -> Callable[[Any], Any]:
        handle = super().create_task_handler(*args, **kwargs)
        broker_errors = _broker_errors(self)

        def on_task_received(message: Any) -> Any:
            quiet_acks(message)
            try:
                return handle(message)
            except Exception as error:
                if isinstance(error, broker_errors):
                    raise
                self.on_poison(message, f"{type(error).__name__}: {error}", "handing over")
                return None

        return on_task_received

    def on_invalid_task(self, body: Any, message: Any, exc: BaseException) -> None:
        self.on_poison(message, str(exc), "invalid")

    def on_decode_error(self, message: Any, exc: BaseException) -> None:
        self.on_poison(message, f"cannot decode: {exc}", "decode")

    def on_unknown_message(self, body: Any, message: Any) -> None:
        self.on_poison(message, "not a task message", "unknown message")

    def on_unknown_task(self, body: Any, message: Any, exc: BaseException) -> None:
        headers = getattr(message, "headers", None)
        name = headers.get("task") if isinstance(headers, Mapping) else None
        self.on_poison(message, f"this worker has no task named {shorten(name, 80)}", "unknown")

    def on_poison(self, message: Any, reason: str, where: str) -> None:
        headers = getattr(message, "headers", None)
        fields = headers if isinstance(headers, Mapping) else {}
        body = getattr(message, "body", None)
        queue = _queue_of(message)
        log.error(
            "malformed message on %s dropped (%s): %s | task=%s id=%s content-type=%s "
            "size=%s body=%s",
            queue,
            where,
            shorten(reason, 200),
            shorten(fields.get("task"), 80),
            shorten(fields.get("id"), 80),
            shorten(getattr(message, "content_type", None), 60),
            len(body) if isinstance(body, bytes | str) else "?",
            shorten(body),
        )
        if not hasattr(message, "reject_log_error") or message.acknowledged:
            return
        self._dead_letter(message, queue, reason, where)
        message.reject_log_error(log, self.connection_errors, requeue=False)
        runtime = getattr(self.app, "durable_agent_runtime", None)  # celery_app.create_app
        counters = getattr(runtime, "counters", None)
        if counters is not None:  # DURABLE_AGENT_METRICS_PORT
            counters.dead_lettered(queue, where)

    def _dead_letter(self, message: Any, queue: str, reason: str, where: str) -> None:
        headers = dict(message.headers) if isinstance(message.headers, Mapping) else {}
        headers.pop("compression", None)  # the body below is already decompressed
        headers.update(
            {
                "x-death-reason": reason[:1000],
                "x-death-where": where,
                "x-death-at": time.time(),
                "x-death-host": str(self.hostname),
                "x-death-headers": None if isinstance(message.headers, Mapping) else "invalid",
            }
        )
        dead = Queue(queue + DEAD_SUFFIX, routing_key=queue + DEAD_SUFFIX)  # type: ignore[no-untyped-call]
        body = message.body if isinstance(message.body, bytes | str) else repr(message.body)
        with self.app.producer_or_acquire() as producer:
            producer.publish(
                body,
                exchange="",
                routing_key=dead.routing_key,
                declare=[dead],
                headers=headers,
                content_type=message.content_type or "application/octet-stream",
                content_encoding=message.content_encoding or "binary",
                retry=False,
            )


def quiet_acks(message: Any) -> None:
    """Make the message's late ack (and reject) one warning line when the broker cannot be
    reached, instead of kombu's CRITICAL "Couldn't ack" with a traceback.

    A turn that ends while Redis is down acks into a dead connection: a solo worker runs the
    turn on the consumer's own thread, so nothing has noticed the loss yet, and a prefork
    worker can get a child's result before its consumer notices. Nothing is lost: the turn's
    end is in Postgres, and a copy of the message that comes back (restored from kombu's
    unacked hash, if Redis kept it) is refused by the claim."""
    if not hasattr(message, "ack") or not hasattr(message, "reject"):
        return

    def ack_log_error(logger: Any, errors: Any, multiple: bool = False) -> None:
        try:
            message.ack(multiple=multiple)
        except errors as error:
            _lost("acknowledge", message, error)

    def reject_log_error(logger: Any, errors: Any, requeue: bool = False) -> None:
        try:
            message.reject(requeue=requeue)
        except errors as error:
            _lost("reject", message, error)

    message.ack_log_error = ack_log_error
    message.reject_log_error = reject_log_error


def _lost(what: str, message: Any, error: BaseException) -> None:
    log.warning(
        "could not %s message %s (%s: %s): the broker connection is gone; the turn's state "
        "is in Postgres, and a copy that comes back is refused by its claim",
        what,
        shorten(getattr(message, "delivery_tag", None), 80),
        type(error).__name__,
        shorten(str(error), 200),
    )


def _queue_of(message: Any) -> str:
    info = getattr(message, "delivery_info", None) or {}
    return str(info.get("routing_key") or info.get("exchange") or "celery")
