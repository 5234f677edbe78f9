"""The live timeline: a turn's finished steps as server-sent events, from ``stream_turn``.

Each event is one step (its ``id`` the step number, its data the timeline row as HTML and
the turn's status) or the end; ``unreadable`` when a row of the turn does not open here
(the page shows it marked, and the browser stops asking). ``stream_turn`` is woken by
Postgres' LISTEN/NOTIFY; a connection is held at most :data:`HOLD_SECONDS`, then the
browser's EventSource comes back with ``Last-Event-ID`` and the stream goes on after that
step: nothing is skipped, nothing comes twice.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator

from starlette.concurrency import iterate_in_threadpool
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.templating import Jinja2Templates

from ..errors import InvalidArgument, KeyUnavailable, PayloadTampered
from ..inputs import check_id
from ..operate.live import TurnEvent
from ..redact import redact
from ..runtime import Runtime
from .timeline import step_row

HOLD_SECONDS = 25.0
RETRY_MS = 1000


def turn_events(request: Request) -> Response:
    runtime: Runtime = request.app.state.runtime
    turn_id = check_id("turn_id", request.path_params["turn_id"])
    after = _after(request)
    events = runtime.stream_turn(turn_id, after_step=after, timeout=HOLD_SECONDS)
    templates: Jinja2Templates = request.app.state.templates
    row = templates.env.get_template("_step.html")

    def lines() -> Iterator[str]:
        yield f"retry: {RETRY_MS}\n\n"
        try:
            for event in events:
                yield _encode(runtime, event, row)
        except TimeoutError:
            yield ": held long enough; come back with Last-Event-ID\n\n"
        except (KeyUnavailable, PayloadTampered) as error:  # the page shows it marked
            data = json.dumps({"detail": redact(str(error))})
            yield f"event: unreadable\ndata: {data}\n\n"

    async def body() -> AsyncIterator[str]:
        async for chunk in iterate_in_threadpool(lines()):
            yield chunk
            if await request.is_disconnected():
                break

    headers = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
    return StreamingResponse(body(), media_type="text/event-stream", headers=headers)


def _after(request: Request) -> int:
    text = request.headers.get("last-event-id") or request.query_params.get("after", "-1")
    try:
        after = int(text)
    except ValueError:
        raise InvalidArgument(f"after: a step number, got {text!r}") from None
    return after


def _encode(runtime: Runtime, event: TurnEvent, row: object) -> str:
    if event.parent_turn_id is not None:
        return ""  # a child turn's step: the child's own page shows it
    if event.step is not None:
        turn = runtime.journal.find_turn(event.turn_id, marked=True)  # its status, counts
        if turn is None:
            return ""
        html = row.render(r=step_row(event.step, turn))  # type: ignore[attr-defined]
        data = {
            "step": event.step.step,
            "html": html,
            "status": str(turn.status),
            "attempts": turn.attempts,
            "crashes": turn.crashes,
        }
        return f"id: {event.step.step}\nevent: step\ndata: {json.dumps(data)}\n\n"
    assert event.turn is not None
    data = {"status": str(event.turn.status)}
    return f"event: end\ndata: {json.dumps(data)}\n\n"
