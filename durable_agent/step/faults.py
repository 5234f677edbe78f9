"""Named crash points, inert until armed by ``CRASH_AT=<step|tool>:<before_run|after_run>``.

``before_run`` fires after the step's intent is committed and before the call runs;
``after_run`` fires after the call returned and before its outcome is recorded. The target
is a step number (``4:after_run``) or a tool name (``refund_order:after_run``: the first
call of that tool this process makes). A wait step is named too: ``sleep``,
``event:NAME``, ``agent:NAME`` (or its waiting tool's name); ``before_run`` fires after its
intent is committed, before it parks or starts its child, ``after_run`` right after it
parked (and, resumed, before its outcome is recorded). ``CRASH_AT=delivery:before_claim``
fires when a delivery arrives, after the worker noted its receipt and before it claims the turn.
``CRASH_AT=doorbell:after_commit`` fires in an application that started a turn in its own
transaction (``start_turn(connection=...)``), after that transaction committed and before the
turn's message is sent. The process ends with ``os._exit(1)``: no cleanup, no ack, exactly
like a killed worker. Tests that act a crash out in their own process give :class:`Faults`
another ``exit`` (one that raises), so that a point firing by mistake cannot end the test
run.

A crash point fires once per worker: the processes of one worker (the main process and the
pool children it forks) share one token, taken by the first to reach the point. A prefork
child that fired is replaced by Celery, and the replacement is not armed again, so arming
one crash gives one crash. A worker restarted (a new process) is armed again. An ``exit``
double acts each crash out in the test's own process, so it fires every time.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Iterable
from typing import Literal, NoReturn

from ..errors import ConfigurationError

CrashPoint = Literal["before_run", "after_run"]
POINTS: tuple[CrashPoint, ...] = ("before_run", "after_run")
DELIVERY = ("delivery", "before_claim")
DOORBELL = ("doorbell", "after_commit")
ENV = "CRASH_AT"
FORMS = (
    "<step|tool>:<before_run|after_run> (e.g. 4:after_run, send_email:before_run) "
    "or delivery:before_claim (or doorbell:after_commit, in an application)"
)

log = logging.getLogger(__name__)

Exit = Callable[[str], NoReturn]
"""What a fired crash point calls, with what fired: ends the process (``os._exit(1)``)."""


class _Token:
    """One byte in a pipe made before any fork: the process that reads it fires; every
    process forked from the same worker then finds the pipe empty."""

    def __init__(self) -> None:
        self._read, write = os.pipe()
        os.write(write, b"x")
        os.close(write)
        os.set_blocking(self._read, False)

    def take(self) -> bool:
        try:
            return os.read(self._read, 1) == b"x"
        except BlockingIOError:
            return False


_token = _Token()  # made at import, in the worker's main process, before the pool forks


def parse(spec: str | None) -> tuple[int | str, CrashPoint] | None:
    """``"4:after_run"`` -> ``(4, "after_run")``; ``"send_email:before_run"`` keeps the name."""
    if not spec:
        return None
    if tuple(spec.strip().split(":")) in (DELIVERY, DOORBELL):
        return tuple(spec.strip().split(":"))  # type: ignore[return-value]
    target, _, point = spec.strip().rpartition(":")
    if not target or point not in POINTS:
        raise ConfigurationError(f"{ENV}={spec!r}: expected {FORMS}")
    return (int(target) if target.isdigit() else target), point


def check_tools(armed: tuple[int | str, CrashPoint] | None, tools: Iterable[str]) -> None:
    """A crash point armed for a tool this worker does not have would never fire: refuse."""
    if armed is None or armed in (DELIVERY, DOORBELL) or not isinstance(armed[0], str):
        return
    if armed[0] == "sleep" or armed[0].startswith(("agent:", "event:")):
        return  # a wait step of a loop (ctx.sleep, ctx.run_agent, ctx.wait_for_event)
    known = sorted(set(tools))
    if armed[0] not in known:
        raise ConfigurationError(
            f"{ENV}={armed[0]}:{armed[1]}: this worker has no tool {armed[0]!r} "
            f"(its tools: {', '.join(known) or 'none'}); expected {FORMS}"
        )


class Faults:
    """The crash point of this process, if any; checking it costs one comparison."""

    def __init__(
        self, armed: tuple[int | str, CrashPoint] | None = None, *, exit: Exit | None = None
    ) -> None:
        self.armed = armed
        self.exit: Exit = exit if exit is not None else _exit
        # a real crash fires once per worker (a token its forks share); a test's exit double
        # acts each crash out in its own process, every time
        self._once: Callable[[], bool] = _token.take if exit is None else (lambda: True)

    @classmethod
    def from_env(cls) -> Faults:
        return cls(parse(os.environ.get(ENV)))

    def maybe_crash(self, step: int, point: CrashPoint, name: str = "") -> None:
        armed = self.armed
        if armed is not None and armed[1] == point and armed[0] in (step, name) and self._take():
            self.exit(f"{ENV}={armed[0]}:{armed[1]} reached at step {step}")

    def maybe_crash_before_claim(self) -> None:
        if self.armed == DELIVERY and self._take():
            self.exit(f"{ENV}=delivery:before_claim reached")

    def maybe_crash_before_doorbell(self) -> None:
        if self.armed == DOORBELL:
            self.exit(f"{ENV}=doorbell:after_commit reached")

    def _take(self) -> bool:
        """True for the first process of this worker to reach the point; the others disarm."""
        if self._once():
            return True
        log.info("%s=%s:%s fired in this worker already: disarmed", ENV, *self.armed or ("", ""))
        self.armed = None
        return False


def _exit(what: str) -> NoReturn:
    log.warning("%s: exiting now", what)
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)
