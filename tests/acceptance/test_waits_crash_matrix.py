"""The crash matrix over the new step kinds: a worker killed before and right after every
sleep, event wait and child start of the ``courier`` agent (``waiting_agents_scenario.py``), through
the pytest plugin's ``crash_matrix`` fixture."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest


@pytest.mark.long
@pytest.mark.timeout(300)
def test_every_wait_step_survives_a_crash_before_and_after_it(
    crash_matrix: Callable[..., Any],
) -> None:
    report = crash_matrix(
        "durable_agent_examples.waiting_agents_scenario:scenario",
        pool="prefork",
        only=[
            (name, point)
            for name in ("agent:research", "sleep", "event:go")
            for point in ("before_run", "after_run")
        ],
    )
    assert report.agent == "courier"
    assert report.clean_steps == [
        "wait agent:research",
        "wait sleep",
        "tool ring (safe)",
        "wait event:go",
        "tool send_email (never)",
    ]
    assert [(p.call, p.point) for p in report.points] == [
        (f"wait {name}", point)
        for name in ("agent:research", "sleep", "event:go")
        for point in ("before_run", "after_run")
    ]
    for point in report.points:
        assert point.crashed and point.status == "done", point
        assert point.effects == {"send_email": 1} and point.same_reply, point
        assert point.repeated_finished == 0, point
