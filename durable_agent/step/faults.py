"""Named crash points, inert until armed by ``CRASH_AT=<step|tool>:<before_run|after_run>``.

``before_run`` fires after the step's intent is committed and before the call runs;
``after_run`` fires after the call returned and before its outcome is recorded. The target
is a step number (``4:after_run``) or a tool name (``refund_order:after_run``: the first
call of that tool this process makes). ``CRASH_AT=delivery:before_claim`` fires when a
delivery arrives, after the worker noted its receipt and before it claims the turn.
``CRASH_AT=doorbell:after_commit`` fires in an application that started a turn in its own
transaction (``start_turn(connection=...)``), after that transaction committed and before the
turn's message is sent. The process ends with ``os._exit(1)``: no cleanup, no ack, exactly
like a killed worker.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Literal

from ..errors import ConfigurationError

CrashPoint = Literal["before_run", "after_run"]
POINTS: tuple[CrashPoint, ...] = ("before_run", "after_run")
DELIVERY = ("delivery", "before_claim")
DOORBELL = ("doorbell", "after_commit")
ENV = "CRASH_AT"

log = logging.getLogger(__name__)


def parse(spec: str | None) -> tuple[int | str, CrashPoint] | None:
    """``"4:after_run"`` -> ``(4, "after_run")``; ``"send_email:before_run"`` keeps the name."""
    if not spec:
        return None
    if tuple(spec.strip().split(":")) in (DELIVERY, DOORBELL):
        return tuple(spec.strip().split(":"))  # type: ignore[return-value]
    target, _, point = spec.strip().rpartition(":")
    if not target or point not in POINTS:
        raise ConfigurationError(
            f"{ENV}={spec!r}: expected <step|tool>:<before_run|after_run>, e.g. 4:after_run"
        )
    return (int(target) if target.isdigit() else target), point


class Faults:
    """The crash point of this process, if any; checking it costs one comparison."""

    def __init__(self, armed: tuple[int | str, CrashPoint] | None = None) -> None:
        self.armed = armed

    @classmethod
    def from_env(cls) -> Faults:
        return cls(parse(os.environ.get(ENV)))

    def maybe_crash(self, step: int, point: CrashPoint, name: str = "") -> None:
        if self.armed is not None and self.armed[1] == point and self.armed[0] in (step, name):
            _exit(f"{ENV}={self.armed[0]}:{self.armed[1]} reached at step {step}")

    def maybe_crash_before_claim(self) -> None:
        if self.armed == DELIVERY:
            _exit(f"{ENV}=delivery:before_claim reached")

    def maybe_crash_before_doorbell(self) -> None:
        if self.armed == DOORBELL:
            _exit(f"{ENV}=doorbell:after_commit reached")


def _exit(what: str) -> None:
    log.warning("%s: exiting now", what)
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)
