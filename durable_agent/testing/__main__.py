"""Run a test server as its own process.

    python -m durable_agent.testing model-server --policy email [--host H] [--port P]
    python -m durable_agent.testing model-server --policy myapp.policies:my_policy
    python -m durable_agent.testing inbox [--host H] [--smtp-port P --api-port Q]
    python -m durable_agent.testing payments [--host H] [--port P] [--order A-1001=4200 ...]

A policy is a built-in name (``email``, ``refund``, ``careless-refund``) or ``module:name``
of your own function ``policy(body: dict) -> dict``: it gets the Chat Completions request
body and returns the assistant message (``{"role": "assistant", "content": ...}``, with
``tool_calls`` to call tools; ``reply()``, ``call_tool()`` build them). Keep it a pure
function of the request: a replayed request must get the same answer.

``--host`` is the address to listen on: 127.0.0.1 by default; 0.0.0.0 lets other machines
or containers reach the server (``compose.yaml``'s demo profile does that).

The process prints one line of JSON with the server's addresses, then serves until SIGTERM
or SIGINT and exits 0. `ServerProcess` starts such a process from a test.
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from pathlib import Path
from types import FrameType, TracebackType
from typing import IO, Any, Self

from durable_agent.testing.http import LOOPBACK
from durable_agent.testing.inbox import SmtpInbox
from durable_agent.testing.model_server import Policy, ScriptedModelServer, policy_problem
from durable_agent.testing.payments import DEFAULT_ORDERS, PaymentsSandbox
from durable_agent.testing.policies import POLICIES
from durable_agent.usage import OneLineParser, port, seconds

__all__ = ["ServerProcess", "build_parser", "main"]


def _order(text: str) -> tuple[str, int]:
    order_id, sep, cents = text.partition("=")
    if not sep or not order_id or not cents.isdigit():
        raise argparse.ArgumentTypeError(f"expected ORDER_ID=CENTS, got {text!r}")
    return order_id, int(cents)


def _policy(text: str) -> tuple[str, Policy]:
    """An argparse type: a built-in policy name or ``module:function``."""
    if text in POLICIES:
        return text, POLICIES[text]
    from durable_agent.errors import ConfigurationError
    from durable_agent.testing.scenario import load_object

    if ":" not in text:
        raise argparse.ArgumentTypeError(
            f"unknown policy {text!r}: {', '.join(sorted(POLICIES))}, or module:function"
        )
    try:
        found = load_object(text, "policy")
    except ConfigurationError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    problem = policy_problem(found)
    if problem is not None:
        raise argparse.ArgumentTypeError(f"policy {text!r} is not a policy: {problem}")
    return text, found


def _tokens(text: str) -> int:
    """An argument type: a whole number of tokens, at least 1."""
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"not a whole number of tokens >= 1: {text!r}")
    return int(text)


def build_parser() -> argparse.ArgumentParser:
    """The command-line parser."""
    parser = OneLineParser(
        prog="python -m durable_agent.testing", description="Run a loopback test server."
    )
    kinds = parser.add_subparsers(dest="kind", required=True)

    model = kinds.add_parser("model-server", help="scripted OpenAI-compatible model server")
    model.add_argument(
        "--policy",
        type=_policy,
        required=True,
        help=f"{', '.join(sorted(POLICIES))}, or module:function of your own",
    )
    model.add_argument("--host", default=LOOPBACK, help="address to listen on (127.0.0.1)")
    model.add_argument("--port", type=port, default=0)
    model.add_argument("--model", default="scripted-model", help="model name to report")
    model.add_argument(
        "--chunk-seconds",
        type=seconds(0.0, 60.0),
        default=0.0,
        help="seconds between two events of a streamed answer (default 0)",
    )
    model.add_argument(
        "--reasoning", action="store_true", help="put a reasoning item first in each Response"
    )
    model.add_argument(
        "--tpm",
        type=_tokens,
        default=None,
        help="answer 429 past this many tokens in a sliding minute, as a provider does",
    )

    inbox = kinds.add_parser("inbox", help="SMTP inbox with a JSON API")
    inbox.add_argument("--host", default=LOOPBACK, help="address to listen on (127.0.0.1)")
    inbox.add_argument("--smtp-port", type=port, default=0)
    inbox.add_argument("--api-port", type=port, default=0)

    payments = kinds.add_parser("payments", help="payments sandbox")
    payments.add_argument("--host", default=LOOPBACK, help="address to listen on (127.0.0.1)")
    payments.add_argument("--port", type=port, default=0)
    payments.add_argument(
        "--order",
        type=_order,
        action="append",
        metavar="ORDER_ID=CENTS",
        help="seed an order (repeatable; default: the built-in orders)",
    )
    return parser


def _start(args: argparse.Namespace, stack: ExitStack) -> dict[str, Any]:
    """Start the requested server inside `stack` and return its addresses."""
    if args.kind == "model-server":
        name, policy = args.policy
        model = stack.enter_context(
            ScriptedModelServer(policy, model=args.model, host=args.host, port=args.port)
        )
        model.chunk_seconds, model.reasoning = args.chunk_seconds, args.reasoning
        model.tpm_limit = args.tpm
        return {"base_url": model.base_url, "port": model.port, "policy": name}
    if args.kind == "inbox":
        inbox = stack.enter_context(
            SmtpInbox(host=args.host, smtp_port=args.smtp_port, api_port=args.api_port)
        )
        return {
            "smtp_url": inbox.smtp_url,
            "smtp_host": inbox.smtp_host,
            "smtp_port": inbox.smtp_port,
            "api_url": inbox.api_url,
        }
    orders = dict(args.order) if args.order else dict(DEFAULT_ORDERS)
    payments = stack.enter_context(PaymentsSandbox(orders, host=args.host, port=args.port))
    return {"url": payments.url, "port": payments.port}


def main(argv: list[str] | None = None) -> int:
    """Start a server, print its addresses as one JSON line, serve until SIGTERM/SIGINT."""
    args = build_parser().parse_args(argv)
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        with ExitStack() as stack:
            try:
                info = _start(args, stack)
            except OSError as error:  # the port is taken, the address is not this machine's
                ports = [getattr(args, a, 0) for a in ("port", "smtp_port", "api_port")]
                where = "/".join(str(p) for p in ports if p) or "a free port"
                print(
                    f"error: the {args.kind} cannot listen on {args.host} port {where}: "
                    f"{error.strerror or error}",
                    file=sys.stderr,
                    flush=True,
                )
                return 1
            print(json.dumps(info), flush=True)
            stop.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0


class ServerProcess:
    """A ``python -m durable_agent.testing ...`` child process, for tests.

    `start()` waits (with a deadline) for the JSON line and exposes it as `info`; `stop()`
    sends SIGTERM, waits, kills on timeout and returns the exit code.

        with ServerProcess("payments") as proc:
            url = proc.info["url"]
    """

    def __init__(self, *args: str, startup_timeout: float = 15.0) -> None:
        self.args = list(args)
        self.startup_timeout = startup_timeout
        self.info: dict[str, Any] = {}
        self.returncode: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._stderr: IO[bytes] | None = None

    @property
    def pid(self) -> int:
        """The child's process id."""
        if self._proc is None:
            raise RuntimeError("ServerProcess has not been started")
        return self._proc.pid

    def start(self) -> Self:
        """Spawn the process and wait for its JSON line; raises `TimeoutError` if none comes."""
        root = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        # Kept open for the life of the child (stderr goes there), closed in _close().
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "durable_agent.testing", *self.args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            env=env,
            bufsize=0,
        )
        try:
            self.info = json.loads(self._read_line())
        except BaseException:
            self.kill()
            raise
        return self

    def _read_line(self) -> str:
        assert self._proc is not None and self._proc.stdout is not None
        deadline = time.monotonic() + self.startup_timeout
        buffer = b""
        with selectors.DefaultSelector() as selector:
            selector.register(self._proc.stdout, selectors.EVENT_READ)
            while b"\n" not in buffer:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"no JSON line within {self.startup_timeout}s{self._tail()}")
                if not selector.select(remaining):
                    continue
                chunk = self._proc.stdout.read(4096)
                if not chunk:
                    raise RuntimeError(f"server exited before printing its address{self._tail()}")
                buffer += chunk
        return buffer.split(b"\n", 1)[0].decode("utf-8")

    def _tail(self) -> str:
        if self._stderr is None:
            return ""
        self._stderr.seek(0)
        text = self._stderr.read().decode("utf-8", "replace").strip()
        return f"; stderr:\n{text[-2000:]}" if text else ""

    def stop(self, timeout: float = 10.0) -> int:
        """Send SIGTERM and wait up to `timeout`; kill if it does not exit. Returns the code."""
        proc = self._proc
        if proc is None:
            return self.returncode if self.returncode is not None else 0
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        return self._close()

    def kill(self) -> None:
        """Kill the process by its pid (no graceful shutdown) and reap it."""
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        self._close()

    def _close(self) -> int:
        proc, self._proc = self._proc, None
        assert proc is not None
        if proc.stdout is not None:
            proc.stdout.close()
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None
        self.returncode = proc.returncode
        return proc.returncode

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is not None:
            self.kill()
        else:
            self.stop()


if __name__ == "__main__":
    sys.exit(main())
