"""Terminal output: rich consoles that stay readable when piped to a file."""

from __future__ import annotations

import sys

from rich.console import Console


def make_console(*, stderr: bool = False) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    # Piped output gets a wide fixed width instead of rich's 80 columns (for tables);
    # soft_wrap keeps a printed message on one line however long it is.
    width = None if stream.isatty() else 120
    return Console(stderr=stderr, highlight=False, soft_wrap=True, width=width)


out = make_console()
err = make_console(stderr=True)
