"""``durable-agent eval ...``: the evals of the pattern, with tables, progress and JSON."""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ..cli.arguments import whole_number
from ..cli.console import err, out
from ..errors import DurableAgentError
from ..journal.db import describe_url
from ..settings import Settings
from ..usage import OneLineParser, seconds
from .crash_matrix import MatrixReport, run_scenario, why
from .stack import EvalStack


def _label(text: str) -> tuple[str, str]:
    """An argparse type: TOOL=safe or TOOL=never."""
    name, sep, label = text.partition("=")
    if not sep or not name or label not in ("safe", "never"):
        raise argparse.ArgumentTypeError(f"wants TOOL=safe or TOOL=never, got {text!r}")
    return name, label


def _point(text: str) -> tuple[int | str, str]:
    """An argparse type: STEP:POINT or TOOL:POINT, as CRASH_AT takes them."""
    from ..step.faults import parse

    try:
        parsed = parse(text)
    except DurableAgentError:
        parsed = None
    if parsed is None:
        raise argparse.ArgumentTypeError(
            f"wants STEP:before_run|after_run or TOOL:before_run|after_run, got {text!r}"
        )
    return parsed


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
        disable=not err.is_terminal,  # piped: no progress frames around the output
    )


def cmd_crash_matrix(settings: Settings, args: argparse.Namespace) -> int:
    from ..testing.scenario import load_scenario
    from .scenarios import BUILT_IN

    scenario = load_scenario(BUILT_IN.get(args.scenario, args.scenario))
    with tempfile.TemporaryDirectory(prefix="durable-agent-eval-") as work, _progress() as bar:
        task = bar.add_task("crash matrix", total=None)

        def progress(text: str, done: int, total: int) -> None:
            bar.update(task, description=f"crash matrix: {text}", completed=done, total=total)

        report = run_scenario(
            settings,
            scenario,
            work_dir=Path(work),
            relabel=dict(args.relabel),
            only=list(args.point) or None,
            lease_seconds=args.lease_seconds,
            sweep_interval_seconds=args.sweep_interval,
            pool=args.pool,
            data_dir=Path(args.data_dir) if args.data_dir else None,
            progress=progress,
        )
    out.print(matrix_table(report))
    out.print(report.ledger_line(), markup=False)
    _write_json(args.json, report.to_json())
    effects = ", ".join(f"{tool} {n}" for tool, n in report.clean_effects.items())
    if report.passed:
        out.print(
            f"[green]passed[/]: {len(report.points)} crash points, zero repeated model calls for "
            f"finished steps, the effects of a clean run ({effects}) each, the same reply"
        )
        return 0
    out.print(f"[red]failed[/] at {len(report.failures)} of {len(report.points)} crash points:")
    for point in report.failures:
        out.print(f"  step {point.step} {point.point} ({point.call}): {why(point)}", markup=False)
    return 1


def matrix_table(report: MatrixReport) -> Table:
    title = f"crash matrix: {report.scenario} (agent {report.agent})" + (
        f" (relabelled: {', '.join(f'{k}={v}' for k, v in report.relabel.items())})"
        if report.relabel
        else ""
    )
    table = Table(title=title, title_justify="left")
    for column in (
        "step",
        "call",
        "crash",
        "model calls\nrepeated",
        "wasted\ntokens",
        "effects",
        "same\nreply",
        "recovery\ns",
        "result",
    ):
        table.add_column(column, overflow="fold")  # nothing cut, even in narrow COLUMNS
    for p in report.points:
        repeated = str(p.repeated_finished) if report.scripted else "-"
        if p.repeated_interrupted:
            repeated += " (+1 interrupted)"
        table.add_row(
            str(p.step),
            escape(p.call),
            p.point,
            repeated,
            f"~{p.wasted_tokens}" if p.wasted_calls else "0",
            escape(", ".join(f"{tool} {n}" for tool, n in p.effects.items())),
            "yes" if p.same_reply else "no",
            f"{p.recovery_seconds:.1f}" if p.recovery_seconds is not None else "-",
            "[green]ok[/]" if p.ok else "[red]FAIL[/]",
        )
    table.caption = (
        f"lease {report.lease_seconds:g}s, sweep every {report.sweep_interval_seconds:g}s; "
        "recovery = worker death to finished turn, including a fresh worker's start; "
        "wasted tokens = the spend ledger's crash waste (~: completions estimated; a model "
        "step's intent with no request sent yet counts too)"
        + ("" if report.scripted else "; real model: repeats not counted, replies may differ")
    )
    return table


def cmd_replay(settings: Settings, args: argparse.Namespace) -> int:
    from ..operate.replay import replay_turn
    from ..runtime import Runtime

    runtime = Runtime(settings)
    runtime.require_schema()
    report = replay_turn(runtime, args.turn_id)
    print(
        json.dumps(report.to_json(), indent=2, ensure_ascii=False)
        if args.json
        else report.describe()
    )
    return 0 if report.ok else 1


def cmd_heed_note(settings: Settings, args: argparse.Namespace) -> int:
    from .heed_note import run_heed_note

    real = not args.scripted and bool(settings.openai_base_url or settings.openai_api_key)
    with tempfile.TemporaryDirectory(prefix="durable-agent-eval-") as work:
        stack = EvalStack(
            settings,
            work_dir=Path(work),
            policy=args.policy,
            tools="durable_agent_examples.payments_tools",
            real_model=real,
            data_dir=Path(args.data_dir) if args.data_dir else None,
            pool=args.pool,
        )
        with stack, _progress() as bar:
            task = bar.add_task("heed-note", total=args.runs)

            def progress(text: str, done: int, total: int) -> None:
                bar.update(task, description=f"heed-note: {text}", completed=done, total=total)

            report = run_heed_note(stack, args.runs, progress=progress)
    table = Table(title=f"heed-note: {report.model}", title_justify="left")
    for column in ("run", "after 'may or may not have happened'", "refunds", "result"):
        table.add_column(column)
    for run in report.runs:
        colour = {"pass": "green", "fail": "red"}.get(run.verdict, "yellow")
        table.add_row(
            str(run.run), run.next_action, str(run.refunds_executed), f"[{colour}]{run.verdict}[/]"
        )
    out.print(table)
    _write_json(args.json, report.to_json())
    passed = sum(r.verdict == "pass" for r in report.valid)
    out.print(
        f"pass rate {report.pass_rate:.0%} ({passed}/{len(report.valid)} valid runs, "
        f"{len(report.runs) - len(report.valid)} invalid)"
    )
    if report.scripted:
        out.print(
            f"[yellow]note[/]: this ran against the scripted model (policy {args.policy!r}); the "
            "rate shows the harness works, not how a real model behaves. Set OPENAI_BASE_URL "
            "and OPENAI_API_KEY to measure a real model."
        )
    else:
        out.print(f"measured against {settings.openai_base_url or 'the OpenAI API'}")
    return 0 if report.valid and report.pass_rate == 1.0 else 1


def cmd_two_workers(settings: Settings, args: argparse.Namespace) -> int:
    from .two_workers import run_two_workers

    with tempfile.TemporaryDirectory(prefix="durable-agent-eval-") as work:
        stack = EvalStack(
            settings,
            work_dir=Path(work),
            policy="refund",
            tools="durable_agent_examples.payments_tools",
            lease_seconds=args.lease_seconds,
            data_dir=Path(args.data_dir) if args.data_dir else None,
            pool=args.pool,
        )
        with stack:
            err.print("two workers: freezing worker A inside refund_order ...")
            report = run_two_workers(stack)
    if args.json:
        _write_json(args.json, report.to_json())
    out.print(f"turn {report.turn_id}: {report.status}, reply {report.reply!r}", markup=False)
    out.print("[bold]worker A[/] (frozen):")
    for line in report.worker_a:
        out.print(f"  - {line}", markup=False)
    out.print("[bold]worker B[/] (took over):")
    for line in report.worker_b:
        out.print(f"  - {line}", markup=False)
    out.print(
        f"payments service: {report.refunds_executed} refund executed for "
        f"{report.refund_requests} refund requests"
    )
    out.print("[green]passed[/]" if report.ok else "[red]failed[/]")
    return 0 if report.ok else 1


def cmd_demo(settings: Settings, args: argparse.Namespace) -> int:
    from ..cli.tables import journal_table
    from .demo import run_demo

    real = bool(settings.openai_base_url or settings.openai_api_key) and not args.scripted
    data_dir = Path(args.data_dir) if args.data_dir else None
    with tempfile.TemporaryDirectory(prefix="durable-agent-demo-") as work:
        stack = EvalStack(
            settings, work_dir=Path(work), real_model=real, lease_seconds=3.0, data_dir=data_dir
        )
        with stack:
            s = stack.settings
            out.print("[bold]durable-agent demo[/]")
            out.print(f"  Postgres: {describe_url(s.database_url)}")
            out.print(f"  Redis:    {s.broker_url}")
            for note in stack.notes:
                out.print(f"            ({note}; delete the folder to start afresh)")
            model = s.openai_base_url if real else f"scripted model at {s.openai_base_url}"
            out.print(f"  model:    {model or 'the OpenAI API'}")
            out.print(f"  inbox:    {stack.inbox.smtp_url} (SMTP test inbox)")
            result = run_demo(stack, lambda text: out.print(f"[cyan]>[/] {escape(text)}"))
    out.print(journal_table(result.journal_at_crash, title="journal when worker 1 died"))
    out.print(journal_table(result.journal, title="journal when the turn finished"))
    steps = ", ".join(str(step) for step in result.read_back) or "none"
    out.print(f"read back by worker 2 instead of run again: steps {steps}")
    if result.model_requests is not None:
        out.print(
            f"model requests served: {result.model_requests}, repeated: {result.repeated_requests}"
        )
    out.print(f"emails received: {len(result.emails)}")
    for recipients, subject in result.emails:
        out.print(f"  to {recipients}: {subject}", markup=False)
    out.print(f"turn {result.turn.turn_id}: {result.turn.status}")
    out.print(f"[bold]reply:[/] {escape(result.turn.reply or '')}")
    ok = result.turn.status == "done" and len(result.emails) == 1
    return 0 if ok else 1


def build_parser() -> argparse.ArgumentParser:
    """``durable-agent eval ...`` and ``durable-agent demo``."""
    parser = OneLineParser(prog="durable-agent")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    evals = commands.add_parser("eval", help="the evals of the pattern (crash matrix, ...)")
    kinds = evals.add_subparsers(dest="eval", required=True, metavar="EVAL")

    demo = commands.add_parser(
        "demo", help="run a turn, kill its worker mid-way, watch another worker finish it"
    )
    demo.set_defaults(func=cmd_demo)
    demo.add_argument("--data-dir", help="where embedded servers keep data (./.durable-agent)")
    demo.add_argument(
        "--scripted", action="store_true", help="use the scripted model even if OPENAI_* is set"
    )

    replay = kinds.add_parser("replay", help="replay a done turn with the model switched off")
    replay.set_defaults(func=cmd_replay)
    replay.add_argument("turn_id", help="the turn's id (submit prints it)")
    replay.add_argument("--json", action="store_true", help="print the report as JSON")
    matrix = kinds.add_parser(
        "crash-matrix",
        help="crash a real worker before and after every step; count repeats and emails",
    )
    matrix.add_argument(
        "--pool",
        choices=["solo", "prefork"],
        default="solo",
        help="the workers' Celery pool (prefork: a crash kills the pool child)",
    )
    matrix.set_defaults(func=cmd_crash_matrix)
    matrix.add_argument(
        "--scenario",
        default="email",
        metavar="MODULE:NAME",
        help="what to crash: 'email' (default), 'refund', or your own Scenario "
        "(e.g. myapp.scenarios:refund)",
    )
    matrix.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    matrix.add_argument(
        "--relabel",
        action="append",
        type=_label,
        default=[],
        metavar="TOOL=LABEL",
        help="run with a wrong label, e.g. send_email=safe, to see the duplicate it allows",
    )
    matrix.add_argument(
        "--point",
        action="append",
        type=_point,
        default=[],
        metavar="STEP:POINT",
        help="crash only there (repeatable), e.g. 3:after_run or send_email:after_run",
    )
    matrix.add_argument(
        "--lease-seconds",
        type=seconds(0.5, 3600),
        default=2.0,
        help="the workers' lease (default 2)",
    )
    matrix.add_argument(
        "--sweep-interval",
        type=seconds(0.01, 3600),
        default=0.5,
        help="seconds between sweeps (default 0.5)",
    )
    matrix.add_argument("--data-dir", help="where embedded servers keep data (if needed)")

    two = kinds.add_parser(
        "two-workers",
        help="freeze a worker inside a never tool; another takes over; count the refunds",
    )
    two.add_argument(
        "--pool",
        choices=["solo", "prefork"],
        default="solo",
        help="the workers' Celery pool (prefork: a crash kills the pool child)",
    )
    two.set_defaults(func=cmd_two_workers)
    two.add_argument(
        "--lease-seconds",
        type=seconds(0.5, 3600),
        default=5.0,
        help="the workers' lease (default 5)",
    )
    two.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    two.add_argument("--data-dir", help="where embedded servers keep data (if needed)")

    heed = kinds.add_parser(
        "heed-note",
        help="interrupt refund_order after it ran; does the model check before retrying?",
    )
    heed.add_argument(
        "--pool",
        choices=["solo", "prefork"],
        default="solo",
        help="the workers' Celery pool (prefork: a crash kills the pool child)",
    )
    heed.set_defaults(func=cmd_heed_note)
    heed.add_argument(
        "--runs", type=whole_number(1, 10_000), default=20, help="how many turns to interrupt"
    )
    heed.add_argument(
        "--policy",
        default="refund",
        choices=["refund", "careless-refund"],
        help="scripted model policy (when no real endpoint is used)",
    )
    heed.add_argument(
        "--scripted", action="store_true", help="use the scripted model even if OPENAI_* is set"
    )
    heed.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    heed.add_argument("--data-dir", help="where embedded servers keep data (if needed)")
    return parser


def main(settings: Settings, argv: list[str]) -> int:
    """Run ``eval ...`` or ``demo`` (``argv`` starts with the command's name)."""
    args = build_parser().parse_args(argv)
    code: int = args.func(settings, args)
    return code
