"""A small JSON-over-HTTP helper for the example tools (stdlib only)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any


class HttpError(RuntimeError):
    """The service answered with an error status."""

    def __init__(self, status: int, body: Any) -> None:
        super().__init__(f"HTTP {status}: {body}")
        self.status = status
        self.body = body


def request_json(method: str, url: str, payload: Any = None, timeout: float = 10.0) -> Any:
    data = None if payload is None else json.dumps(payload).encode()
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("Accept", "application/json")
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as response:
            return json.loads(response.read() or b"null")
    except urllib.error.HTTPError as error:
        body = error.read()
        error.close()
        try:
            parsed = json.loads(body)
        except ValueError:
            parsed = body.decode(errors="replace")
        raise HttpError(error.code, parsed) from None
