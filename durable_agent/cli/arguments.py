"""Argument types of the command line: a bad value is one `error:` line from argparse."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from ..errors import InvalidArgument

if TYPE_CHECKING:
    from ..runtime import Runtime


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


def since_time(text: str) -> datetime | timedelta:
    """``--since``: an age (``2h``: a timedelta, counted back from Postgres's clock by
    :func:`since_on_clock`) or an ISO time; bad input raises before anything is read."""
    from ..operate.retention import parse_age

    try:
        return timedelta(seconds=parse_age(text))
    except InvalidArgument:
        pass
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise InvalidArgument(
            f"--since takes an age (30m, 2h, 7d) or an ISO time, got {text!r}"
        ) from None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def since_on_clock(since: datetime | timedelta | None, runtime: Runtime) -> datetime | None:
    """The time ``--since`` names: an age is counted back from the database's clock (the
    one every recorded time was taken by), not this machine's."""
    if since is None or isinstance(since, datetime):
        return since
    return runtime.database_now() - since
