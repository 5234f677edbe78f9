"""The console's application: routes, authentication on every request, security headers.

The pages and actions run as plain functions in Starlette's thread pool: they call the
same blocking API as the command line (``ops``, the runtime's turns and spend).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from importlib import resources
from urllib.parse import urlencode

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from ..errors import DurableAgentError, InvalidArgument, TurnNotFound
from ..journal.db import describe_url
from ..redact import redact
from ..runtime import Runtime
from . import actions, events, pages
from .app_errors import render_error
from .auth import Authenticator
from .spend_view import SpendCache

PUBLIC = ("/static/", "/login")

HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


def package_dir(name: str) -> str:
    return str(resources.files(__package__).joinpath(name))


def create_app(runtime: Runtime, auth: Authenticator) -> Starlette:
    """The console for ``runtime``'s database, behind ``auth``."""
    templates = Jinja2Templates(directory=package_dir("templates"))
    templates.env.globals["database"] = describe_url(runtime.settings.database_url)
    templates.env.filters["redact"] = redact

    routes = [
        Route("/", pages.turns_page),
        Route("/turns/{turn_id}", pages.turn_page),
        Route("/turns/{turn_id}/events", events.turn_events),
        Route("/turns/{turn_id}/cancel", actions.cancel, methods=["POST"]),
        Route("/approvals", pages.approvals_page),
        Route("/approvals/{turn_id}/{step:int}/approve", actions.approve, methods=["POST"]),
        Route("/approvals/{turn_id}/{step:int}/deny", actions.deny, methods=["POST"]),
        Route("/uncertain", pages.uncertain_page),
        Route("/uncertain/{turn_id}/{step:int}/resolve", actions.resolve, methods=["POST"]),
        Route("/spend", pages.spend_page),
        Route("/agents", pages.agents_page),
        Route("/workers", pages.workers_page),
        Route("/login", pages.login_page, methods=["GET"]),
        Route("/login", actions.login, methods=["POST"]),
        Route("/logout", actions.logout, methods=["POST"]),
        Mount("/static", StaticFiles(directory=package_dir("static")), name="static"),
    ]
    app = Starlette(
        routes=routes,
        middleware=[Middleware(_Guard)],
        exception_handlers={
            TurnNotFound: _not_found,
            InvalidArgument: _bad_request,
            DurableAgentError: _failed,
        },
    )
    app.state.runtime = runtime
    app.state.auth = auth
    app.state.templates = templates
    app.state.spend = SpendCache(runtime)
    return app


class _Guard(BaseHTTPMiddleware):
    """Authentication on every page but the login form and the assets; the headers."""

    async def dispatch(
        self, request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        auth: Authenticator = request.app.state.auth
        identity = auth.identify(request)
        request.state.identity = identity
        response: Response
        if identity is None and not request.url.path.startswith(PUBLIC):
            if request.method == "GET" and "text/html" in request.headers.get("accept", ""):
                # a browser: the login form (a basic-auth dialog would hide the page)
                target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
                response = RedirectResponse(f"/login?{urlencode({'next': target})}", 303)
            else:  # curl, scripts: ask for basic auth
                response = PlainTextResponse("sign in: basic auth or a bearer token\n", 401)
                response.headers["WWW-Authenticate"] = 'Basic realm="durable-agent console"'
        else:
            response = await call_next(request)
        for name, value in HEADERS.items():
            response.headers.setdefault(name, value)
        return response


async def _not_found(request: Request, error: Exception) -> Response:
    return render_error(request, 404, str(error))


async def _bad_request(request: Request, error: Exception) -> Response:
    return render_error(request, 400, str(error))


async def _failed(request: Request, error: Exception) -> Response:
    return render_error(request, 503, str(error))
