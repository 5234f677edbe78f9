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
"""

from __future__ import annotations

import logging
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
        if not self._closing:
            return super()._brpop_read(**options)  # type: ignore[no-untyped-call]
        try:
            return super()._brpop_read(**options)  # type: ignore[no-untyped-call]
        except self.connection_errors:
            # closing on a dead socket: the poll is over, nothing more will be read
            self._in_poll = False
            raise Empty() from None


class Transport(kombu_redis.Transport):
    Channel = Channel


TRANSPORT = f"{__name__}:Transport"


def transport_for(broker_url: str) -> str | None:
    """The transport class to configure for this broker URL (None: kombu's own)."""
    scheme = broker_url.partition("://")[0].lower()
    return TRANSPORT if scheme in ("redis", "rediss") else None
