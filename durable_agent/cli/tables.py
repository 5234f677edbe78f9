"""Terminal tables of turns and journals (rich), for the command line and the evals."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from rich.table import Table
from rich.text import Text

from ..journal import Spend, Step, Tokens, Turn
from ..operate.spend import total
from ..redact import printable


def journal_table(steps: Sequence[Step], title: str = "journal") -> Table:
    table = Table(title=title, title_justify="left")
    for column in ("step", "kind", "name", "replay", "status", "epoch", "outcome"):
        table.add_column(column, overflow="fold")
    shortened = False
    for s in steps:
        summary = s.summary()
        shortened = shortened or summary != s.summary(WHOLE)
        cells = (str(s.step), s.kind, s.name, s.replay or "-", s.status, str(s.epoch), summary)
        table.add_row(*(Text(printable(cell)) for cell in cells))  # never rich markup
    if shortened:
        table.caption = "outcomes are one-line summaries: --json prints every step whole"
    return table


WHOLE = 10**9
"""A width no summary reaches: the text as it is."""


def turns_table(turns: Sequence[Turn], waits: Mapping[str, str] | None = None) -> Table:
    """The turns; ``waits``: what each parked turn waits for, by turn id."""
    table = Table(title="turns", title_justify="left")
    for column in (
        "turn",
        "session",
        "#",
        "agent",
        "status",
        "attempts",
        "crashes",
        "reply / error",
    ):
        table.add_column(column, overflow="fold")
    shortened = False
    for t in turns:
        text = t.reply if t.status == "done" else (t.error or "")
        if t.unreadable:  # what did not open, in place of it
            marks = " ".join(f"{u.field} {u.label}" for u in t.unreadable)
            text = f"{marks}; {text}" if text else marks
        if waits and t.turn_id in waits:
            text = f"waits for {waits[t.turn_id]}"
        if t.agent_changes:
            text = f"{text} [resumed under a changed agent: {t.agent_changes}]"
        text = " ".join((text or "").split())
        shortened = shortened or len(text) > (200 if t.agent_changes else 80)
        cells = (
            t.turn_id,
            t.session_id,
            str(t.seq),
            t.agent,
            str(t.status),
            str(t.attempts),
            str(t.crashes),
            text[:200] if t.agent_changes else text[:80],
        )
        table.add_row(*(Text(printable(cell)) for cell in cells))
    if shortened:
        table.caption = "replies and errors are cut at 80 characters: --json prints them whole"
    return table


def agent_line(turn: Turn) -> str:
    """The agent a turn belongs to, its digest, and what changed if it resumed under
    another version of it."""
    digest = f" (digest {turn.agent_digest[:12]})" if turn.agent_digest else " (not run yet)"
    line = printable(f"agent {turn.agent}{digest}")
    if turn.agent_changes:
        line += printable(f"; resumed under a changed agent: {turn.agent_changes}")
    return line


def spend_table(spends: Sequence[Spend], by: str, *, priced: bool) -> Table:
    """The spend ledger: billed calls and tokens; calls a crash made run again and their
    tokens (~: the lost completions are estimated); calls the journal read back instead."""
    table = Table(title=f"spend per {by}", title_justify="left")
    rows = list(spends)
    if len(rows) > 1:
        rows.append(total(rows))
    table.add_column(by, no_wrap=True, min_width=max([len(by), *(len(s.key) for s in rows)]))
    columns = ["calls", "prompt\ntokens", "compl.\ntokens"] + (["cost\n$"] if priced else [])
    columns += ["crash\ncalls", "crash\ntokens", "saved\ncalls", "saved\ntokens"]
    columns += ["saved\n$"] if priced else []
    for column in columns:
        table.add_column(column, justify="right")
    for s in rows:
        waste, saved = s.crash_waste, s.journal_saved
        cells = [s.key, str(s.billed.calls), str(s.billed.prompt_tokens)]
        cells.append(str(s.billed.completion_tokens))
        cells += [_cost(s.billed)] if priced else []
        cells += [str(waste.calls), _wasted_tokens(waste), str(saved.calls)]
        cells.append(str(saved.prompt_tokens + saved.completion_tokens))
        cells += [_cost(saved)] if priced else []
        table.add_row(*(Text(printable(cell)) for cell in cells))
    return table


def _cost(tokens: Tokens) -> str:
    return "?" if tokens.cost is None else f"{tokens.cost:.4f}"


def _wasted_tokens(waste: Tokens) -> str:
    """Prompt and completion tokens; "~" when the completions are estimated."""
    if not waste.calls:
        return "0"
    return f"~{waste.prompt_tokens + waste.completion_tokens}"
