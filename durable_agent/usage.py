"""Command-line parsers whose mistakes are one line, as every other error of durable-agent.

argparse prints the whole usage and then the error; a user who typed ``--timeout nan`` gets
instead one ``error: ...`` line on stderr (the command, the argument, what is wrong, and
where ``--help`` is) and exit code 2. Every command line of the package (``durable-agent``,
its evals, ``python -m durable_agent.testing``, the examples) uses :class:`OneLineParser`;
subcommands inherit it.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from typing import NoReturn

from .redact import one_line

EXIT_USAGE = 2


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser that reports a usage mistake as one ``error:`` line, exit 2."""

    def error(self, message: str) -> NoReturn:
        text = one_line(" ".join(message.split()))
        print(f"error: {self.prog}: {text} (see {self.prog} --help)", file=sys.stderr, flush=True)
        raise SystemExit(EXIT_USAGE)


def seconds(low: float = 0.0, high: float = 86_400.0) -> Callable[[str], float]:
    """An argument type: a finite number of seconds from ``low`` to ``high``."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
        if not math.isfinite(value) or not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be {low:g} to {high:g} seconds, got {text!r}")
        return value

    return parse


def port(text: str) -> int:
    """An argument type: a TCP port, 0 for any free one."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be 0 to 65535, got {text!r}")
    return value
