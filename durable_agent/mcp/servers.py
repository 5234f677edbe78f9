"""Where an MCP server is: a command to start (stdio) or a URL to reach (streamable HTTP).

``ServerSpec`` holds what ``tools_from_server`` was told, checked once: exactly one of
``command`` and ``url``; a command as a list or a shell-split string, with extra
environment variables (merged over the MCP SDK's small default environment, so a worker's
secrets do not reach the server unless named) and a working folder; a URL with extra HTTP
headers. A mistake is one ``ConfigurationError`` line naming the server.
"""

from __future__ import annotations

import re
import shlex
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigurationError

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


@dataclass(frozen=True)
class ServerSpec:
    """One MCP server, as ``tools_from_server`` was given it."""

    name: str
    command: tuple[str, ...] = ()
    url: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    connect_timeout: float = 30.0
    call_timeout: float | None = 300.0

    @property
    def where(self) -> str:
        """The server in an error message: its name and command or URL."""
        if self.url is not None:
            return f"MCP server {self.name!r} at {self.url}"
        return f"MCP server {self.name!r} (command: {shlex.join(self.command)})"

    @property
    def key(self) -> tuple[Any, ...]:
        """What makes two specs the same server (one session per process for each)."""
        return (
            self.name,
            self.command,
            self.url,
            tuple(sorted(self.env.items())),
            self.cwd,
            tuple(sorted(self.headers.items())),
        )


def server_spec(
    name: str,
    *,
    command: str | Sequence[str] | None,
    url: str | None,
    env: Mapping[str, str] | None,
    cwd: str | None,
    headers: Mapping[str, str] | None,
    connect_timeout: float,
    call_timeout: float | None,
) -> ServerSpec:
    """The checked spec; raises ConfigurationError (one line) on a mistake."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise ConfigurationError(
            f"MCP server name {name!r} must be 1-64 letters, digits, '_', '.' or '-'"
        )
    where = f"MCP server {name!r}"
    if (command is None) == (url is None):
        raise ConfigurationError(
            f"{where}: give exactly one of command=[...] (a server started over stdio) "
            "and url='http://...' (streamable HTTP)"
        )
    argv: tuple[str, ...] = ()
    if command is not None:
        if isinstance(command, str):
            try:
                argv = tuple(shlex.split(command))
            except ValueError as error:
                raise ConfigurationError(f"{where}: command {command!r}: {error}") from None
        elif isinstance(command, Sequence) and all(isinstance(a, str) for a in command):
            argv = tuple(command)
        else:
            raise ConfigurationError(f"{where}: command must be a list of strings or a string")
        if not argv or not argv[0]:
            raise ConfigurationError(f"{where}: command is empty")
        if headers:
            raise ConfigurationError(f"{where}: headers= is for url=, not command=")
    if url is not None:
        parts = urllib.parse.urlsplit(url) if isinstance(url, str) else None
        if parts is None or parts.scheme not in ("http", "https") or not parts.netloc:
            raise ConfigurationError(f"{where}: url {url!r} is not an http(s) URL")
        if env or cwd:
            raise ConfigurationError(f"{where}: env= and cwd= are for command=, not url=")
    _check_strings(env, f"{where}: env")
    _check_strings(headers, f"{where}: headers")
    if cwd is not None and not isinstance(cwd, str):
        raise ConfigurationError(f"{where}: cwd must be a folder's path")
    if not _positive(connect_timeout):
        raise ConfigurationError(f"{where}: connect_timeout must be a positive number of seconds")
    if call_timeout is not None and not _positive(call_timeout):
        raise ConfigurationError(f"{where}: call_timeout must be a positive number or None")
    return ServerSpec(
        name=name,
        command=argv,
        url=url,
        env=dict(env or {}),
        cwd=cwd,
        headers=dict(headers or {}),
        connect_timeout=float(connect_timeout),
        call_timeout=None if call_timeout is None else float(call_timeout),
    )


def _check_strings(values: Mapping[str, str] | None, where: str) -> None:
    if values is None:
        return
    if not isinstance(values, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in values.items()
    ):
        raise ConfigurationError(f"{where} must map names to strings")


def _positive(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0
