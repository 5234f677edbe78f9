"""``durable-agent eval ...``: the evals of the pattern, with tables, progress and JSON."""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ..console import err, out
from ..settings import Settings
from .crash_matrix import MatrixReport, run_crash_matrix
from .stack import EvalStack


def _parse_labels(items: list[str]) -> dict[str, str]:
    labels = {}
    for item in items:
        name, sep, label = item.partition("=")
        if not sep or label not in ("safe", "never"):
            raise argparse.ArgumentTypeError(f"--relabel wants TOOL=safe|never, got {item!r}")
        labels[name] = label
    return labels


def _write_json(path: str | None, data: Any) -> None:
    if path:
        Path(path).write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
        err.print(f"wrote {path}")


def _progress() -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        console=err,
        transient=True,
    )


def cmd_crash_matrix(settings: Settings, args: argparse.Namespace) -> int:
    labels = _parse_labels(args.relabel)
    extra: dict[str, Any] = {"tool_labels": ",".join(f"{k}={v}" for k, v in labels.items())}
    with tempfile.TemporaryDirectory(prefix="durable-agent-eval-") as work:
        stack = EvalStack(
            settings,
            work_dir=Path(work),
            policy="email",
            tools="workers.email_tools",
            lease_seconds=args.lease_seconds,
            sweep_interval_seconds=args.sweep_interval,
            data_dir=Path(args.data_dir) if args.data_dir else None,
            extra=extra,
        )
        with stack, _progress() as bar:
            task = bar.add_task("crash matrix", total=None)

            def progress(text: str, done: int, total: int) -> None:
                bar.update(task, description=f"crash matrix: {text}", completed=done, total=total)

            report = run_crash_matrix(stack, relabel=labels, progress=progress)
    out.print(matrix_table(report))
    _write_json(args.json, report.to_json())
    if report.passed:
        out.print(
            f"[green]passed[/]: {len(report.points)} crash points, zero repeated model calls for "
            "finished steps, exactly one email each, the same reply"
        )
        return 0
    out.print(f"[red]failed[/] at {len(report.failures)} of {len(report.points)} crash points:")
    for point in report.failures:
        out.print(f"  step {point.step} {point.point} ({point.call}): {_why(point)}")
    return 1


def _why(point: Any) -> str:
    reasons = []
    if not point.crashed:
        reasons.append("the worker did not crash there")
    if point.status != "done":
        reasons.append(f"turn {point.status}")
    if point.repeated_finished:
        reasons.append(f"{point.repeated_finished} finished model call(s) repeated")
    if point.emails != 1:
        reasons.append(f"{point.emails} emails")
    if not point.same_reply:
        reasons.append("a different reply")
    return ", ".join(reasons)


def matrix_table(report: MatrixReport) -> Table:
    title = "crash matrix" + (
        f" (relabelled: {', '.join(f'{k}={v}' for k, v in report.relabel.items())})"
        if report.relabel
        else ""
    )
    table = Table(title=title, title_justify="left")
    for column in (
        "step",
        "call",
        "crash",
        "model calls repeated",
        "emails",
        "same reply",
        "recovery s",
        "result",
    ):
        table.add_column(column)
    for p in report.points:
        repeated = str(p.repeated_finished)
        if p.repeated_interrupted:
            repeated += " (+1 interrupted)"
        table.add_row(
            str(p.step),
            p.call,
            p.point,
            repeated,
            str(p.emails),
            "yes" if p.same_reply else "no",
            f"{p.recovery_seconds:.1f}" if p.recovery_seconds is not None else "-",
            "[green]ok[/]" if p.ok else "[red]FAIL[/]",
        )
    table.caption = (
        f"lease {report.lease_seconds:g}s, sweep every {report.sweep_interval_seconds:g}s; "
        "recovery = worker death to finished turn, including a fresh worker's start"
    )
    return table


def register(commands: Any, add: Any) -> None:
    """Add ``eval`` and its subcommands to the main parser."""
    evals = commands.add_parser("eval", help="the evals of the pattern (crash matrix, ...)")
    kinds = evals.add_subparsers(dest="eval", required=True, metavar="EVAL")

    matrix = kinds.add_parser(
        "crash-matrix",
        help="crash a real worker before and after every step; count repeats and emails",
    )
    matrix.set_defaults(func=cmd_crash_matrix)
    matrix.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    matrix.add_argument(
        "--relabel",
        action="append",
        default=[],
        metavar="TOOL=LABEL",
        help="run with a wrong label, e.g. send_email=safe, to see the duplicate it allows",
    )
    matrix.add_argument("--lease-seconds", type=float, default=2.0)
    matrix.add_argument("--sweep-interval", type=float, default=0.5)
    matrix.add_argument("--data-dir", help="where embedded servers keep data (if needed)")
