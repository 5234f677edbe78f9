"""The console's actions (POST): approve, deny, resolve, cancel, log in and out.

Each is the operator API's call (:mod:`durable_agent.app.operator`) with ``by`` the signed-in user,
after the cross-site checks; then back to the page it came from, with one line saying what
happened. A refused or mistaken action changes nothing and says why.
"""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import urlencode

from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from ..app import operator as ops
from ..errors import InvalidArgument
from ..inputs import check_id
from ..journal import acting_through
from ..operate.uncertain import VERDICTS
from ..runtime import Runtime
from .app_errors import render_error
from .auth import SESSION_COOKIE, SESSION_SECONDS, Authenticator, Identity
from .pages import login_form

MAX_NOTE = 2000


async def _checked(request: Request) -> tuple[Identity, FormData] | Response:
    """The user and the form, or the page that says why the POST is refused."""
    auth: Authenticator = request.app.state.auth
    identity: Identity | None = request.state.identity
    form = await request.form()
    problem = auth.csrf_problem(request, identity, str(form.get("csrf", "")))
    if problem is not None or identity is None:
        return render_error(request, 403, problem or "sign in first")
    return identity, form


def _back(request: Request, form: FormData, notice: str) -> Response:
    target = str(form.get("next", "")) or "/"
    if not target.startswith("/") or target.startswith("//"):
        target = "/"
    path, _, query = target.partition("?")
    params = [p for p in query.split("&") if p and not p.startswith("notice=")]
    params.append(urlencode({"notice": notice}))
    return RedirectResponse(f"{path}?{'&'.join(params)}", status_code=303)


def _note(form: FormData, key: str = "note") -> str | None:
    text = str(form.get(key, "")).strip()
    if len(text) > MAX_NOTE:
        raise InvalidArgument(f"{key}: at most {MAX_NOTE} characters")
    return text or None


async def _act(request: Request, action: Callable[[Runtime, Identity, FormData], str]) -> Response:
    checked = await _checked(request)
    if isinstance(checked, Response):
        return checked
    identity, form = checked
    runtime: Runtime = request.app.state.runtime
    notice = await run_in_threadpool(_through_console, action, runtime, identity, form)
    return _back(request, form, notice)


def _through_console(
    action: Callable[[Runtime, Identity, FormData], str],
    runtime: Runtime,
    identity: Identity,
    form: FormData,
) -> str:
    with acting_through("console"):  # the audit trail records the interface
        return action(runtime, identity, form)


def _target(request: Request) -> tuple[str, int]:
    return check_id("turn_id", request.path_params["turn_id"]), int(request.path_params["step"])


async def approve(request: Request) -> Response:
    turn_id, step = _target(request)

    def act(runtime: Runtime, who: Identity, form: FormData) -> str:
        ops.approve(turn_id, step, note=_note(form), by=who.user, settings=runtime.settings)
        return f"approved step {step} of {turn_id}; a worker resumes the turn"

    return await _act(request, act)


async def deny(request: Request) -> Response:
    turn_id, step = _target(request)

    def act(runtime: Runtime, who: Identity, form: FormData) -> str:
        reason = _note(form, "reason")
        if reason is None:
            raise InvalidArgument("a denial needs a reason: the model reads it as the result")
        ops.deny(turn_id, step, reason, by=who.user, settings=runtime.settings)
        return f"denied step {step} of {turn_id}"

    return await _act(request, act)


async def resolve(request: Request) -> Response:
    turn_id, step = _target(request)

    def act(runtime: Runtime, who: Identity, form: FormData) -> str:
        verdict = str(form.get("verdict", ""))
        if verdict not in VERDICTS:
            raise InvalidArgument(f"verdict must be one of {', '.join(VERDICTS)}")
        ops.resolve_uncertain(
            turn_id,
            step,
            verdict,
            note=_note(form),
            by=who.user,
            settings=runtime.settings,
        )
        return f"step {step} of {turn_id} resolved: {verdict}"

    return await _act(request, act)


async def cancel(request: Request) -> Response:
    turn_id = check_id("turn_id", request.path_params["turn_id"])

    def act(runtime: Runtime, who: Identity, form: FormData) -> str:
        result = ops.cancel_turn(
            turn_id, _note(form, "reason"), by=who.user, settings=runtime.settings
        )
        return result.describe()

    return await _act(request, act)


async def login(request: Request) -> Response:
    auth: Authenticator = request.app.state.auth
    form = await request.form()
    problem = auth.csrf_problem(request, None, "")
    if problem is not None:
        return render_error(request, 403, problem)
    user, password = str(form.get("user", "")), str(form.get("password", ""))
    if not auth.has_logins or not auth.check_password(user, password):
        return login_form(request, 401, "wrong user name or password")
    response = RedirectResponse(_safe_next(str(form.get("next", ""))), status_code=303)
    response.set_cookie(
        SESSION_COOKIE,
        auth.new_session(user),
        max_age=SESSION_SECONDS,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
    return response


async def logout(request: Request) -> Response:
    checked = await _checked(request)
    if isinstance(checked, Response):
        return checked
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(SESSION_COOKIE)
    return response


def _safe_next(target: str) -> str:
    return target if target.startswith("/") and not target.startswith("//") else "/"
