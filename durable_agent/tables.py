"""Terminal tables of turns and journals (rich), for the command line and the evals."""

from __future__ import annotations

from collections.abc import Sequence

from rich.table import Table
from rich.text import Text

from .journal import Step, Turn
from .redact import printable


def journal_table(steps: Sequence[Step], title: str = "journal") -> Table:
    table = Table(title=title, title_justify="left")
    for column in ("step", "kind", "name", "replay", "status", "epoch", "outcome"):
        table.add_column(column, overflow="fold")
    for s in steps:
        cells = (str(s.step), s.kind, s.name, s.replay or "-", s.status, str(s.epoch), s.summary())
        table.add_row(*(Text(printable(cell)) for cell in cells))  # never rich markup
    return table


def turns_table(turns: Sequence[Turn]) -> Table:
    table = Table(title="turns", title_justify="left")
    for column in ("turn", "session", "#", "status", "attempts", "crashes", "reply / error"):
        table.add_column(column, overflow="fold")
    for t in turns:
        text = t.reply if t.status == "done" else (t.error or "")
        text = " ".join((text or "").split())
        cells = (
            t.turn_id,
            t.session_id,
            str(t.seq),
            str(t.status),
            str(t.attempts),
            str(t.crashes),
            text[:80],
        )
        table.add_row(*(Text(printable(cell)) for cell in cells))
    return table
