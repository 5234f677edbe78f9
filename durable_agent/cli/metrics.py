"""``durable-agent metrics``: serve the fleet's figures to Prometheus (the ``metrics``
extra; see ``telemetry/exporter.py``)."""

from __future__ import annotations

import argparse
import sys
import threading
from collections.abc import Callable

from ..errors import ConfigurationError
from ..runtime import MAX_LIST, Runtime

Command = Callable[[Runtime, argparse.Namespace], int]
Add = Callable[[str, Command, str], argparse.ArgumentParser]


def cmd_metrics(runtime: Runtime, args: argparse.Namespace) -> int:
    try:
        from ..telemetry.exporter import FleetCollector, dead_letter_counter, registry_of, serve
    except ImportError as error:
        raise ConfigurationError(
            f"metrics need the 'metrics' extra: pip install 'durable-agent[metrics]' ({error})"
        ) from error
    runtime.require_schema()
    collector = FleetCollector(
        runtime.journal,
        lambda: runtime.spend(by="agent", limit=MAX_LIST),
        dead_letter_counter(runtime.settings.broker_url),
    )
    server = serve(registry_of(collector), args.host, args.port)
    where = f"[{args.host}]" if ":" in args.host else args.host
    print(
        f"durable-agent metrics on http://{where}:{args.port}/metrics", file=sys.stderr, flush=True
    )
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()
    return 0


def register(add: Add, port: Callable[[str], int]) -> None:
    metrics = add(
        "metrics",
        cmd_metrics,
        "serve the fleet's figures from Postgres to Prometheus at /metrics (extra 'metrics')",
    )
    metrics.add_argument("--host", default="127.0.0.1", help="address to listen on")
    metrics.add_argument("--port", type=port, default=9808, help="port (default 9808)")
