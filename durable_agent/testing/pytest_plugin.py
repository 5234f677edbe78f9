"""The pytest plugin of durable-agent: the crash matrix and real workers in your own tests.

Installed with durable-agent (entry point ``pytest11``), so the fixtures are there in any
test suite of an environment that has durable-agent; ``-p no:durable_agent`` turns it off.

``durable_agent_settings``  the Settings the other fixtures use: from the environment
                            (``DURABLE_AGENT_DATABASE_URL`` ...); override it to point at
                            your test database
``scripted_model``          ``scripted_model(policy)``: a started ScriptedModelServer
``smtp_inbox``              a started SmtpInbox (``.smtp_url``, ``.api_url``, ``.count``)
``durable_workers``         ``durable_workers(count=1, pool="solo", settings=None, **env)``:
                            real ``durable-agent worker`` processes, ready, stopped after
``crash_matrix``            ``crash_matrix(scenario, **options)``: the whole crash matrix of
                            a :class:`~durable_agent.testing.Scenario`; fails the test with
                            the table unless every point meets the targets; returns the report
                            (``settings=`` another Settings, e.g. a real model endpoint)

Example::

    def test_refunds_survive_crashes(crash_matrix):
        report = crash_matrix("myapp.scenarios:refund")
        assert len(report.points) == 2 * len(report.clean_steps)
"""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from durable_agent.evals.crash_matrix import MatrixReport
    from durable_agent.settings import Settings
    from durable_agent.testing.harness import WorkerProcess
    from durable_agent.testing.inbox import SmtpInbox
    from durable_agent.testing.model_server import Policy, ScriptedModelServer
    from durable_agent.testing.scenario import Scenario


@pytest.fixture
def durable_agent_settings() -> Settings:
    """Settings from the environment; override this fixture to use a test database."""
    from durable_agent.settings import load_settings

    return load_settings()


@pytest.fixture
def scripted_model() -> Iterator[Callable[[Policy], ScriptedModelServer]]:
    """``scripted_model(policy)``: a ScriptedModelServer answering with ``policy``."""
    from durable_agent.testing.model_server import ScriptedModelServer

    with contextlib.ExitStack() as servers:

        def start(policy: Policy) -> ScriptedModelServer:
            return servers.enter_context(ScriptedModelServer(policy))

        yield start


@pytest.fixture
def smtp_inbox() -> Iterator[SmtpInbox]:
    """A started SMTP test inbox."""
    from durable_agent.testing.inbox import SmtpInbox

    with SmtpInbox() as inbox:
        yield inbox


@pytest.fixture
def durable_workers(
    durable_agent_settings: Settings, tmp_path: Path
) -> Iterator[Callable[..., list[WorkerProcess]]]:
    """``durable_workers(count=1, pool="solo", settings=None, **env)``: real worker
    processes for these settings (plus ``env``), ready to take turns."""
    from durable_agent.testing.harness import WorkerProcess, settings_env

    started: list[WorkerProcess] = []

    def start(
        count: int = 1, pool: str = "solo", settings: Settings | None = None, **env: str
    ) -> list[WorkerProcess]:
        # the workers import your modules as this process does (the current folder first)
        path = os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))
        environment = {
            "PYTHONPATH": path,
            **settings_env(settings or durable_agent_settings),
            **env,
        }
        batch = []
        for _ in range(count):
            name = f"worker{len(started) + 1}"
            worker = WorkerProcess(environment, tmp_path / f"{name}.log", name=name, pool=pool)
            started.append(worker)
            batch.append(worker.start())
        for worker in batch:
            worker.wait_ready(timeout=60)
        return batch

    try:
        yield start
    finally:
        for worker in started:
            worker.stop(timeout=5)


@pytest.fixture
def crash_matrix(durable_agent_settings: Settings, tmp_path: Path) -> Callable[..., MatrixReport]:
    """``crash_matrix(scenario, **options)``: run it; fail the test with the table unless
    it passed. ``scenario`` is a Scenario, a function returning one, or ``module:name``;
    options are those of :func:`durable_agent.evals.crash_matrix.run_scenario`
    (``only=[("send_email", "after_run")]``, ``relabel={...}``, ``pool="prefork"``...)."""

    def run(
        scenario: Scenario | Callable[[], Scenario] | str,
        settings: Settings | None = None,
        **options: Any,
    ) -> MatrixReport:
        from durable_agent.evals.crash_matrix import run_scenario, why
        from durable_agent.testing.scenario import load_scenario

        loaded = load_scenario(scenario)
        options.setdefault("work_dir", tmp_path)
        options.setdefault("services_from_settings", True)
        report = run_scenario(settings or durable_agent_settings, loaded, **options)
        if not report.passed:
            failures = "\n".join(
                f"  step {p.step} {p.point} ({p.call}): {why(p)}" for p in report.failures
            )
            pytest.fail(
                f"crash matrix of {loaded.name!r} failed at {len(report.failures)} of "
                f"{len(report.points)} crash points:\n{failures}\n{render(report)}",
                pytrace=False,
            )
        return report

    return run


def render(report: MatrixReport) -> str:
    """The crash-matrix table as plain text."""
    from rich.console import Console

    from durable_agent.evals.commands import matrix_table

    buffer = io.StringIO()
    Console(file=buffer, width=160, no_color=True).print(matrix_table(report))
    return buffer.getvalue()
