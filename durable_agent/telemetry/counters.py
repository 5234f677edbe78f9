"""The Prometheus counters of a worker's main process (``DURABLE_AGENT_METRICS_PORT``).

What happens only in a worker's main process is counted there: the sweeper's re-sends (its
thread runs in the main process) and the poison messages dead-lettered (Celery's consumer
runs there). Everything else about turns is in Postgres, where ``durable-agent metrics``
reads it for the whole fleet (``exporter.py``), so no pool child counts anything and
``prometheus_client``'s multiprocess mode is not needed with the prefork pool.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from prometheus_client import CollectorRegistry, Counter, start_http_server

log = logging.getLogger(__name__)


class WorkerCounters:
    """The counters, on a registry of their own, and the HTTP server that serves them."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.resends = Counter(
            "durable_agent_sweeper_resends",
            "Turns the sweeper sent again, by the reason it found in Postgres",
            ["reason"],
            registry=self.registry,
        )
        self.poison = Counter(
            "durable_agent_poison_messages",
            "Malformed messages dead-lettered to <queue>.dead, by queue and where they failed",
            ["queue", "where"],
            registry=self.registry,
        )
        self._server: Any = None
        self._lock = threading.Lock()

    def resent(self, reason: str) -> None:
        self.resends.labels(reason=reason).inc()

    def dead_lettered(self, queue: str, where: str) -> None:
        self.poison.labels(queue=queue, where=where).inc()

    def serve(self, host: str, port: int) -> None:
        """Serve ``/metrics`` on ``host:port`` from a thread (once per process)."""
        with self._lock:
            if self._server is None:
                self._server, _ = start_http_server(port, addr=host, registry=self.registry)
                log.info("serving the worker's metrics on http://%s:%d/metrics", host, port)

    def stop(self) -> None:
        with self._lock:
            if self._server is not None:
                self._server.shutdown()
                self._server.server_close()
                self._server = None
