"""The commands about turns: ``submit``, ``wait``, ``watch``, ``journal``, ``turns``,
``spend`` and ``replay`` (registered on the ``durable-agent`` parser by ``cli/__init__.py``).

Each checks its ids before it touches anything, prints a line (or a table, or ``--json``),
and exits with a code of :mod:`durable_agent.cli.exits`.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable

import redis

from ..errors import ServiceUnavailable
from ..inputs import check_id, check_message
from ..journal import WaitStore
from ..operate.live import TurnEvent
from ..operate.spend import GROUPINGS
from ..redact import printable
from ..runtime import Runtime
from .arguments import count, seconds, since_on_clock, since_time
from .exits import EXIT_FAILED, EXIT_TIMEOUT, EXIT_USAGE, error_line

Command = Callable[[Runtime, argparse.Namespace], int]
Add = Callable[[str, Command, str], argparse.ArgumentParser]


def cmd_submit(runtime: Runtime, args: argparse.Namespace) -> int:
    check_id("session_id", args.session)
    check_message(args.message, runtime.settings.max_message_bytes)
    if args.turn_id is not None:
        check_id("turn_id", args.turn_id)
    runtime.require_schema()
    print(runtime.start_turn(args.session, args.message, turn_id=args.turn_id, agent=args.agent))
    return 0


def cmd_wait(runtime: Runtime, args: argparse.Namespace) -> int:
    check_id("turn_id", args.turn_id)
    runtime.require_schema()
    try:
        turn = runtime.wait_for_turn(args.turn_id, args.timeout)
    except TimeoutError as error:
        error_line(f"error: {error}")
        return EXIT_TIMEOUT
    if turn.status == "done":
        print(printable(turn.reply or ""))
        return 0
    if turn.status == "cancelled":
        error_line(f"error: turn {turn.turn_id} was {turn.error}")
        return EXIT_FAILED
    error_line(f"error: turn {turn.turn_id} failed: {turn.error}")
    return EXIT_FAILED


def cmd_watch(runtime: Runtime, args: argparse.Namespace) -> int:
    """Print each finished step of the turn as it is recorded, then its end."""
    check_id("turn_id", args.turn_id)
    runtime.require_schema()
    events = runtime.stream_turn(
        args.turn_id,
        after_step=args.after_step,
        timeout=args.timeout,
        tokens=args.tokens,
        after=args.after,
    )
    in_text = False  # a line of tokens is open
    try:
        for event in events:
            if args.json:
                print(json.dumps(event.as_json(), ensure_ascii=False), flush=True)
            elif event.kind == "token":
                head = "" if in_text else f"step {event.step_number} (attempt {event.attempt})> "
                print(printable(head + event.text), end="", flush=True)
                in_text = True
                continue
            else:
                if in_text:
                    print(flush=True)
                    in_text = False
                _print_event(event)
            if event.turn is not None:
                return 0 if event.turn.status == "done" else EXIT_FAILED
    except TimeoutError as error:
        error_line(f"error: {error}")
        return EXIT_TIMEOUT
    return EXIT_FAILED  # the stream ends only with the turn's end


def _print_event(event: TurnEvent) -> None:
    if event.kind == "abandoned":
        print(f"step {event.step_number}: attempt {event.attempt} abandoned", flush=True)
    elif event.step is not None:
        s = event.step
        call = f"{s.kind} {s.name}" + (f" ({s.replay})" if s.kind == "tool" else "")
        where = f"step {s.step}"
        if event.parent_step is not None:  # a child turn's step, under its parent's
            where = f"  step {event.parent_step}.{s.step} (child {event.turn_id})"
        print(printable(f"{where}  {call}: {s.summary(100)}"), flush=True)
    elif event.turn is not None:
        turn = event.turn
        text = turn.reply if turn.status == "done" else turn.error
        print(printable(f"{turn.status}: {text or ''}"), flush=True)


def cmd_journal(runtime: Runtime, args: argparse.Namespace) -> int:
    check_id("turn_id", args.turn_id)
    runtime.require_schema()
    turn = runtime.get_turn(args.turn_id)  # an unknown id is an error, not an empty journal
    steps = runtime.journal.load_journal(args.turn_id)
    if args.json:
        print(json.dumps([s.as_json() for s in steps], indent=2, ensure_ascii=False))
    else:
        from .console import out
        from .tables import agent_line, journal_table

        out.print(journal_table(steps, title=f"journal of {args.turn_id}"))
        out.print(agent_line(turn), markup=False, highlight=False)
    return 0


def cmd_turns(runtime: Runtime, args: argparse.Namespace) -> int:
    if args.session is not None:
        check_id("session_id", args.session)
    runtime.require_schema()
    turns = runtime.list_turns(args.session, limit=args.limit)
    parked = [t.turn_id for t in turns if t.status == "waiting"]
    waits = WaitStore(runtime.database).waits(parked)  # what each parked turn waits for
    if args.json:
        rows = [
            {
                **t.as_json(),
                **({"waits_for": waits[t.turn_id].as_json()} if t.turn_id in waits else {}),
            }
            for t in turns
        ]
        print(json.dumps(rows, indent=2, ensure_ascii=False))
    else:
        from .console import out
        from .tables import turns_table

        out.print(turns_table(turns, {k: w.describe() for k, w in waits.items()}))
    return 0


def cmd_spend(runtime: Runtime, args: argparse.Namespace) -> int:
    since = since_time(args.since) if args.since is not None else None
    if args.turn is not None:
        return _spend_of_turn(runtime, args)
    runtime.require_schema()
    spends = runtime.spend(args.by, limit=args.limit, since=since_on_clock(since, runtime))
    if args.json:
        key = "turn_id" if args.by == "turn" else args.by
        rows = [{key: s.key, **s.as_json()} for s in spends]
        print(json.dumps(rows, indent=2, ensure_ascii=False))
    else:
        from .console import out
        from .tables import spend_table

        out.print(spend_table(spends, args.by, priced=bool(runtime.settings.prices)))
    return 0


def _spend_of_turn(runtime: Runtime, args: argparse.Namespace) -> int:
    """One turn and its child turns (child agents, at any depth), and their total."""
    from ..operate.spend import spend_with_children, total

    check_id("turn_id", args.turn)
    runtime.require_schema()
    runtime.get_turn(args.turn)  # TurnNotFound
    prices = runtime.settings.price_table
    spends = spend_with_children(runtime.journal, WaitStore(runtime.database), prices, args.turn)
    if args.json:
        rows = [{"turn": s.key.strip(), **s.as_json()} for s in spends]
        rows.append({"turn": "total", **total(spends).as_json()})
        print(json.dumps(rows, indent=2, ensure_ascii=False))
    else:
        from .console import out
        from .tables import spend_table

        out.print(spend_table(spends, "turn", priced=bool(runtime.settings.prices)))
    return 0


def cmd_limits(runtime: Runtime, args: argparse.Namespace) -> int:
    """Each model budget the fleet shares, as it is now."""
    budgets = runtime.budgets
    if budgets is None:
        why = (
            "no model budgets: set DURABLE_AGENT_MODEL_LIMITS (e.g. 'gpt-4o-mini=tpm:200000')"
            if not runtime.settings.limits
            else "no Redis for the budgets (DURABLE_AGENT_BUDGET_URL, or a redis:// broker)"
        )
        error_line(f"error: {why}")
        return EXIT_USAGE
    try:
        uses = budgets.use()
    except redis.RedisError as error:
        raise ServiceUnavailable(f"cannot read the budgets from Redis: {error}") from None
    if args.json:
        print(json.dumps([u.as_json() for u in uses], indent=2))
        return 0
    for u in uses:

        def free(value: float | None, per_minute: int | None) -> str:
            if per_minute is None or value is None:
                return "unlimited"
            size = max(1.0, per_minute * budgets.burst / 60)
            return f"{value:,.0f} of {size:,.0f} free ({per_minute:,}/min)"

        print(
            f"{u.name}: requests {free(u.requests_free, u.rpm)}, tokens "
            f"{free(u.tokens_free, u.tpm)}; in flight {u.in_flight}, reserved {u.reserved}, "
            f"waited {u.waits}, 429s {u.rate_limited}"
        )
    return 0


def cmd_replay(runtime: Runtime, args: argparse.Namespace) -> int:
    from ..operate.replay import replay_turn

    check_id("turn_id", args.turn_id)
    runtime.require_schema()
    report = replay_turn(
        runtime.journal, runtime.agents, args.turn_id, max_steps=runtime.settings.max_steps
    )
    print(
        json.dumps(report.to_json(), indent=2, ensure_ascii=False)
        if args.json
        else report.describe()
    )
    return 0 if report.ok else EXIT_FAILED


def register(add: Add) -> None:
    """Add the commands about turns to the ``durable-agent`` parser."""
    submit = add("submit", cmd_submit, "record a turn and enqueue it; prints the turn id")
    submit.add_argument("--session", required=True, help="the conversation this turn belongs to")
    submit.add_argument("--turn-id", default=None, help="your own id, to make retries idempotent")
    submit.add_argument("--agent", default=None, help="the agent to run it (default: 'default')")
    submit.add_argument("message", help="the user's message")

    wait = add(
        "wait",
        cmd_wait,
        "wait for a turn; print its reply (exit 0 done, 1 failed or cancelled, 3 timed out, "
        "4 no turn has that id)",
    )
    wait.add_argument("turn_id", help="the turn's id (submit prints it)")
    wait.add_argument("--timeout", type=seconds, default=60.0, help="seconds (default 60)")

    watch = add(
        "watch",
        cmd_watch,
        "print a turn's steps live as they are recorded, then its end (exit 0 done, 1 failed "
        "or cancelled, 3 timed out, 4 no turn has that id)",
    )
    watch.add_argument("turn_id", help="the turn's id (submit prints it)")
    watch.add_argument(
        "--after-step",
        type=int,
        default=-1,
        metavar="N",
        help="start after step N (the last one you saw); default: from the start",
    )
    watch.add_argument(
        "--timeout", type=seconds, default=None, help="give up after S seconds (default: never)"
    )
    watch.add_argument("--json", action="store_true", help="one JSON object per line")
    watch.add_argument(
        "--tokens",
        action="store_true",
        help="also print the model's answers as they are written (streamed answers)",
    )
    watch.add_argument(
        "--after",
        default=None,
        metavar="ID",
        help="with --tokens: go on after the event with this id (from --json)",
    )

    journal = add("journal", cmd_journal, "show a turn's journal")
    journal.add_argument("turn_id", help="the turn's id (submit prints it)")
    journal.add_argument("--json", action="store_true", help="a JSON array of steps")

    turns = add("turns", cmd_turns, "list turns, newest first (or one session in order)")
    turns.add_argument("--session", default=None, help="one session's turns, in order")
    turns.add_argument("--limit", type=count, default=50, help="at most this many (1-10000)")
    turns.add_argument("--json", action="store_true", help="a JSON array of turns")

    spend = add(
        "spend", cmd_spend, "model calls and tokens, what crashes wasted, what the journal saved"
    )
    spend.add_argument("--by", choices=GROUPINGS, default="turn", help="group per (default turn)")
    spend.add_argument("--limit", type=count, default=50, help="at most this many rows")
    spend.add_argument("--since", default=None, help="turns created since an age (7d) or time")
    spend.add_argument(
        "--turn", default=None, help="one turn with its child turns (child agents) and the total"
    )
    spend.add_argument("--json", action="store_true", help="a JSON array of rows")

    limits = add(
        "limits",
        cmd_limits,
        "each model budget the workers share (DURABLE_AGENT_MODEL_LIMITS): what is free, in "
        "flight, how often turns waited, the 429s that still came",
    )
    limits.add_argument("--json", action="store_true", help="a JSON array of budgets")

    replay = add("replay", cmd_replay, "replay a done turn with the model switched off")
    replay.add_argument("turn_id", help="the turn's id (submit prints it)")
    replay.add_argument("--json", action="store_true", help="print the report as JSON")
