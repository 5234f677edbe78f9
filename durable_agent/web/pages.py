"""The console's pages (GET): each reads what the matching CLI command reads."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.templating import Jinja2Templates

from ..app import operator as ops
from ..errors import (
    DurableAgentError,
    InvalidArgument,
    KeyUnavailable,
    PayloadTampered,
    TurnNotFound,
)
from ..inputs import check_id
from ..journal import Step, Turn, TurnFilter, TurnStatus, WaitStore
from ..runtime import Runtime
from . import charts
from .auth import Authenticator, Identity
from .spend_view import SpendCache
from .timeline import as_json, shorten, step_row

PAGE_SIZE = 50
SPEND_DAYS = 14  # the spend page's default window
WORKER_WINDOW = 3600.0  # workers that received a message within the last hour


def render(request: Request, template: str, status_code: int = 200, **context: Any) -> Response:
    """The page with what every page shows: the user, the form token, the navigation."""
    templates: Jinja2Templates = request.app.state.templates
    identity: Identity | None = request.state.identity
    auth: Authenticator = request.app.state.auth
    context.update(
        identity=identity,
        csrf=auth.csrf_token(identity) if identity is not None else "",
        path=request.url.path,
        shorten=shorten,
        as_json=as_json,
    )
    return templates.TemplateResponse(request, template, context, status_code=status_code)


def runtime_of(request: Request) -> Runtime:
    runtime: Runtime = request.app.state.runtime
    return runtime


def login_form(request: Request, status_code: int = 200, problem: str = "") -> Response:
    return render(request, "login.html", status_code=status_code, problem=problem)


def login_page(request: Request) -> Response:
    return login_form(request)


# -- turns ----------------------------------------------------------------------------------


def turns_page(request: Request) -> Response:
    runtime = runtime_of(request)
    query = request.query_params
    turn_filter = TurnFilter(
        status=_status(query.get("status", "")),
        agent=_name(query, "agent"),
        session_id=_name(query, "session"),
        queue=_name(query, "queue"),
        since=_time(query.get("since", ""), "since"),
        until=_time(query.get("until", ""), "until"),
    )
    before = _cursor(query.get("before", ""))
    turns = runtime.find_turns(turn_filter, before=before, limit=PAGE_SIZE + 1)
    more = len(turns) > PAGE_SIZE
    turns = turns[:PAGE_SIZE]
    filters = {
        k: query.get(k, "") for k in ("status", "agent", "session", "queue", "since", "until")
    }
    older = None
    if more:
        last = turns[-1]
        older = {**filters, "before": f"{last.created_at.isoformat()}|{last.turn_id}"}
    return render(
        request,
        "turns.html",
        turns=turns,
        filters=filters,
        statuses=[s.value for s in TurnStatus],
        older=older,
        first_page=bool(before),
    )


def _status(text: str) -> TurnStatus | None:
    if not text:
        return None
    try:
        return TurnStatus(text)
    except ValueError:
        raise InvalidArgument(f"no turn status {text!r}") from None


def _name(query: Any, key: str) -> str | None:
    text = query.get(key, "").strip()
    return check_id(key, text) if text else None


def _time(text: str, what: str) -> datetime | None:
    """An ISO time (a browser's datetime-local has no zone: UTC is meant)."""
    text = text.strip()
    if not text:
        return None
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise InvalidArgument(f"{what}: not a time (YYYY-MM-DDTHH:MM, UTC): {text!r}") from None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def _cursor(text: str) -> tuple[datetime, str] | None:
    if not text:
        return None
    at, bar, turn_id = text.partition("|")
    when = _time(at, "before") if bar else None
    if when is None:
        raise InvalidArgument("before: not a page cursor")
    return when, check_id("turn_id", turn_id)


# -- a turn ---------------------------------------------------------------------------------


def turn_page(request: Request) -> Response:
    runtime = runtime_of(request)
    turn_id = check_id("turn_id", request.path_params["turn_id"])
    # marked reads: a payload that does not open shows as such; the rest of the page stays
    found = runtime.journal.find_turn(turn_id, marked=True)
    if found is None:
        raise TurnNotFound(turn_id)
    turn = runtime.with_spend([found])[0]
    steps = runtime.journal.load_journal(turn.turn_id, marked=True)
    unopened: list[str] = []  # a part of the page whose payloads do not open here
    approvals: list[Any] = []
    effects: list[Any] = []
    try:
        approvals = ops.list_approvals(
            turn_id=turn.turn_id, include_decided=True, settings=runtime.settings
        )
    except (KeyUnavailable, PayloadTampered) as error:
        unopened.append(f"approvals: {error}")
    try:
        effects = ops.list_uncertain(
            turn_id=turn.turn_id, include_resolved=True, settings=runtime.settings
        )
    except (KeyUnavailable, PayloadTampered) as error:
        unopened.append(f"uncertain effects: {error}")
    return render(
        request,
        "turn.html",
        turn=turn,
        rows=[step_row(s, turn) for s in steps],
        last_step=last_done(steps),
        approvals=approvals,
        effects=effects,
        waits_for=waits_for(runtime, turn, approvals),
        heartbeat=_heartbeat(runtime, turn),
        unopened=unopened,
    )


def last_done(steps: list[Step]) -> int:
    """The last step of the unbroken run of done steps from step 0 (-1: none): the live
    stream goes on after it, so a step still at its intent (running, or cut short by a
    crash) comes when its outcome is written."""
    last = -1
    for step in steps:
        if step.status != "done" or step.step != last + 1:
            break
        last = step.step
    return last


def waits_for(runtime: Runtime, turn: Turn, approvals: list[Any]) -> str:
    """What an open turn that is not running waits for, in words ("" for none)."""
    if turn.status == TurnStatus.WAITING:
        wait = WaitStore(runtime.database).waits([turn.turn_id]).get(turn.turn_id)
        if wait is not None and wait.kind != "approval":  # a time, an event, a child turn
            return wait.describe()
        pending = [a for a in approvals if a.decision is None]
        calls = ", ".join(f"{a.tool} (step {a.step})" for a in pending) or "a decision"
        return f"an approval of {calls}"
    if turn.status != TurnStatus.QUEUED:
        return ""
    if turn.not_before is not None:
        return f"its deferral to end at {turn.not_before:%Y-%m-%d %H:%M:%S} UTC"
    before = [
        t
        for t in runtime.list_turns(turn.session_id, limit=max(1, min(turn.seq, 10_000)))
        if t.seq < turn.seq and not t.finished
    ]
    if before:
        return f"the earlier turn {before[0].turn_id} of its session ({before[0].status})"
    return "a worker of queue " + (turn.queue or "(the default)")


def _heartbeat(runtime: Runtime, turn: Turn) -> datetime | None:
    """When the holder last renewed its lease (each renewal sets it lease_seconds ahead)."""
    if turn.lease_expires_at is None or turn.lease_owner is None:
        return None
    return turn.lease_expires_at - timedelta(seconds=runtime.settings.lease_seconds)


# -- the inboxes ----------------------------------------------------------------------------


def approvals_page(request: Request) -> Response:
    runtime = runtime_of(request)
    decided = request.query_params.get("decided") == "1"
    approvals = ops.list_approvals(include_decided=decided, settings=runtime.settings)
    if decided:
        approvals = sorted(approvals, key=lambda a: a.requested_at, reverse=True)[:200]
    return render(request, "approvals.html", approvals=approvals, decided=decided)


def uncertain_page(request: Request) -> Response:
    runtime = runtime_of(request)
    resolved = request.query_params.get("resolved") == "1"
    effects = ops.list_uncertain(include_resolved=resolved, settings=runtime.settings)
    return render(request, "uncertain.html", effects=effects, resolved=resolved)


# -- spend, agents, workers -----------------------------------------------------------------


def spend_page(request: Request) -> Response:
    text = request.query_params.get("days", str(SPEND_DAYS))
    if not text.isdigit() or not 1 <= int(text) <= 366:
        raise InvalidArgument(f"days: a whole number from 1 to 366, got {text!r}")
    days = int(text)
    cache: SpendCache = request.app.state.spend
    figures = cache.figures(days)
    day_bars, agents = charts.day_agent_bars(figures.by_day, figures.by_day_agent)
    return render(
        request,
        "spend.html",
        days=days,
        figures=figures,
        day_chart=charts.column_chart(day_bars, "billed tokens per day (UTC), by agent", agents),
        day_legend=charts.legend(agents),
        agent_chart=charts.row_chart(charts.spend_bars(figures.by_agent), "tokens per agent"),
        legend=charts.legend(),
        priced=bool(request.app.state.runtime.settings.prices),
    )


def agents_page(request: Request) -> Response:
    runtime = runtime_of(request)
    configured: list[Any] = []
    problem = ""
    try:
        configured = list(runtime.agents)
    except (DurableAgentError, ImportError) as error:
        problem = f"the agents of this environment could not be loaded: {error}"
    return render(
        request, "agents.html", configured=configured, seen=runtime.agents_seen(), problem=problem
    )


def workers_page(request: Request) -> Response:
    runtime = runtime_of(request)
    return render(
        request,
        "workers.html",
        workers=runtime.workers(WORKER_WINDOW),
        lease_seconds=runtime.settings.lease_seconds,
        lease=timedelta(seconds=runtime.settings.lease_seconds),
        window_minutes=int(WORKER_WINDOW // 60),
    )
