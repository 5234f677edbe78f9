"""The commands about waiting turns: ``send-event`` and ``events`` (registered on the
``durable-agent`` parser by ``cli/__init__.py``); ``turns`` shows what parked turns wait for.

``send-event TURN NAME [PAYLOAD]`` exits 0 when the event woke the turn, was kept for a later
wait, or was a duplicate of one sent before (same ``--event-id``); 1 when the turn has ended
(nothing is recorded); 2 for a payload that is not JSON or a bad name; 4 when no turn has
that id.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from ..delivery.waker import deliver_event
from ..errors import InvalidArgument, TurnEnded
from ..inputs import check_id
from ..journal import WaitStore
from ..operate.events import list_events
from ..redact import printable
from ..runtime import Runtime
from ..step.wait_steps import check_event_name
from .exits import EXIT_FAILED, error_line

Command = Callable[[Runtime, argparse.Namespace], int]
Add = Callable[[str, Command, str], argparse.ArgumentParser]


def _payload(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError as error:
        raise InvalidArgument(
            f"the payload is not JSON ({error}); quote a string: '\"text\"'"
        ) from None


def cmd_send_event(runtime: Runtime, args: argparse.Namespace) -> int:
    check_id("turn_id", args.turn_id)
    check_event_name(args.name)
    if args.event_id is not None:
        check_id("event_id", args.event_id)
    payload = _payload(args.payload)
    runtime.require_schema()
    try:
        sent = deliver_event(runtime, args.turn_id, args.name, payload, args.event_id)
    except TurnEnded as error:
        error_line(f"error: {error}")
        return EXIT_FAILED
    if args.json:
        print(json.dumps(sent.as_json(), ensure_ascii=False))
    else:
        print(printable(sent.describe()))
    return 0


def cmd_events(runtime: Runtime, args: argparse.Namespace) -> int:
    check_id("turn_id", args.turn_id)
    runtime.require_schema()
    events = list_events(WaitStore(runtime.database), runtime.get_turn, args.turn_id)
    if args.json:
        print(json.dumps([e.as_json() for e in events], indent=2, ensure_ascii=False))
        return 0
    if not events:
        print(f"no events were sent to turn {args.turn_id}")
    for e in events:
        payload = json.dumps(e.payload, ensure_ascii=False)
        line = f"{e.sent_at.isoformat(timespec='seconds')}  {e.name}  {e.event_id}  {e.state}"
        print(printable(f"{line}  {payload[:120]}"))
    return 0


def register(add: Add) -> None:
    """Add ``send-event`` and ``events`` to the ``durable-agent`` parser."""
    send = add(
        "send-event",
        cmd_send_event,
        "send an event to a turn (exit 0 woke it, kept or duplicate; 1 the turn has ended; "
        "4 no turn has that id)",
    )
    send.add_argument("turn_id", help="the turn's id")
    send.add_argument("name", help="the event's name (what ctx.wait_for_event waits for)")
    send.add_argument("payload", nargs="?", default=None, help="the payload as JSON")
    send.add_argument(
        "--event-id", default=None, help="your id for it: the same id again changes nothing"
    )
    send.add_argument("--json", action="store_true", help="print the outcome as JSON")

    events = add("events", cmd_events, "list the events sent to a turn and what became of each")
    events.add_argument("turn_id", help="the turn's id")
    events.add_argument("--json", action="store_true", help="a JSON array of events")
