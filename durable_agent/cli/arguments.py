"""Argument types of the command line: a bad value is one `error:` line from argparse."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from ..errors import InvalidArgument


def whole_number(low: int, high: int, what: str = "a whole number") -> Callable[[str], int]:
    """A parser of whole numbers from ``low`` to ``high``; ``what`` names one in errors."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not {what}: {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be {low} to {high}, got {text!r}")
        return value

    return parse


def since_time(text: str) -> datetime:
    """``--since``: an age (``2h``: since two hours ago) or an ISO time."""
    from ..operate.retention import parse_age

    try:
        return datetime.now(UTC) - timedelta(seconds=parse_age(text))
    except InvalidArgument:
        pass
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise InvalidArgument(
            f"--since takes an age (30m, 2h, 7d) or an ISO time, got {text!r}"
        ) from None
    return when if when.tzinfo else when.replace(tzinfo=UTC)
