"""The operator's commands: ``cancel``, ``prune``, ``uncertain``, ``resolve``, ``approvals``,
``approve`` and ``deny`` (registered on the ``durable-agent`` parser by ``cli/__init__.py``).

Each prints a line (or a table, or ``--json``) and exits 0 when it did what was asked; 1
when the state says no (a turn already finished, nothing to cancel); 2 for bad input; 4
for an unknown turn id.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..inputs import check_id
from ..operate import approvals, retention, uncertain
from ..operate import cancel as control
from ..operate.cancel import check_by, check_note
from ..redact import printable
from .arguments import since_on_clock, since_time, whole_number

if TYPE_CHECKING:
    from ..runtime import Runtime

Command = Callable[["Runtime", argparse.Namespace], int]
Add = Callable[[str, Command, str], argparse.ArgumentParser]
EXIT_FAILED = 1


def _check_inputs(args: argparse.Namespace, *notes: str) -> None:
    """Every id and text argument, before anything touches the database."""
    for name in ("turn_id", "turn"):
        if getattr(args, name, None) is not None:
            check_id(name, getattr(args, name))
    if getattr(args, "by", None) is not None:
        check_by(args.by)
    for name in notes:
        check_note(name, getattr(args, name), required=name == "reason" and args.command == "deny")


def cmd_cancel(runtime: Runtime, args: argparse.Namespace) -> int:
    _check_inputs(args, "reason")
    runtime.require_schema()
    result = control.cancel(
        runtime.operator_store,
        runtime.enqueue,
        args.turn_id,
        args.reason,
        by=args.by,
        store_end=runtime.store_end,
    )
    if args.json:
        print(json.dumps(result.as_json(), indent=2, ensure_ascii=False))
    else:
        print(printable(result.describe()))
    stopping = result.cancellation is not None and not result.turn.finished
    return 0 if result.cancelled or stopping else EXIT_FAILED


def cmd_prune(runtime: Runtime, args: argparse.Namespace) -> int:
    seconds = retention.parse_age(args.older_than)
    runtime.require_schema()
    count = retention.prune(runtime.operator_store, seconds, dry_run=args.dry_run, batch=args.batch)
    if args.json:
        print(json.dumps(_prune_json(count, args.dry_run)))
        return 0
    verb = "would delete" if args.dry_run else "deleted"
    blobs = "" if args.dry_run else f", {count.blobs} unreferenced blob(s)"
    print(
        f"{verb} {count.turns} finished turn(s) older than {args.older_than} "
        f"({count.steps} journal row(s){blobs}); kept {count.kept} with unresolved "
        f"uncertain effects and {count.kept_open_session} of sessions with an open turn "
        "or children of an open turn"
    )
    return 0


def _prune_json(count: Any, dry_run: bool) -> dict[str, Any]:
    return {
        "dry_run": dry_run,
        "turns": count.turns,
        "steps": count.steps,
        "kept": count.kept,
        "kept_open_session": count.kept_open_session,
        "blobs": count.blobs,
    }


def cmd_uncertain(runtime: Runtime, args: argparse.Namespace) -> int:
    _check_inputs(args)
    since = since_time(args.since) if args.since is not None else None
    runtime.require_schema()
    effects = uncertain.list_uncertain(
        runtime.operator_store,
        runtime.journal,
        since=since_on_clock(since, runtime),
        include_resolved=args.all,
        turn_id=args.turn,
        agent=args.agent,
    )
    if args.json:
        print(json.dumps([e.as_json() for e in effects], indent=2, ensure_ascii=False))
        return 0
    from rich.table import Table
    from rich.text import Text

    from .console import out

    table = Table(title="uncertain effects", title_justify="left")
    for column in ("turn", "step", "tool", "arguments", "key", "when", "how", "next", "resolved"):
        table.add_column(column, overflow="fold")
    for e in effects:
        r = e.resolution
        cells = (
            e.turn_id,
            str(e.step),
            e.tool,
            json.dumps(e.arguments, ensure_ascii=False)[:80],
            e.idempotency_key or "-",
            e.at.strftime("%Y-%m-%d %H:%M:%S"),
            e.how,
            e.next,
            f"{r.verdict} by {r.resolved_by}" if r else "-",
        )
        table.add_row(*(Text(printable(cell)) for cell in cells))
    out.print(table)
    return 0


def cmd_resolve(runtime: Runtime, args: argparse.Namespace) -> int:
    _check_inputs(args, "note")
    runtime.require_schema()
    before = _resolution(runtime, args.turn_id, args.step) if args.replace else None
    effect = uncertain.resolve(
        runtime.operator_store,
        runtime.journal,
        args.turn_id,
        args.step,
        args.verdict,
        note=args.note,
        by=args.by,
        replace=args.replace,
    )
    r = effect.resolution
    assert r is not None
    replaced = (
        f"; replaces {before.verdict} by {before.resolved_by} at {before.resolved_at.isoformat()}"
        if before is not None
        else ""
    )
    print(
        printable(
            f"turn {effect.turn_id} step {effect.step} ({effect.tool}): {r.verdict}, "
            f"by {r.resolved_by} at {r.resolved_at.isoformat()}{replaced}"
        )
    )
    return 0


def _resolution(runtime: Runtime, turn_id: str, step: int) -> uncertain.Resolution | None:
    """The verdict the effect at (turn, step) has now, if any."""
    effects = uncertain.list_uncertain(
        runtime.operator_store, runtime.journal, turn_id=turn_id, include_resolved=True
    )
    return next((e.resolution for e in effects if e.step == step), None)


def cmd_approvals(runtime: Runtime, args: argparse.Namespace) -> int:
    _check_inputs(args)
    runtime.require_schema()
    found = approvals.list_approvals(
        runtime.operator_store, turn_id=args.turn, include_decided=args.all
    )
    if args.json:
        print(json.dumps([a.as_json() for a in found], indent=2, ensure_ascii=False))
        return 0
    from rich.table import Table
    from rich.text import Text

    from .console import out

    table = Table(title="approvals", title_justify="left")
    for column in ("turn", "step", "tool", "arguments", "asked", "decision"):
        table.add_column(column, overflow="fold")
    for a in found:
        decision = (
            f"{a.decision} by {a.decided_by}"
            if a.decision
            else ("waiting" if a.turn_status == "waiting" else f"none (turn {a.turn_status})")
        )
        cells = (
            a.turn_id,
            str(a.step),
            a.tool,
            json.dumps(a.arguments, ensure_ascii=False)[:80],
            a.requested_at.strftime("%Y-%m-%d %H:%M:%S"),
            decision,
        )
        table.add_row(*(Text(printable(cell)) for cell in cells))
    out.print(table)
    return 0


def cmd_decide(runtime: Runtime, args: argparse.Namespace) -> int:
    _check_inputs(args, "note", "reason")
    runtime.require_schema()
    parts = (runtime.operator_store, runtime.get_turn, runtime.enqueue)
    if args.decision == "approved":
        found = approvals.approve(*parts, args.turn_id, args.step, note=args.note, by=args.by)
    else:
        found = approvals.deny(*parts, args.turn_id, args.step, args.reason, by=args.by)
    print(
        printable(
            f"turn {found.turn_id} step {found.step} ({found.tool}) {args.decision}; "
            "the turn is sent to a worker"
        )
    )
    return 0


_step = whole_number(0, 1_000_000, "a step number")
_batch = whole_number(1, 10_000)


def register(add: Add) -> None:
    """Add the operator's commands to the ``durable-agent`` parser."""
    cancel = add("cancel", cmd_cancel, "stop a turn at its next step boundary; it ends cancelled")
    cancel.add_argument("turn_id", help="the turn's id (submit prints it)")
    cancel.add_argument("--reason", default=None, help="why (recorded with who and when)")
    cancel.add_argument("--by", default=None, help="who (default: user@host)")
    cancel.add_argument("--json", action="store_true", help="print the result as JSON")

    prune = add("prune", cmd_prune, "delete finished turns older than an age, with their journal")
    prune.add_argument("--older-than", required=True, help="an age: 30d, 12h, 90m, 2w")
    prune.add_argument("--dry-run", action="store_true", help="only count what would go")
    prune.add_argument("--batch", type=_batch, default=500, help="turns per transaction")
    prune.add_argument("--json", action="store_true", help="print the counts as JSON")

    inbox = add("uncertain", cmd_uncertain, "never calls whose outcome is unknown")
    inbox.add_argument("--since", default=None, help="an age (2h, 7d) or an ISO time")
    inbox.add_argument("--turn", default=None, help="one turn only")
    inbox.add_argument("--agent", default=None, help="the turns of one agent only")
    inbox.add_argument("--all", action="store_true", help="resolved ones too")
    inbox.add_argument("--json", action="store_true", help="a JSON array of effects")

    resolve = add("resolve", cmd_resolve, "record whether an uncertain effect happened")
    resolve.add_argument("turn_id", help="the turn's id (submit prints it)")
    resolve.add_argument("step", type=_step, help="the step of the uncertain call")
    verdict = resolve.add_mutually_exclusive_group(required=True)
    verdict.add_argument(
        "--happened",
        dest="verdict",
        action="store_const",
        const="happened",
        help="the effect took place",
    )
    verdict.add_argument(
        "--not-happened",
        dest="verdict",
        action="store_const",
        const="not_happened",
        help="the effect did not take place",
    )
    verdict.add_argument(
        "--ignore",
        dest="verdict",
        action="store_const",
        const="ignored",
        help="leave it: it does not matter",
    )
    resolve.add_argument("--note", default=None, help="what you found")
    resolve.add_argument("--by", default=None, help="who (default: user@host)")
    resolve.add_argument(
        "--replace", action="store_true", help="replace the verdict it has (kept on record)"
    )

    listing = add("approvals", cmd_approvals, "tool calls waiting for a decision")
    listing.add_argument("--turn", default=None, help="one turn only")
    listing.add_argument("--all", action="store_true", help="decided ones too")
    listing.add_argument("--json", action="store_true", help="a JSON array of calls")

    approve = add("approve", cmd_decide, "let a waiting tool call run; the turn resumes")
    approve.add_argument("turn_id", help="the turn's id (submit prints it)")
    approve.add_argument("step", type=_step, help="the step of the waiting call")
    approve.add_argument("--note", default=None, help="recorded with the decision")
    approve.add_argument("--by", default=None, help="who (default: user@host)")
    approve.set_defaults(decision="approved", reason=None)

    deny = add("deny", cmd_decide, "refuse a waiting tool call; the model reads the reason")
    deny.add_argument("turn_id", help="the turn's id (submit prints it)")
    deny.add_argument("step", type=_step, help="the step of the waiting call")
    deny.add_argument("--reason", required=True, help="what the model is told")
    deny.add_argument("--by", default=None, help="who (default: user@host)")
    deny.set_defaults(decision="denied", note=None)
