"""The Redis transport of our workers: kombu's, with one defect of kombu 5.7 worked around.

When the broker connection drops while a worker holds an unacknowledged message and still
has a BRPOP outstanding (a prefork worker running fewer turns than its concurrency, or any
worker holding an ETA message), kombu 5.7 ends the worker with ``AttributeError:
'NoneType' object has no attribute 'hostname'``:

1. the consumer calls ``connection.collect()``; ``redis.Channel.close`` first reads the
   pending BRPOP reply, and on the dead socket that raises ``ConnectionError`` before the
   channel is marked closed (only ``Empty`` is caught there); the error is swallowed
   higher up, the transport is detached (``Transport.client = None``);
2. the consumer then closes the connection again: the channel, still open, restores its
   unacknowledged messages, which builds a new Redis client from ``Transport.client``:
   ``None.hostname``. That error is neither a connection nor a channel error, so it stops
   the worker (exit 1), and a restarted worker holding such messages dies the same way.

Here a failed read of the pending BRPOP reply ends the poll like an empty one, so the
first close completes while the transport is attached, and a restore asked for after the
transport was detached is skipped with a warning. Skipped messages stay in Redis' unacked
hash (kombu restores them after the visibility timeout) or were lost with Redis; either
way Postgres knows the turn, and the sweeper sends it again.

It also keeps a list item that is not a kombu message at all (not JSON, or JSON without a
message's fields: only something writing raw bytes into the queue's Redis list makes one)
from stopping the worker: it is logged, kept on ``<queue>.dead`` and skipped. Everything
above that level is checked by :mod:`durable_agent.delivery.poison`.
"""

from __future__ import annotations

import json
import logging
import time
from queue import Empty
from typing import Any

from kombu.transport import redis as kombu_redis

log = logging.getLogger(__name__)


class QoS(kombu_redis.QoS):
    def restore_unacked(self, client: Any = None) -> None:
        connection = getattr(self.channel, "connection", None)
        if client is None and getattr(connection, "client", None) is None:
            if self._delivered:
                log.warning(
                    "broker connection gone: %d unacknowledged message(s) left to Redis' "
                    "visibility timeout (Postgres knows their turns; the sweeper re-sends)",
                    len(self._delivered),
                )
            self._delivered.clear()
            return
        super().restore_unacked(client)  # type: ignore[no-untyped-call]


class Channel(kombu_redis.Channel):
    QoS = QoS

    def _brpop_read(self, **options: Any) -> Any:
        try:
            return super()._brpop_read(**options)  # type: ignore[no-untyped-call]
        except json.JSONDecodeError as error:
            # the list item is not JSON; kombu has moved the queue it came from to the end
            queue = self._queue_cycle.items[-1] if self._queue_cycle.items else "unknown"
            drop_envelope(self, queue, error.doc, f"not JSON ({error.msg})")
            return True
        except self.connection_errors:
            if not self._closing:
                raise
            # closing on a dead socket: the poll is over, nothing more will be read
            self._in_poll = False
            raise Empty() from None


class Transport(kombu_redis.Transport):
    Channel = Channel

    def _deliver(self, message: Any, queue: str) -> Any:
        if queue and queue in self._callbacks and self.channels:
            channel = self.channels[0]
            try:
                if not isinstance(message, dict):
                    raise TypeError(f"a {type(message).__name__}, not a message")
                channel.Message(message, channel=channel)  # what kombu builds next
            except Exception as error:
                drop_envelope(channel, queue, message, f"{type(error).__name__}: {error}")
                return None
        return super()._deliver(message, queue)  # type: ignore[no-untyped-call]


def drop_envelope(channel: Any, queue: str, raw: Any, reason: str) -> None:
    """Log a list item that is no message, once, and keep it on ``<queue>.dead``."""
    from .poison import DEAD_SUFFIX, shorten

    log.error("malformed envelope on %s dropped: %s | raw=%s", queue, reason, shorten(raw))
    record = {
        "x-death-reason": reason[:1000],
        "x-death-where": "transport",
        "x-death-at": time.time(),
        "raw": raw if isinstance(raw, str) else json.dumps(raw, default=repr),
    }
    with channel.conn_or_acquire() as client:
        client.lpush(queue + DEAD_SUFFIX, json.dumps(record))


TRANSPORT = f"{__name__}:Transport"


def transport_for(broker_url: str) -> str | None:
    """The transport class to configure for this broker URL (None: kombu's own)."""
    scheme = broker_url.partition("://")[0].lower()
    return TRANSPORT if scheme in ("redis", "rediss") else None
