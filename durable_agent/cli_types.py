"""Argument types of the command line: a bad value is one `error:` line from argparse."""

from __future__ import annotations

import argparse
from collections.abc import Callable


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
