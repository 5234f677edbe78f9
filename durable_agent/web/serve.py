"""``durable-agent console``: check how it may start, then serve it with uvicorn.

It refuses to start without a way to sign in (``DURABLE_AGENT_CONSOLE_AUTH`` or
``DURABLE_AGENT_CONSOLE_TOKEN``) unless told ``--insecure-no-auth``, and that only on a
loopback address. Postgres must be reachable and migrated, as for every command.
"""

from __future__ import annotations

import argparse
import ipaddress
import sys
from collections.abc import Callable

from ..errors import ConfigurationError
from ..runtime import Runtime


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_start(runtime: Runtime, host: str, insecure_no_auth: bool) -> None:
    """ConfigurationError (one line) when the console may not start this way."""
    settings = runtime.settings
    has_auth = bool(settings.console_logins or settings.console_token)
    if insecure_no_auth and not is_loopback(host):
        raise ConfigurationError(
            f"--insecure-no-auth serves only a loopback address (127.0.0.1, ::1), not {host!r}"
        )
    if not has_auth and not insecure_no_auth:
        raise ConfigurationError(
            "the console needs a login: set DURABLE_AGENT_CONSOLE_AUTH=user:password (or "
            "DURABLE_AGENT_CONSOLE_TOKEN), or pass --insecure-no-auth on a loopback address"
        )


def cmd_console(runtime: Runtime, args: argparse.Namespace) -> int:
    check_start(runtime, args.host, args.insecure_no_auth)
    try:
        import uvicorn

        from .app import create_app
        from .auth import Authenticator
    except ImportError as error:
        raise ConfigurationError(
            f"the console needs the 'console' extra: pip install 'durable-agent[console]' ({error})"
        ) from error
    runtime.require_schema()
    settings = runtime.settings
    auth = Authenticator(
        settings.console_logins,
        settings.console_token,
        allow_anonymous=args.insecure_no_auth and not settings.console_logins,
    )
    app = create_app(runtime, auth)
    where = f"[{args.host}]" if ":" in args.host else args.host
    print(f"durable-agent console on http://{where}:{args.port}/", file=sys.stderr, flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, access_log=False)
    return 0


def add_arguments(parser: argparse.ArgumentParser, port: Callable[[str], int]) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=port, default=8100, help="port (default 8100)")
    parser.add_argument(
        "--insecure-no-auth",
        action="store_true",
        help="serve without a login (a loopback address only)",
    )
    parser.add_argument(
        "--log-level",
        default="warning",
        choices=("critical", "error", "warning", "info", "debug"),
        help="uvicorn's log level (default warning)",
    )
