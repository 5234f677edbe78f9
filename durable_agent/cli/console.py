"""Terminal output: rich consoles that stay readable when piped to a file."""

from __future__ import annotations

import os
import sys

from rich.console import Console

PIPED_WIDTH = 10_000
"""The width of piped output when ``COLUMNS`` is not set: wide enough that no table is cut
(a table is as wide as its widest row needs, no wider)."""


def console_width(stream_is_terminal: bool, environ: dict[str, str] | None = None) -> int | None:
    """``COLUMNS`` when it is set (a terminal or not); rich's own measure on a terminal;
    otherwise no practical limit, so that piped tables keep every column whole."""
    columns = (os.environ if environ is None else environ).get("COLUMNS", "").strip()
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    return None if stream_is_terminal else PIPED_WIDTH


def make_console(*, stderr: bool = False) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    # soft_wrap keeps a printed message on one line however long it is.
    return Console(
        stderr=stderr,
        highlight=False,
        soft_wrap=True,
        width=console_width(stream.isatty()),
    )


out = make_console()
err = make_console(stderr=True)
