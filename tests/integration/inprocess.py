"""Helpers of the integration tests: crashes acted out in-process, and the command line."""

from __future__ import annotations

import os
import subprocess
import sys

from durable_agent.settings import Settings
from durable_agent.step.faults import CrashPoint, Faults
from durable_agent.testing.harness import settings_env


class SimulatedCrash(BaseException):
    """Stands in for os._exit: nothing in the worker catches it, nothing is cleaned up."""


class CrashAt(Faults):
    """Faults that raise SimulatedCrash at the armed point instead of ending the process."""

    def maybe_crash(self, step: int, point: CrashPoint, name: str = "") -> None:
        if self.armed is not None and self.armed[1] == point and self.armed[0] in (step, name):
            raise SimulatedCrash(f"{step}:{point}")


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
