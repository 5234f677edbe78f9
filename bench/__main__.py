"""``python -m bench [all|journal|throughput|resume|growth|recovery|door|console|sealing|``
``timeline|telemetry|fleet|streaming|budgets|fairness|waits|mcp]``
``[--quick] [--json PATH]``:
run the benchmarks, print tables (``--quick``: one round of each, smaller sizes, for CI).
DBOS side by side is not here: ``make bench-peers`` runs ``python -m bench.peers`` in a
virtual environment of its own, so that this one never carries DBOS."""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path
from typing import Any

from durable_agent.cli.console import out

from . import machine

BENCHMARKS = (
    "all", "journal", "throughput", "resume", "growth", "recovery", "door", "console",
    "telemetry", "sealing", "timeline", "fleet", "streaming", "budgets", "fairness", "waits",
    "mcp",
)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument(
        "which",
        nargs="?",
        choices=BENCHMARKS,
        default="all",
        help="the benchmark to run (default: all)",
    )
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write results as JSON")
    parser.add_argument(
        "--reps", type=int, default=7, help="alternating repetitions per journal measure"
    )
    parser.add_argument("--runs", type=int, default=5, help="kills in the recovery benchmark")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="one repetition of each measure, tables up to 100,000 rows (a smoke run for CI)",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.reps, args.runs = 1, 1
    if args.reps < 1 or args.runs < 1:
        parser.error("--reps and --runs must be at least 1")

    info = machine()
    out.print(info.line())
    # when and how the figures were made: the docs' benchmarks page states it with them
    results: dict[str, Any] = {
        "machine": info.as_json(),
        "run": {
            "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "which": args.which,
            "quick": args.quick,
            "reps": args.reps,
            "runs": args.runs,
        },
    }
    started = time.monotonic()
    if args.which in ("all", "journal"):
        from . import journal_io

        results["journal"] = journal_io.run(reps=args.reps)
    if args.which in ("all", "throughput"):
        from . import throughput

        if args.quick:
            results["throughput"] = throughput.run(rounds=1, turns=20, latency_samples=5)
        else:
            results["throughput"] = throughput.run(rounds=max(1, args.reps // 2))
    if args.which in ("all", "resume"):
        from . import resume

        results["resume"] = resume.run(reps=max(3, args.reps // 2) if not args.quick else 1)
    if args.which in ("all", "growth"):
        from . import growth

        sizes = (0, 100_000) if args.quick else growth.SIZES
        results["growth"] = growth.run(sizes=sizes, samples=1 if args.quick else growth.SAMPLES)
    if args.which in ("all", "recovery"):
        from . import recovery

        results["recovery"] = recovery.run(runs=args.runs)
    if args.which in ("all", "door"):
        from . import app_door

        results["door"] = app_door.run(reps=args.reps if not args.quick else 1)
    if args.which in ("all", "console"):
        from . import console_pages

        results["console"] = console_pages.run(samples=5 if args.quick else console_pages.SAMPLES)
    if args.which in ("all", "telemetry"):
        from . import telemetry

        if args.quick:
            results["telemetry"] = telemetry.run(reps=1, turns=5, big=0)
        else:
            results["telemetry"] = telemetry.run(reps=args.reps)
    if args.which in ("all", "sealing"):
        from . import sealing

        results["sealing"] = sealing.run(reps=args.reps)
    if args.which in ("all", "timeline"):
        from . import timeline

        results["timeline"] = timeline.run(turns=10 if args.quick else 40)
    if args.which in ("all", "fleet"):
        from . import fleet

        if args.quick:
            results["fleet"] = fleet.run(rounds=1, turns_per_slot=1, configs=[(2, 8)],
                                         group_commit=(False,))  # fmt: skip
        else:
            results["fleet"] = fleet.run(rounds=max(1, args.reps // 3))
    if args.which in ("all", "streaming"):
        from . import streaming

        results["streaming"] = streaming.run(
            turns=5 if args.quick else 20, latency_turns=1 if args.quick else 3
        )
    if args.which in ("all", "budgets"):
        from . import budgets

        results["budgets"] = budgets.run(turns=60 if args.quick else 300, baseline=not args.quick)
    if args.which in ("all", "fairness"):
        from . import fairness

        if args.quick:
            results["fairness"] = fairness.run(burst=30, few=3, baseline=False)
        else:
            results["fairness"] = fairness.run()
    if args.which in ("all", "waits"):
        from . import parked_turns

        if args.quick:
            results["waits"] = parked_turns.run(
                sleepers=100, sleep_seconds=5, quick_turns=50, samples=10
            )
        else:
            results["waits"] = parked_turns.run()
    if args.which in ("all", "mcp"):
        from . import mcp_calls

        if args.quick:
            results["mcp"] = mcp_calls.run(calls=50, reps=1)
        else:
            results["mcp"] = mcp_calls.run(reps=args.reps)
    out.print(f"[dim]finished in {time.monotonic() - started:.0f} s[/dim]")
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2, default=str) + "\n")
        out.print(f"results written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
