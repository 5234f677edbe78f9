"""The telemetry's pieces without services: nothing of it is imported unless configured,
the histogram from width_bucket rows, the trace headers of a stored context, the settings."""

from __future__ import annotations

import subprocess
import sys

import pytest

from durable_agent.delivery.doorbell import trace_headers
from durable_agent.errors import ConfigurationError
from durable_agent.settings import Settings, load_settings


def test_nothing_of_opentelemetry_or_prometheus_is_imported_when_they_are_off() -> None:
    """The worker's modules, a runtime's parts and a turn's trace context, with tracing and
    metrics off (the defaults): none of our telemetry modules, no tracer SDK or propagator,
    no prometheus_client is loaded. (redis-py 7 and later loads parts of opentelemetry's API
    and metrics SDK itself when they are installed; that is the broker client's, not ours.)"""
    code = (
        "import sys, durable_agent.tasks, durable_agent.delivery.turn_worker\n"
        "import durable_agent.delivery.sweeper, durable_agent.cli, durable_agent.step.runner\n"
        "from durable_agent.runtime import Runtime\n"
        "from durable_agent.settings import Settings\n"
        "runtime = Runtime(Settings())\n"
        "assert runtime.tracing is None and runtime.counters is None\n"
        "assert runtime.trace_context() is None\n"
        "runtime.sweeper()\n"
        "ours = ('durable_agent.telemetry.', 'opentelemetry.sdk.trace',\n"
        "        'opentelemetry.propagate',\n"
        "        'opentelemetry.exporter', 'prometheus_client')\n"
        "print(sorted(m for m in sys.modules if m.startswith(ours)))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_a_histogram_from_width_bucket_rows() -> None:
    pytest.importorskip("prometheus_client", reason="needs the 'metrics' extra")
    from durable_agent.telemetry.exporter import histogram

    bounds = [0.1, 1.0, 10.0]
    rows = {
        ("model",): [
            {"bucket": 0, "steps": 2, "seconds": 0.1},  # under 0.1
            {"bucket": 2, "steps": 3, "seconds": 6.0},  # 1.0 <= s < 10.0
            {"bucket": 3, "steps": 1, "seconds": 30.0},  # 10.0 and over
        ]
    }
    family = histogram("x_seconds", "test", ["kind"], bounds, rows, "steps")
    samples = {(s.name, s.labels.get("le")): s.value for s in family.samples}
    assert samples[("x_seconds_bucket", "0.1")] == 2
    assert samples[("x_seconds_bucket", "1.0")] == 2
    assert samples[("x_seconds_bucket", "10.0")] == 5
    assert samples[("x_seconds_bucket", "+Inf")] == 6
    assert samples[("x_seconds_count", None)] == 6
    assert samples[("x_seconds_sum", None)] == pytest.approx(36.1)


def test_trace_headers_of_a_stored_context() -> None:
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    stored = f'{{"traceparent": "{parent}", "tracestate": "a=1", "baggage": "x"}}'
    assert trace_headers(stored) == {"traceparent": parent, "tracestate": "a=1"}
    for nothing in (None, "", "not json", "[1, 2]", '{"baggage": "x"}'):
        assert trace_headers(nothing) is None


def test_the_metrics_port_is_a_port(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().metrics_port == 0 and Settings().tracing is False
    monkeypatch.setenv("DURABLE_AGENT_METRICS_PORT", "70000")
    with pytest.raises(ConfigurationError, match="DURABLE_AGENT_METRICS_PORT"):
        load_settings()
