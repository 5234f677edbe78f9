"""Uncertain-effects callbacks that misbehave, for the paging tests (importable by name as
``pagers:fail_once`` and ``pagers:hang`` from this folder)."""

from __future__ import annotations

import threading

from durable_agent.operate.uncertain import UncertainEffect

calls: list[str] = []  # "<turn>:<step>" of every call, in order
release = threading.Event()  # hang() returns once this is set


def fail_once(effect: UncertainEffect) -> None:
    """Raises at its first call in this process, then records each effect."""
    calls.append(f"{effect.turn_id}:{effect.step}")
    if len(calls) == 1:
        raise RuntimeError("the pager is down")


def hang(effect: UncertainEffect) -> None:
    """Never returns (until the test sets ``release``)."""
    calls.append(f"{effect.turn_id}:{effect.step}")
    release.wait()
