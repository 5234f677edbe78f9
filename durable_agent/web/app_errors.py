"""The error page: one line saying what is wrong, with the status it comes with."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from .pages import render


def render_error(request: Request, status: int, message: str) -> Response:
    return render(request, "error.html", status_code=status, message=message, status=status)
