"""One MCP session per server per process, on an event loop of the process's own.

The MCP SDK is async and our tool calls are sync (a worker runs them in its pool's
threads or prefork children). A session lives on one event loop, so each process runs one
loop in a daemon thread and every session of that process lives there; a tool call hands
its coroutine to that loop and waits for the answer. One session per server is opened on
the first call and kept; calls from several threads share it (the protocol numbers its
requests).

- **Fork.** A prefork child must not use its parent's loop thread (it does not exist in the
  child) nor its parent's session or subprocess: after a fork the child forgets them all
  (``os.register_at_fork``) and opens its own on its first call.
- **A broken session.** A call that fails because the connection broke (the server died,
  the HTTP server went away) drops the session; the next call opens a new one. A ``safe``
  tool's call is sent again once on the new session; a ``never`` tool's is not (it may have
  reached the server), and the runner records it as uncertain. Before each call a
  session that saw its connection close since the last call (the server died in between) is
  replaced first, so a ``never`` call is not reported uncertain without having been sent.
- **A crash.** Nothing of the session survives the worker: the redelivered turn's worker
  opens its own, and the journal says what happened.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import os
import threading
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from ..errors import ConfigurationError
from .servers import ServerSpec

if TYPE_CHECKING:
    from mcp import Client
    from mcp_types import CallToolResult
    from mcp_types import Tool as McpTool

log = logging.getLogger(__name__)
T = TypeVar("T")
_PAGES = 100  # a server whose tools/list never ends is refused, not followed forever


class McpCallError(Exception):
    """A call to an MCP server did not get an answer: the server could not be reached, the
    connection broke, or the call timed out. The runner records it as the tool's error (for
    a ``never`` tool: it may or may not have happened)."""


class _LoopThread:
    """An event loop running in a daemon thread of this process."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.pid = os.getpid()
        self.thread = threading.Thread(target=self._run, name="durable-agent-mcp", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()


class Session:
    """One server's session, opened on first use and again after it broke."""

    def __init__(self, spec: ServerSpec) -> None:
        self.spec = spec
        self._client: Client | None = None
        self._stop: asyncio.Event | None = None
        self._holder: asyncio.Task[None] | None = None
        self._lock: asyncio.Lock | None = None

    async def _connected(self) -> Client:
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._client is not None and self.closed:
                log.warning("%s: the session closed since the last call", self.spec.where)
                await self._drop()
            if self._client is None:
                self._client = await self._open()
            return self._client

    @property
    def closed(self) -> bool:
        """Whether the session is not open, or has already seen its connection close (the
        server went away since the last call)."""
        return self._client is None or _closed(self._client, self._holder)

    async def _open(self) -> Client:
        from mcp import Client

        ready: asyncio.Future[Client] = asyncio.get_running_loop().create_future()
        stop = asyncio.Event()
        spec = self.spec

        async def hold() -> None:
            try:
                async with contextlib.AsyncExitStack() as stack:
                    client = await stack.enter_async_context(
                        Client(await _transport(spec, stack), cache=None)
                    )
                    if not ready.done():
                        ready.set_result(client)
                    await stop.wait()
            except BaseException as error:  # the transport's task groups raise groups
                if not ready.done():
                    ready.set_exception(McpCallError(describe(error)))
                elif not isinstance(error, asyncio.CancelledError):
                    log.debug("%s: session closed with %s", spec.where, describe(error))
                if isinstance(error, asyncio.CancelledError | KeyboardInterrupt | SystemExit):
                    raise

        holder = asyncio.get_running_loop().create_task(hold())
        try:
            client = await asyncio.wait_for(asyncio.shield(ready), spec.connect_timeout)
        except TimeoutError:
            holder.cancel()
            raise McpCallError(f"no answer within {spec.connect_timeout:g} s") from None
        self._stop, self._holder = stop, holder
        return client

    async def _drop(self) -> None:
        stop, holder = self._stop, self._holder
        self._client, self._stop, self._holder = None, None, None
        if stop is not None:
            stop.set()
        if holder is not None:
            try:
                await asyncio.wait_for(asyncio.shield(holder), 5)
            except BaseException:  # closing a broken session: nothing more to learn
                holder.cancel()

    async def _forget(self, broken: Client) -> None:
        """Drop the session whose connection broke, unless another call already replaced it."""
        assert self._lock is not None
        async with self._lock:
            if self._client is broken:
                await self._drop()

    async def close(self) -> None:
        if self._lock is None:
            await self._drop()
            return
        async with self._lock:
            await self._drop()

    async def list_tools(self) -> list[McpTool]:
        """Every tool the server lists, page after page."""
        try:
            client = await self._connected()
        except McpCallError as error:
            raise ConfigurationError(f"{self.spec.where}: cannot connect: {error}") from None
        tools: list[McpTool] = []
        cursor: str | None = None
        try:
            for _ in range(_PAGES):
                page = await client.list_tools(cursor=cursor, cache_mode="refresh")
                tools.extend(page.tools)
                cursor = page.next_cursor
                if cursor is None:
                    return tools
        except Exception as error:
            raise ConfigurationError(
                f"{self.spec.where}: listing its tools failed: {describe(error)}"
            ) from None
        raise ConfigurationError(f"{self.spec.where}: its tool list has over {_PAGES} pages")

    async def call_tool(
        self, name: str, arguments: dict[str, Any], *, resend: bool
    ) -> CallToolResult:
        """The server's answer; raises McpCallError when there is none. ``resend``: send
        the call again once on a new session when the first one broke (safe tools)."""
        for attempt in (1, 2):
            try:
                client = await self._connected()
            except McpCallError as error:
                raise McpCallError(f"{self.spec.where}: cannot connect: {error}") from None
            try:
                return await asyncio.wait_for(
                    client.call_tool(name, arguments), self.spec.call_timeout
                )
            except TimeoutError:
                raise McpCallError(
                    f"{self.spec.where}: {name} gave no answer within {self.spec.call_timeout:g} s"
                ) from None
            except Exception as error:
                if not _connection_broke(error):
                    raise McpCallError(f"{self.spec.where}: {name}: {describe(error)}") from None
                await self._forget(client)
                if not resend or attempt == 2:
                    raise McpCallError(
                        f"{self.spec.where}: the connection broke during {name}: {describe(error)}"
                    ) from None
                log.warning("%s: the connection broke; sending %s again", self.spec.where, name)
        raise AssertionError("unreachable")


def _closed(client: Client, holder: asyncio.Task[None] | None) -> bool:
    """Whether a session has already seen its connection close (the server went away since
    the last call). Asked before each call, so that a call that must not be sent twice is
    sent once on a new session rather than reported uncertain without having left: the SDK
    refuses a send on a closed connection with the same error as a call cut short. An SDK
    that does not say counts as open."""
    if holder is None or holder.done():
        return True
    dispatcher = getattr(client.session, "_dispatcher", None)
    return getattr(dispatcher, "_closed", False) is True


def _connection_broke(error: BaseException) -> bool:
    """Whether a failed call means the session is gone (not the server's refusal)."""
    from mcp import MCPError
    from mcp_types import CONNECTION_CLOSED

    if isinstance(error, MCPError):
        return error.code == CONNECTION_CLOSED
    return True


async def _transport(spec: ServerSpec, stack: contextlib.AsyncExitStack) -> Any:
    """What ``mcp.Client`` connects through for this spec."""
    if spec.url is not None:
        from mcp.client.streamable_http import streamable_http_client
        from mcp.shared._httpx_utils import create_mcp_http_client

        http = await stack.enter_async_context(
            create_mcp_http_client(headers=dict(spec.headers) or None)
        )
        return streamable_http_client(spec.url, http_client=http)
    from mcp import StdioServerParameters
    from mcp.client.stdio import stdio_client

    return stdio_client(
        StdioServerParameters(
            command=spec.command[0],
            args=list(spec.command[1:]),
            env=dict(spec.env) or None,
            cwd=spec.cwd,
        )
    )


def describe(error: BaseException) -> str:
    """One line for an error, the first real one inside an exception group."""
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    text = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


# -- this process's loop and sessions ---------------------------------------------------------

_lock = threading.Lock()
_loop: _LoopThread | None = None
_sessions: dict[tuple[Any, ...], Session] = {}


def _running_loop() -> _LoopThread:
    global _loop
    with _lock:
        if _loop is None or _loop.pid != os.getpid():
            _loop = _LoopThread()
        return _loop


def run(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine on this process's MCP loop and wait for it."""
    return _running_loop().run(coroutine)


def session_for(spec: ServerSpec) -> Session:
    """This process's session of the server (not opened until used)."""
    with _lock:
        session = _sessions.get(spec.key)
        if session is None:
            session = _sessions[spec.key] = Session(spec)
        return session


def list_server_tools(spec: ServerSpec) -> list[McpTool]:
    """The server's tools, listed on a session of its own that is closed afterwards (so a
    worker's main process holds no session or subprocess when it forks its pool)."""
    session = Session(spec)
    try:
        return run(session.list_tools())
    finally:
        run(session.close())


def close_sessions() -> None:
    """Close this process's sessions (at exit; tests)."""
    with _lock:
        sessions = list(_sessions.values())
        _sessions.clear()
        loop = _loop
    if loop is None or loop.pid != os.getpid():
        return
    for session in sessions:
        with contextlib.suppress(Exception):
            loop.run(asyncio.wait_for(session.close(), 5))


def _forget_after_fork() -> None:
    """In a forked child: the parent's loop thread and sessions are not this process's."""
    global _lock, _loop, _sessions
    _lock = threading.Lock()
    _loop = None
    _sessions = {}


os.register_at_fork(after_in_child=_forget_after_fork)
atexit.register(close_sessions)
