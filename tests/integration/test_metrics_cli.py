"""``durable-agent metrics``: a bad port or an unmigrated database is one line and an exit
code, and Postgres unreachable during a scrape is ``durable_agent_up 0``, not an error page."""

from __future__ import annotations

import pytest
from inprocess import run_cli

from durable_agent.settings import Settings

pytest.importorskip("prometheus_client", reason="needs the 'metrics' extra")


def test_a_bad_port_is_a_usage_error(settings: Settings) -> None:
    result = run_cli(settings, "metrics", "--port", "70000", timeout=30)
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "error: durable-agent metrics: argument --port: must be 1 to 65535, got '70000' "
        "(see durable-agent metrics --help)"
    )
    assert "Traceback" not in result.stderr


def test_an_unmigrated_database_stops_it_with_one_line(
    settings: Settings, empty_database_url: str
) -> None:
    empty = settings.model_copy(update={"database_url": empty_database_url})
    result = run_cli(empty, "metrics", "--port", "1", timeout=30)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert "durable-agent migrate" in result.stderr.strip().splitlines()[-1]


def test_postgres_out_of_reach_during_a_scrape_is_up_0() -> None:
    from durable_agent.errors import ServiceUnavailable
    from durable_agent.telemetry.exporter import FleetCollector

    class Unreachable:
        def metric_turns(self) -> list[dict[str, object]]:
            raise ServiceUnavailable("cannot reach Postgres")

    collector = FleetCollector(Unreachable(), lambda: [], lambda queues: {})  # type: ignore[arg-type]
    families = {f.name: f for f in collector.collect()}
    assert set(families) == {"durable_agent_up"}
    assert families["durable_agent_up"].samples[0].value == 0
