"""How a command ends: its exit code, and the one line a user's mistake prints.

0 success; 1 the command failed (e.g. a failed turn, an unreachable service); 2 a usage or
configuration error; 3 ``wait`` or ``watch`` timed out; 4 no turn has that id; 130
interrupted. ``worker`` exits with the Celery worker's own code.
"""

from __future__ import annotations

import sys

from ..redact import printable

EXIT_FAILED, EXIT_USAGE, EXIT_TIMEOUT, EXIT_NOT_FOUND = 1, 2, 3, 4


def error_line(text: str) -> None:
    """One line on stderr, however long, with control characters escaped."""
    print(printable(" ".join(text.split())), file=sys.stderr, flush=True)
