"""Helpers of the integration tests: crashes acted out in-process, and the command line."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import NoReturn

from durable_agent.settings import Settings
from durable_agent.step.faults import CrashPoint, Faults
from durable_agent.testing.harness import settings_env


class SimulatedCrash(BaseException):
    """Stands in for os._exit: nothing in the worker catches it, nothing is cleaned up."""


def _simulate(what: str) -> NoReturn:
    raise SimulatedCrash(what)


class CrashAt(Faults):
    """Faults that raise SimulatedCrash at the armed point instead of ending the process."""

    def __init__(self, armed: tuple[int | str, CrashPoint] | None = None) -> None:
        super().__init__(armed, exit=_simulate)


def run_cli(
    settings: Settings, *args: str, timeout: float = 60, **env: str
) -> subprocess.CompletedProcess[str]:
    """Run `python -m durable_agent ARGS` with the environment that reproduces `settings`."""
    return subprocess.run(
        [sys.executable, "-m", "durable_agent", *args],
        env={**os.environ, **settings_env(settings), **env},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
