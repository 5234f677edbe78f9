"""Waiting out a Postgres outage, with one log line when it starts and one when it ends.

Postgres holds the truth, so a delivery that cannot reach it has nothing to do but wait:
it keeps its message (no redelivery loop, no traceback per attempt), waits until Postgres
answers again, and then handles the turn again in place. The claim it takes then is its
own (the same owner), so an outage is never counted as a worker's death toward
``DURABLE_AGENT_MAX_CRASHES``.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable

from ..errors import ServiceUnavailable

log = logging.getLogger("durable_agent.delivery.outage")


class Outage:
    """The Postgres reachability of one process, as its threads have found it."""

    def __init__(self, ping: Callable[[], object], *, max_interval: float = 0.5) -> None:
        self.ping = ping
        self.max_interval = max_interval
        self._lock = threading.Lock()
        self._since: float | None = None
        self._ended: float | None = None
        os.register_at_fork(after_in_child=self._after_fork)

    def _after_fork(self) -> None:
        self._lock = threading.Lock()

    @property
    def down(self) -> bool:
        return self._since is not None

    def ended_within(self, seconds: float) -> bool:
        """Did an outage end less than ``seconds`` ago (or is one going on)?"""
        if self._since is not None:
            return True
        return self._ended is not None and time.monotonic() - self._ended < seconds

    def report(self, error: BaseException | str) -> None:
        """A call failed because Postgres is unreachable: log it if this starts an outage."""
        with self._lock:
            if self._since is None:
                self._since = time.monotonic()
                log.warning("Postgres is unreachable (%s); turns wait until it is back", error)

    def recovered(self) -> None:
        """A call reached Postgres: log the end of the outage, if there was one."""
        with self._lock:
            if self._since is not None:
                self._ended = time.monotonic()
                log.warning(
                    "Postgres is reachable again after %.1fs; turns go on",
                    self._ended - self._since,
                )
                self._since = None

    def wait(self, stop: threading.Event | None = None) -> None:
        """Block until Postgres answers (at once if it does now), polling with backoff; an
        outage that starts here is logged, one that ends here too."""
        interval = 0.05
        while stop is None or not stop.is_set():
            try:
                self.ping()
            except ServiceUnavailable as error:
                self.report(error)
                time.sleep(interval)
                interval = min(self.max_interval, interval * 2)
                continue
            self.recovered()
            return
